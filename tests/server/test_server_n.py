"""`n` choices share the prompt's prefill (issue 29, item 4): the server submits the n choices as
engine requests with the same prompt ids; the scheduler holds the siblings until the first one's
prefill ends and starts them from its prompt-end snapshot (engine/prefix_cache.py), so the
prompt is computed once, and the choices decode as rows of the same rounds. Through the
official OpenAI SDK (completions, streamed and not) against the real server (tiny Qwen3.5, CPU backend, four lanes)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.server.conftest import MODEL_ID, base_config, openai_client
from tests.server.harness import LiveServer


@pytest.fixture(scope="module")
def lanes(tiny_qwen35_dir: Path) -> Iterator[tuple[Any, LiveServer]]:
    from ninfer_nb import LLM

    llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=384, max_concurrency=4)
    with LiveServer(llm, base_config()) as srv:
        yield llm, srv


def _prefilled(llm: Any, srv: LiveServer, content: str, n: int, stream: bool = False) -> tuple[int, Any]:
    """(prompt tokens the engine computed for one completion request with n choices, the reply)."""
    before = llm.engine.prefill_tokens
    kw: dict[str, Any] = dict(model=MODEL_ID, prompt=content, max_tokens=6, n=n, temperature=0.9, seed=11,
                              extra_body={"ignore_eos": True})
    client = openai_client(srv)
    if stream:
        texts: dict[int, str] = {}
        for chunk in client.completions.create(stream=True, **kw):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
        out: Any = texts
    else:
        out = client.completions.create(**kw)
    return llm.engine.prefill_tokens - before, out


@pytest.mark.parametrize("stream", [False, True])
def test_n_choices_prefill_the_prompt_once(lanes: tuple[Any, LiveServer], stream: bool) -> None:
    llm, srv = lanes
    # distinct first words: no prompt reuses another's pages (each is shorter than a page anyway)
    one, reply1 = _prefilled(llm, srv, f"Alpha {stream} tell me about rivers.", 1, stream)
    llm.engine.batch_sizes.clear()
    three, reply3 = _prefilled(llm, srv, f"Bravo {stream} tell me about lakes.", 3, stream)
    if stream:
        assert sorted(reply3) == [0, 1, 2] and len(set(reply3.values())) == 3
    else:
        assert [c.index for c in reply3.choices] == [0, 1, 2] and len(reply1.choices) == 1
        assert len({c.text for c in reply3.choices}) == 3       # seed + index: they differ
        assert reply3.usage.completion_tokens == 18
        # each prompt computed once: n = 3 prefills what n = 1 does for its prompt
        assert one == reply1.usage.prompt_tokens and three == reply3.usage.prompt_tokens
    assert 0 < three < 2 * one
    assert max(llm.engine.batch_sizes) == 3                 # the choices decode as rows of one round
