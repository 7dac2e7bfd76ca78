"""An out-of-memory in one request's step ends that request alone (issue 30 item 4), on the CPU.

The CPU backend has no arena to shrink (tests/engine/test_device_faults_gpu.py shrinks the
CUDA one), so its linear op is made to raise the CUDA scratch arena's ArenaFull for inputs of
more than LIMIT rows: a long prompt's prefill chunk. Two requests run at once (max_concurrency
2, as the server runs them): the long one ends with DeviceOutOfMemoryError while the short one,
decoding beside it, streams every token it would have alone; then the engine serves the next
request as a fresh one would.
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb import SamplingParams
from ninfer_nb.engine.faults import DeviceOutOfMemoryError
from ninfer_nb.ops import cpu
from ninfer_nb.runtime.arena import ArenaFull
from tests.support.twin_models import VOCAB, twin_llm

LIMIT = 64
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _ids(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(2, VOCAB, n)]


def _tight_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    exact = cpu.linear

    def linear(x: np.ndarray, weight, bias=None):
        if x.size // x.shape[-1] > LIMIT:
            raise ArenaFull(f"scratch: need {x.nbytes * 4} B at offset 0, capacity {x.nbytes} B")
        return exact(x, weight, bias)

    monkeypatch.setattr(cpu, "linear", linear)


def test_out_of_memory_ends_one_request_and_the_other_streams_on(monkeypatch: pytest.MonkeyPatch) -> None:
    short, long, after = _ids(80, 12), _ids(81, 200), _ids(82, 12)
    solo = twin_llm(monkeypatch, "small", "cpu", max_context=512)
    want, want_after = solo.generate(short, GREEDY).token_ids, solo.generate(after, GREEDY).token_ids
    llm = twin_llm(monkeypatch, "small", "cpu", max_context=512, max_concurrency=2)
    _tight_memory(monkeypatch)
    a = llm.stream(short, GREEDY)
    got = [next(a).token_id]                       # the short request is decoding
    b = llm.stream(long, GREEDY)
    with pytest.raises(DeviceOutOfMemoryError, match="out of memory"):
        next(b)
    got += [ev.token_id for ev in a if ev.token_id is not None]
    assert got == want
    assert llm.generate(after, GREEDY).token_ids == want_after


def test_a_failed_decode_round_ends_its_requests_with_the_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three requests decode in one batched round; the round runs out of memory: it ends all.
    The stream whose turn ran the round gets the error raised, the others get the same typed
    error from their own final outputs (not a bare finish_reason "error"); the engine goes on.
    (Three: the CPU backend runs rounds of one or two rows row by row.)"""
    first, second, third, after = _ids(83, 12), _ids(84, 12), _ids(86, 12), _ids(85, 12)
    want_after = twin_llm(monkeypatch, "small", "cpu", max_context=512).generate(after, GREEDY).token_ids
    llm = twin_llm(monkeypatch, "small", "cpu", max_context=512, max_concurrency=3)
    exact, armed = cpu.linear, [False]

    def linear(x: np.ndarray, weight, bias=None):
        if armed[0] and x.size // x.shape[-1] == 3:          # the three-row decode round
            raise ArenaFull("scratch: need 2 MiB at offset 0, capacity 1 MiB")
        return exact(x, weight, bias)

    monkeypatch.setattr(cpu, "linear", linear)
    a, b, c = llm.stream(first, GREEDY), llm.stream(second, GREEDY), llm.stream(third, GREEDY)
    next(a), next(b), next(c)                                  # all decoding
    armed[0] = True
    with pytest.raises(DeviceOutOfMemoryError):
        for _ in range(GREEDY.max_tokens):
            next(a)
    with pytest.raises(DeviceOutOfMemoryError):
        list(b)
    with pytest.raises(DeviceOutOfMemoryError):
        list(c)
    armed[0] = False
    assert llm.generate(after, GREEDY).token_ids == want_after
