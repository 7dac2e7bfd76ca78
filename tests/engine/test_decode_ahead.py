"""Steps queued ahead (Generator.decode_token(ahead=True), the token ring) on the CPU.

`RingBackend` is the CPU backend with the CUDA backend's decode semantics (engine/cuda_backend.py):
the graph's inputs (token, position, pick) live in "device" buffers; the first decode step is
eager, the second captures the graph, and only then can a step be queued on the token the
last one picked (`graph_ready`); a launched step does not run at launch: it and the copy of
its token into its slot of a 4-slot ring join a stream of work that runs in order only when
the host waits for a token (`collect_token`), so the host reads token n while step n + 1 is
already queued; host writes to the inputs, eager steps and state copies are stream-ordered too; `discard_tokens` forgets
the uncollected tokens but their steps still run. The ring's slots start stale and a slot
is read only after its step ran, so a wrong slot, a missed wait or a step fed the wrong token
or offset changes the tokens.

Against the plain CPU engine (logits rows, host sampler) on the same tiny random hybrid: greedy
tokens equal; a budget stop feeds nothing extra; a stop token is fed by the step queued for
it and a follow-up prompt continues exactly as from an ordinary decode; a cancel with a step in
flight leaves a consistent state; sampled tokens with steps queued ahead equal those without.
No GPU needed (tests/engine/test_gpu_model.py checks the real ring on the device).
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable

import numpy as np
import pytest

from ninfer_nb import SamplingParams
from ninfer_nb.config import DecodeChoices
from ninfer_nb.engine.backend import CpuBackend
from ninfer_nb.engine.backends.base import ARGMAX, Forward, Pick
from ninfer_nb.engine.sampler import gumbel_max_pick
from tests.support.twin_models import VOCAB, twin_llm

RING = 4
STALE = -7


class RingBackend(CpuBackend):
    """CpuBackend with CudaBackend's decode graph, device-side inputs and token ring."""

    decode_graphs = True

    def __init__(self) -> None:
        super().__init__()
        self.stream: collections.deque[Callable[[], None]] = collections.deque()  # queued work
        self.inputs: dict[str, Any] = {"token": 0, "pos": 0, "pick": ARGMAX}      # the graph reads them
        self.ring = [STALE] * RING                  # pinned token slots
        self.done = [True] * RING                   # each slot's event
        self.pending: collections.deque[int] = collections.deque()
        self.launches = 0
        self.warmed = self.captured = False
        self.depth_at_collect: list[int] = []       # steps not run when the host waited (pipelining)
        self.fed: list[tuple[int, int]] = []        # (token, position) of every step run

    # --- the graph ------------------------------------------------------------------------
    @property
    def graph_ready(self) -> bool:
        return self.captured and self._pick_vocab > 0

    def _sync(self) -> None:
        while self.stream:
            self.stream.popleft()()

    # eager work and state copies are stream-ordered: queued steps run first
    def begin_step(self) -> None:
        self._sync()

    def copy_(self, dst: np.ndarray, src: np.ndarray) -> None:
        self._sync()
        super().copy_(dst, src)

    def zero_(self, dst: np.ndarray) -> None:
        self._sync()
        super().zero_(dst)

    def _write(self, token: int, position: int, pick: Pick) -> None:
        """The host's writes to the graph inputs, ordered after the queued work."""
        self.stream.append(lambda: self.inputs.update(token=token, pos=position, pick=pick))

    def _graph_step(self, forward: Forward) -> int | None:
        """The step on the current inputs: forward, then (pick enabled) the pick, fed back into
        the inputs like ops.pick_feed (token, position + 1, offset + 1); returns the pick."""
        token, pos, pick = self.inputs["token"], self.inputs["pos"], self.inputs["pick"]
        self.fed.append((token, pos))
        row = np.asarray(forward(*self.ids([token], pos)))[-1]
        self.inputs["row"] = row
        if not self._pick_vocab:
            return None
        top = gumbel_max_pick(row[: self._pick_vocab], *pick)
        self.inputs.update(token=top, pos=pos + 1, pick=pick._replace(offset=pick.offset + 1), top=top)
        return top

    def _advance_capture(self) -> None:
        if not self.warmed:
            self.warmed = True                       # the eager first step
        elif not self.captured:
            self.captured = True                     # the second step is captured (and replayed)

    def decode_step(self, forward: Forward, token: int, position: int) -> np.ndarray:
        self._write(token, position, ARGMAX)
        def step() -> None:
            self._graph_step(forward)

        self.stream.append(step)
        self._sync()
        self._advance_capture()
        return np.asarray(self.inputs["row"])

    # --- the token ring -------------------------------------------------------------------
    def launch_token_step(self, forward: Forward, token: int | None, position: int,
                          pick: Pick = ARGMAX) -> None:
        if not self._pick_vocab:
            raise RuntimeError("launch_token_step: enable_token_pick was not called")
        if len(self.pending) >= RING:
            raise RuntimeError("launch_token_step: every token slot is in flight")
        if token is None:
            if not self.graph_ready:
                raise RuntimeError("launch_token_step: a device-fed step needs the captured graph")
        else:
            self._write(token, position, pick)
            self._advance_capture()
        slot = self.launches % RING
        self.launches += 1
        self.done[slot] = False

        def step_and_copy() -> None:
            self._graph_step(forward)
            self.ring[slot] = self.inputs["top"]
            self.done[slot] = True

        self.stream.append(step_and_copy)
        self.pending.append(slot)

    def collect_token(self) -> int:
        slot = self.pending.popleft()
        self.depth_at_collect.append(sum(not d for d in self.done))
        while not self.done[slot]:                   # the slot's event: run the work up to its copy
            self.stream.popleft()()
        return self.ring[slot]

    def discard_tokens(self) -> None:
        self.pending.clear()                         # their steps still run, in order


def ring_llm(monkeypatch: pytest.MonkeyPatch, **engine: Any) -> Any:
    import ninfer_nb.llm as llm_module

    monkeypatch.setattr(llm_module, "create_backend", lambda device, **kw: RingBackend())
    llm = twin_llm(monkeypatch, "small", "cpu", max_context=256, **engine)
    monkeypatch.undo()
    assert isinstance(llm.backend, RingBackend) and llm.engine.picks_on_device
    return llm


@pytest.fixture()
def plain(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The reference: the CPU backend, logits rows to the host sampler, nothing queued."""
    return twin_llm(monkeypatch, "small", "cpu", max_context=256)


def _ids(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(2, VOCAB, n)]


GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def test_greedy_tokens_and_budget_stop(monkeypatch: pytest.MonkeyPatch, plain: Any) -> None:
    prompt = _ids(60, 9)
    ring = ring_llm(monkeypatch)
    got = ring.generate(prompt, GREEDY)
    assert got.token_ids == plain.generate(prompt, GREEDY).token_ids
    gen, backend = ring.engine.generator, ring.backend
    assert gen.tokens == prompt + got.token_ids[:-1]          # the budget's last token: not fed
    assert [p for _, p in backend.fed] == list(range(len(prompt), len(prompt) + len(got.token_ids) - 1))
    assert [t for t, _ in backend.fed] == got.token_ids[:-1]  # each step fed the token picked before it
    assert max(backend.depth_at_collect) == 2                 # the host waited with the next step queued


def test_stop_token_is_fed_by_the_queued_step(monkeypatch: pytest.MonkeyPatch, plain: Any) -> None:
    prompt = _ids(61, 9)
    ring = ring_llm(monkeypatch)
    base = plain.generate(prompt, GREEDY).token_ids
    k = max(i for i in range(len(base) - 1) if base[i] not in base[:i])   # a first occurrence
    assert k >= 3, base
    stop = GREEDY.replace(stop_token_ids=(base[k],))
    cut = ring.generate(prompt, stop)
    assert cut.finish_reason == "stop" and cut.token_ids == base[: k + 1]
    assert ring.engine.generator.tokens == prompt + base[: k + 1]        # fed by the step queued for it
    plain.generate(prompt, stop)
    plain.engine.generator.decode(base[k])                               # the same state, the ordinary way
    follow = prompt + base[: k + 1] + _ids(62, 5)
    got, want = ring.generate(follow, GREEDY), plain.generate(follow, GREEDY)
    assert got.timings.cached_tokens == want.timings.cached_tokens == len(prompt) + k + 1
    assert got.token_ids == want.token_ids


def test_cancel_with_a_step_in_flight_leaves_a_consistent_state(monkeypatch: pytest.MonkeyPatch,
                                                                 plain: Any) -> None:
    prompt = _ids(63, 9)
    ring = ring_llm(monkeypatch)
    cancel = threading.Event()
    stream = ring.stream(prompt, GREEDY.replace(max_tokens=40), cancel=cancel)
    seen = []
    for ev in stream:
        if ev.token_id is not None:
            seen.append(ev.token_id)
        if len(seen) == 5:
            cancel.set()
    assert ev.finished and ev.finish_reason == "cancelled" and 5 <= len(seen) < 40
    gen = ring.engine.generator
    assert gen.tokens[: len(prompt)] == prompt and gen.tokens[len(prompt):] == seen[: len(gen.tokens) - len(prompt)]
    follow = prompt + seen[:3] + _ids(64, 4)
    assert ring.generate(follow, GREEDY).token_ids == plain.generate(follow, GREEDY).token_ids


def test_sampled_tokens_equal_without_steps_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Temperature sampling in the graph: each device-fed step takes the next noise offset, so
    the tokens are those of host-fed steps; another seed gives others."""
    prompt = _ids(65, 7)
    p = SamplingParams(max_tokens=12, temperature=1.0, seed=7, ignore_eos=True)
    ahead = ring_llm(monkeypatch).generate(prompt, p).token_ids
    queued_none = ring_llm(monkeypatch, decode=DecodeChoices(decode_ahead=False))
    assert queued_none.generate(prompt, p).token_ids == ahead
    assert max(queued_none.backend.depth_at_collect) == 1      # each step waited for alone
    assert ring_llm(monkeypatch).generate(prompt, p.replace(seed=8)).token_ids != ahead
