"""Structured output in the engine (issue 29, item 5): a request carrying a constraint samples
on the host with the grammar's mask applied, its matcher follows every token, and it ends on EOS
where the grammar may end. The tiny checkpoint has random weights, so only the grammar makes its
output valid JSON / a valid tool call."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.engine.request import Request
from ninfer_nb.engine.sampler import Sampler
from ninfer_nb.structured import allowed_token_ids, compile_constraint

PROMPT = [11, 220, 3405, 90, 17, 4088, 512, 73, 1999]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "size"],
          "properties": {"ok": {"type": "boolean"},
                         "size": {"type": "string", "enum": ["small", "large"]}}}


@pytest.fixture(scope="module")
def llm(tiny_qwen35_dir: Path) -> LLM:
    return LLM(str(tiny_qwen35_dir), device="cpu", max_context=448, prefill_chunk=64)


def constraint(llm: LLM, kind: str, spec: object):
    return compile_constraint(kind, spec, llm.tokenizer, vocab_size=llm.model_config.vocab_size)


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=80, temperature=0.0),
    SamplingParams(max_tokens=80, temperature=1.0, top_k=50, seed=7),
    SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True),   # the grammar's end still ends it
], ids=["greedy", "top_k", "ignore_eos"])
def test_json_schema_output_validates(llm: LLM, params: SamplingParams) -> None:
    out = llm.generate(PROMPT, params, constraint=constraint(llm, "json_schema", SCHEMA))
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.tokenizer.eos_token_ids
    jsonschema.validate(json.loads(out.text), SCHEMA)
    free = llm.generate(PROMPT, params.replace(max_tokens=8))
    assert not free.text.startswith("{")  # the random model alone writes no JSON


def test_each_token_is_allowed_by_the_mask_before_it(llm: LLM) -> None:
    c = constraint(llm, "json_schema", SCHEMA)
    request = Request("r", PROMPT, SamplingParams(max_tokens=80, temperature=0.0), constraint=c)
    llm.engine.add_request(request)
    while not request.finished:
        llm.engine.step()
    follower = c.matcher()
    for token in request.output_ids:
        assert token in allowed_token_ids(follower.allowed_tokens(), c.vocab_size)
        follower.advance(token)
    assert follower.is_finished(), (request.status, llm.tokenizer.decode(request.output_ids))
    jsonschema.validate(json.loads(llm.tokenizer.decode(request.output_ids[:-1])), SCHEMA)


def test_tool_call_is_forced(llm: LLM) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city"], "additionalProperties": False,
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}}}}}]
    spec = {"tools": tools, "tool_choice": "required", "parallel_tool_calls": False}
    result = llm.chat([{"role": "user", "content": "Weather?"}], tools,
                      SamplingParams(max_tokens=100, temperature=0.0), enable_thinking=False,
                      constraint=constraint(llm, "tool_calls", spec))
    assert [c.name for c in result.tool_calls] == ["get_weather"]
    assert result.tool_calls[0].arguments["city"] in ("Paris", "Tokyo")


def test_sampler_masks_and_follows() -> None:
    """Sampler.constrain puts -inf outside the mask; observe advances the matcher."""
    class Follower:
        def __init__(self) -> None:
            self.seen: list[int] = []

        def allowed_tokens(self) -> np.ndarray:
            return np.array([1 << 3], dtype=np.int32)  # only id 3

        def advance(self, token: int) -> None:
            self.seen.append(token)

    matcher = Follower()
    sampler = Sampler(SamplingParams(temperature=0.0), 40, matcher=matcher)  # type: ignore[arg-type]
    logits = np.arange(40, dtype=np.float32)
    assert sampler.sample(logits) == 3
    sampler.observe(3)
    assert matcher.seen == [3]
