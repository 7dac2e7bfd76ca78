"""Generations at once through the server (engine/worker.py max_active, the engine's scheduler):
many OpenAI SDK clients streaming concurrently on the real tiny engine with four decode slots
get exactly the text, finish reason and usage each gets alone, while the engine really ran
decode rounds of several requests; a client that disconnects mid-stream disturbs none of the
others."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import MODEL_ID, base_config, openai_client
from tests.server.harness import LiveServer

WORDS = ["red", "green", "blue", "yellow", "a long story about a cat", "numbers: 1 2 3", "why", "ok"]


@pytest.fixture(scope="module")
def batched(tiny_qwen35_dir: Path) -> Any:
    from ninfer_nb import LLM

    llm = LLM(str(tiny_qwen35_dir), device="cpu", max_context=384, max_concurrency=4)
    with LiveServer(llm, base_config(max_pending=32)) as srv:
        yield llm, srv


def _stream(srv: LiveServer, i: int, cut: bool = False) -> tuple[str, str | None, int | None]:
    """Client i: a streamed greedy chat; (text, finish reason, completion tokens of usage).
    cut: read two chunks, then hang up."""
    stream = openai_client(srv).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": WORDS[i % len(WORDS)]}],
        max_tokens=6 + (i % len(WORDS)) % 5, temperature=0, stream=True, stream_options={"include_usage": True})
    text, reason, usage = [], None, None
    for n, chunk in enumerate(stream):
        if cut and n == 2:
            stream.close()
            return "", None, None
        for choice in chunk.choices:
            text.append((getattr(choice.delta, "reasoning_content", None) or "") + (choice.delta.content or ""))
            reason = choice.finish_reason or reason
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return "".join(text), reason, usage


def test_concurrent_streams_equal_their_solo_runs(batched: Any) -> None:
    llm, srv = batched
    alone = [_stream(srv, i) for i in range(len(WORDS))]
    assert all(reason in ("length", "stop") and usage for _, reason, usage in alone)
    llm.engine.batch_sizes.clear()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda i: _stream(srv, i, cut=i % 7 == 3), range(16)))
    assert time.perf_counter() - t0 < 120
    for i, result in enumerate(got):
        if i % 7 != 3:
            assert result == alone[i % len(WORDS)], i
    assert max(llm.engine.batch_sizes) >= 3                 # rounds of several requests ran
    assert not llm.engine.has_unfinished_requests()
