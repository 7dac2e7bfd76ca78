"""Structured output on the decode graph's pick (PickFilters.matcher): a constrained request keeps
the device pick, which applies its grammar's bitmask each step (kernels/sample_pick.py; on the
CPU twin of the CUDA backend, tests/engine/test_decode_ahead.py RingBackend, gumbel_max_pick does
the same). The host sampler only takes the prefill's token; the tokens equal the host path's
(greedy) and the output validates. Tiny Qwen3.5 checkpoint, random weights."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.config import DecodeChoices, EngineConfig
from ninfer_nb.engine.sampler import Sampler
from ninfer_nb.structured import compile_constraint

PROMPT = [11, 220, 3405, 90, 17, 4088, 512, 73, 1999]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "size", "tags"],
          "properties": {"ok": {"type": "boolean"}, "size": {"type": "string", "enum": ["small", "large"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}}}


def _validate(text: str) -> None:
    """`text` is an instance of SCHEMA (checked by hand: the GPU image has no jsonschema)."""
    obj = json.loads(text)
    assert isinstance(obj, dict) and set(obj) == {"ok", "size", "tags"}, obj
    assert isinstance(obj["ok"], bool) and obj["size"] in ("small", "large"), obj
    tags = obj["tags"]
    assert isinstance(tags, list) and len(tags) <= 3 and all(isinstance(t, str) and len(t) <= 6 for t in tags), obj


def _llm(path: Path, monkeypatch: pytest.MonkeyPatch | None = None, **engine: Any) -> LLM:
    if monkeypatch is not None:
        import ninfer_nb.llm as llm_module
        from tests.engine.test_decode_ahead import RingBackend

        monkeypatch.setattr(llm_module, "create_backend", lambda device, **kw: RingBackend())
    return LLM(config=EngineConfig(str(path), device="cpu", max_context=448, prefill_chunk=64,
                                   show_progress=False, **engine))


@pytest.fixture(scope="module")
def host_greedy(tiny_qwen35_dir: Path) -> tuple[Any, list[int]]:
    """(the schema's constraint, the host path's greedy tokens under it): the reference."""
    host = _llm(tiny_qwen35_dir, max_concurrency=1)
    c = compile_constraint("json_schema", SCHEMA, host.tokenizer, vocab_size=host.model_config.vocab_size)
    return c, host.generate(PROMPT, SamplingParams(max_tokens=80, temperature=0.0), constraint=c).token_ids


@pytest.mark.parametrize("engine", [dict(max_concurrency=2), dict(max_concurrency=1),
                                    dict(max_concurrency=1, decode=DecodeChoices(decode_ahead=False))],
                         ids=["rows", "one-sequence-ahead", "one-sequence"])
def test_constrained_greedy_on_the_device_pick(tiny_qwen35_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                               host_greedy: tuple[Any, list[int]], engine: dict[str, Any]) -> None:
    """Steps queued ahead (the ring runs a step when its token is collected, after the token
    before it was observed: the split build's order) or not, and rounds of rows."""
    c, want = host_greedy
    params = SamplingParams(max_tokens=80, temperature=0.0)
    ring = _llm(tiny_qwen35_dir, monkeypatch, **engine)
    assert ring.engine.picks_on_device
    samples = []
    real = Sampler.sample
    monkeypatch.setattr(Sampler, "sample", lambda self, row: samples.append(1) or real(self, row))
    got = ring.generate(PROMPT, params, constraint=c)
    assert len(samples) == 1                                   # the prefill's token only
    assert got.token_ids == want and got.finish_reason == "stop"
    _validate(got.text)


def test_constrained_sampled_rows_validate(tiny_qwen35_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                          host_greedy: tuple[Any, list[int]]) -> None:
    """Sampled with Qwen's filters, two constrained requests and a free one in the same rounds:
    each constrained output validates, the free one is unconstrained text."""
    from ninfer_nb.engine.request import Request

    ring = _llm(tiny_qwen35_dir, monkeypatch, max_concurrency=3)
    c = host_greedy[0]
    p = SamplingParams(max_tokens=80, temperature=0.7, top_k=20, top_p=0.95, presence_penalty=1.0)
    reqs = [Request("a", PROMPT, p.replace(seed=1), constraint=c), Request("b", PROMPT[2:], p.replace(seed=2)),
            Request("c", PROMPT[1:], p.replace(seed=3), constraint=c)]
    engine = ring.engine
    engine.batch_sizes.clear()
    for r in reqs:
        engine.add_request(r)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.batch_sizes.get(3, 0) >= 3
    for r in (reqs[0], reqs[2]):
        assert r.output_ids[-1] in ring.tokenizer.eos_token_ids
        _validate(ring.tokenizer.decode(r.output_ids[:-1]))
    assert not ring.tokenizer.decode(reqs[1].output_ids).startswith("{")


@pytest.mark.gpu
@pytest.mark.parametrize("concurrency", [1, 2])
def test_gpu_constrained_on_the_decode_graph(tiny_checkpoints: Any, monkeypatch: pytest.MonkeyPatch,
                                             concurrency: int) -> None:
    """On the GPU a constrained request keeps the decode graph (one sequence: the split build,
    each device-fed step's pick launched once the host has its bitmask; two lanes: the B-row
    graphs): the host sampler takes only the prefill's token, the greedy tokens equal the
    same backend's host path (logits rows, device_pick off), and a sampled run with logprobs
    validates with a logprob for every token. Plain requests before and after keep theirs."""
    from ninfer_nb.engine.request import Request
    from tests.engine.test_gpu_model import gpu_checkpoint

    gpu = LLM(str(gpu_checkpoint(tiny_checkpoints, "qwen35")), device="cuda", max_context=448, kv_cache="fp32",
              max_concurrency=concurrency)
    c = compile_constraint("json_schema", SCHEMA, gpu.tokenizer, vocab_size=gpu.model_config.vocab_size)
    greedy = SamplingParams(max_tokens=80, temperature=0.0)
    plain = gpu.generate(PROMPT, greedy.replace(max_tokens=12, ignore_eos=True)).token_ids
    samples = []
    real = Sampler.sample
    monkeypatch.setattr(Sampler, "sample", lambda self, row: samples.append(1) or real(self, row))
    got = gpu.generate(PROMPT, greedy, constraint=c)
    assert len(samples) == 1 and got.finish_reason == "stop"
    _validate(got.text)
    sampled = Request("s", PROMPT, SamplingParams(max_tokens=80, temperature=0.7, top_k=20, top_p=0.95,
                                                   presence_penalty=1.0, seed=3, logprobs=2), constraint=c)
    gpu.engine.add_request(sampled)
    while gpu.engine.has_unfinished_requests():
        gpu.engine.step()
    assert len(samples) == 2 and sampled.output_ids[-1] in gpu.tokenizer.eos_token_ids
    _validate(gpu.tokenizer.decode(sampled.output_ids[:-1]))
    assert [lp.token_id for lp in sampled.logprobs] == sampled.output_ids
    assert gpu.generate(PROMPT, greedy.replace(max_tokens=12, ignore_eos=True)).token_ids == plain
    gpu.engine.decode = DecodeChoices(device_pick=False)      # the host path: logits rows, host sampler
    samples.clear()
    assert gpu.generate(PROMPT, greedy, constraint=c).token_ids == got.token_ids
    assert len(samples) == len(got.token_ids)
