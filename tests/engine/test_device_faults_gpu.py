"""An out-of-memory in one request fails that request only (issue 30 item 4), on the GPU.

The CUDA backend's per-step scratch arena is shrunk under a running engine (a bump allocator:
an allocation past its capacity raises ArenaFull, as a real shortage would), between the
need of short requests and that of a long prompt's 1,024-row prefill chunk, or of a decode
step. Wanted: the request that does not fit ends with DeviceOutOfMemoryError (a clear,
typed error); the engine then serves the next request exactly as a fresh one would (the
failed request's caches forgotten, its scratch handed back, a failed graph capture leaving
the stream usable and the next request capturing its graph).
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb import SamplingParams
from ninfer_nb.engine.faults import DeviceOutOfMemoryError
from tests.support.twin_models import VOCAB, twin_llm

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _ids(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(2, VOCAB, n)]


def _peak(llm, prompt: list[int]) -> tuple[list[int], int]:
    """(greedy tokens, the scratch's high-water mark over that request)."""
    scratch = llm.backend.scratch
    scratch.peak = 0
    tokens = llm.generate(prompt, GREEDY).token_ids
    return tokens, scratch.peak


def test_prefill_out_of_memory_fails_only_that_request(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = twin_llm(monkeypatch, "hybrid", "cuda", max_context=4096)
    short, other, long = _ids(50, 40), _ids(51, 40), _ids(52, 3000)
    long2 = _ids(54, 3000)                                     # not cached: its prefill runs
    want_short, need_short = _peak(llm, short)
    want_other, _ = _peak(llm, other)
    _, need_long = _peak(llm, long)
    assert need_long > 1.5 * need_short, (need_short, need_long)
    scratch = llm.backend.scratch
    full = scratch.capacity
    scratch.capacity = (need_short + need_long) // 2
    try:
        with pytest.raises(DeviceOutOfMemoryError, match="out of memory"):
            llm.generate(long2, GREEDY)
        assert llm.engine.context_tokens == 0                   # its half-written caches forgotten
        assert llm.generate(other, GREEDY).token_ids == want_other
        assert llm.generate(short, GREEDY).token_ids == want_short
    finally:
        scratch.capacity = full
    print(f"\nscratch need: 40-token prompt {need_short / 2**20:.1f} MiB, 3000-token prompt "
          f"{need_long / 2**20:.1f} MiB; the long one failed alone at {(need_short + need_long) // 2**21:.1f} MiB")


def test_graph_capture_out_of_memory_fails_only_that_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode graph is captured on a request's second decode step; a capture that runs out
    of scratch fails that request; the next one captures the graph and decodes as a fresh
    engine does."""
    prompt = _ids(53, 40)
    want = twin_llm(monkeypatch, "hybrid", "cuda", max_context=512).generate(prompt, GREEDY).token_ids
    llm = twin_llm(monkeypatch, "hybrid", "cuda", max_context=512)
    gen, backend = llm.engine.generator, llm.backend
    logits, _ = gen.prefill(prompt)
    backend.scratch.peak = 0
    gen.decode_token(int(np.argmax(logits[:VOCAB])), llm.valid_vocab)    # the eager first decode step
    need_decode = backend.scratch.peak
    assert backend._graph is None and need_decode > 0
    full = backend.scratch.capacity
    backend.scratch.capacity = need_decode // 2
    try:
        # the prompt's logits are cached (no prefill step): the next step is the capture
        with pytest.raises(DeviceOutOfMemoryError):
            llm.generate(prompt, GREEDY)
        assert backend._graph is None
    finally:
        backend.scratch.capacity = full
    assert llm.generate(prompt, GREEDY).token_ids == want
    assert backend._graph is not None
