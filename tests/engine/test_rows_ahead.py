"""Decode rounds queued ahead on paged lanes (LLMEngine._collect, engine/rows_graphs.py) on the CPU.

`RowsRingBackend` is the CPU backend with the CUDA backend's queued-round semantics
(CudaBackend.launch_rows / launch_rows_fed / collect_rows / discard_rows): a round's inputs
(ids, positions, slots, page table, picks) live in "device" buffers; the first round of a
(B, P) key is eager, the second captures, and only then can a round be replayed on what the
last one's pick fed back (token, position + 1, offset + 1). Launched rounds join a stream of
work that runs in order only when the host waits for a round's picks, so the host reads round n
while round n + 1 is queued; eager prefill chunks and state copies are stream-ordered too. A
device-fed round reads only the page-table entries the host copied, so a missed page makes
the tokens wrong; the ring's slots start stale.

Against the same engine with every round fed by the host (the same picks, nothing queued),
each request run alone: a mixed batch (arrivals, a stop id, a cancel,
seeded / filtered / penalised sampling), a tiny page budget (preemption, decode crossing into a
new page while queued) and one request alone all give every request its solo tokens, and one
request alone runs nearly every round device-fed with the next one queued.
"""
from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.config import DecodeChoices, EngineConfig
from ninfer_nb.engine.backend import CpuBackend
from ninfer_nb.engine.backends.base import Pick, RowsForward
from ninfer_nb.engine.request import Request
from ninfer_nb.engine.sampler import gumbel_max_pick
from ninfer_nb.engine.spec.ngram import NgramProposer
from tests.engine.test_scheduler import GREEDY, drive, prompt, solo, tokens

RING = 4
STALE = -7


class RowsRingBackend(CpuBackend):
    """CpuBackend with CudaBackend's queued decode rounds (graphs per (B, P), pinned ring)."""

    decode_graphs = True

    def __init__(self) -> None:
        super().__init__()
        self.stream: collections.deque[Callable[[], None]] = collections.deque()
        self.inputs: dict[str, Any] = {}
        self.keys: dict[tuple[int, int], str] = {}      # key -> "warm" | "captured"
        self.last: tuple[int, int] | None = None
        self.ring = [[STALE]] * RING
        self.done = [True] * RING
        self.pending: collections.deque[int] = collections.deque()
        self.launches = self.host_fed = self.device_fed = 0
        self.depth_at_collect: list[int] = []

    def _sync(self) -> None:
        while self.stream:
            self.stream.popleft()()

    def begin_step(self) -> None:
        self._sync()

    def copy_(self, dst: np.ndarray, src: np.ndarray) -> None:
        self._sync()
        super().copy_(dst, src)

    def zero_(self, dst: np.ndarray) -> None:
        self._sync()
        super().zero_(dst)

    def load_(self, dst: np.ndarray, host: np.ndarray) -> None:
        self._sync()
        super().load_(dst, host)

    def _round(self, forward: RowsForward) -> list[int]:
        """The round on the current inputs, each row picked and fed back like ops.sample_pick."""
        inp = self.inputs
        out = []
        for b in range(len(inp["ids"])):
            row = np.asarray(forward(np.array(inp["ids"][b : b + 1], np.int64), np.array(inp["pos"][b : b + 1], np.int64),
                                     np.array(inp["slots"][b : b + 1], np.int32), inp["table"][b : b + 1]))[-1]
            pick = inp["picks"][b]
            top = gumbel_max_pick(row[: self._pick_vocab], *pick)
            inp["ids"][b], inp["pos"][b] = top, inp["pos"][b] + 1
            inp["picks"][b] = pick._replace(offset=pick.offset + 1)
            out.append(top)
        return out

    def _enqueue(self, forward: RowsForward) -> None:
        slot = self.launches % RING
        self.launches += 1
        self.done[slot] = False

        def run() -> None:
            self.ring[slot] = self._round(forward)
            self.done[slot] = True

        self.stream.append(run)
        self.pending.append(slot)

    def launch_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                    slots: Sequence[int], page_table: np.ndarray, picks: Sequence[Pick]) -> None:
        assert not self.pending, "launch_rows with rounds not collected"
        key = (len(tokens), int(page_table.shape[1]))
        self.keys[key] = "captured" if key in self.keys else "warm"
        self.last, self.forward = key, forward
        ids, pos, sl, tab, pk = list(tokens), list(positions), list(slots), np.array(page_table), list(picks)
        self.stream.append(lambda: self.inputs.update(ids=ids, pos=pos, slots=sl, table=tab, picks=pk))
        self.host_fed += 1
        self._enqueue(forward)

    def rows_ahead_ready(self) -> bool:
        return self.last is not None and self.keys.get(self.last) == "captured" and len(self.pending) < RING

    def launch_rows_fed(self, page_table: np.ndarray) -> None:
        assert self.rows_ahead_ready()
        new = np.array(page_table)

        def copy_table() -> None:          # the changed entries, as the pinned async copy
            assert new.shape == self.inputs["table"].shape
            self.inputs["table"] = new

        self.stream.append(copy_table)
        self.device_fed += 1
        self._enqueue(self.forward)

    def collect_rows(self) -> list[int]:
        slot = self.pending.popleft()
        self.depth_at_collect.append(sum(not d for d in self.done))
        while not self.done[slot]:
            self.stream.popleft()()
        return list(self.ring[slot])

    def discard_rows(self) -> None:
        self.pending.clear()


def ring_llm(path: Path, concurrency: int, kv_pages: int | None = None, ahead: bool = True,
             **engine: Any) -> LLM:
    import ninfer_nb.llm as llm_module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llm_module, "create_backend", lambda device, **kw: RowsRingBackend())
        llm = LLM(config=EngineConfig(str(path), device="cpu", max_context=200, prefill_chunk=16,
                                      show_progress=False, max_concurrency=concurrency, kv_pages=kv_pages,
                                      decode=DecodeChoices(decode_ahead=ahead), **engine))
    assert isinstance(llm.backend, RowsRingBackend) and llm.engine._rows_ahead == ahead
    return llm


@pytest.fixture(scope="module")
def alone(tiny_qwen35_dir: Path) -> LLM:
    """The reference: the same picks on the device, each round fed by the host, one request at
    a time."""
    return ring_llm(tiny_qwen35_dir, 2, ahead=False)


def test_one_request_alone_runs_rounds_queued_ahead(tiny_qwen35_dir: Path, alone: LLM) -> None:
    """B = 1 on paged lanes: after the eager and the captured round every round is device-fed
    with the next one queued; greedy, seeded sampling and a stop token give the solo tokens,
    and the follow-up turn continues from the cache the queued round left."""
    llm = ring_llm(tiny_qwen35_dir, 4)
    backend = llm.backend
    assert isinstance(backend, RowsRingBackend)
    ids = prompt(21, 55)                                  # decode crosses into the second page
    params = GREEDY.replace(max_tokens=24)
    want = solo(alone, ids, params)
    assert llm.generate(ids, params).token_ids == want
    assert backend.host_fed == 2 and backend.device_fed == 21      # 23 rounds: the budget's last feeds nothing
    assert max(backend.depth_at_collect) == 2
    sampled = SamplingParams(max_tokens=16, temperature=0.9, top_k=50, seed=4, ignore_eos=True)
    assert llm.generate(ids, sampled).token_ids == solo(alone, ids, sampled)
    k = max(i for i in range(3, 12) if want[i] not in want[:i])
    stop = params.replace(stop_token_ids=(want[k],))
    got = llm.generate(ids, stop)
    assert got.finish_reason == "stop" and got.token_ids == want[: k + 1]
    follow = ids + want[: k + 1] + prompt(22, 5)          # the queued round fed the stop token
    assert llm.generate(follow, GREEDY).token_ids == solo(alone, follow, GREEDY)


def test_queued_rounds_give_each_request_its_solo_tokens(tiny_qwen35_dir: Path, alone: LLM) -> None:
    """Four lanes, six requests arriving over steps 0..6 with a stop id, a cancel and sampling
    (seeded, top-k / top-p, presence penalty): each gets its solo tokens (the cancelled one a
    prefix), rounds were queued ahead, and the row set changed under them."""
    specs = [
        ("a", prompt(1, 5), GREEDY.replace(max_tokens=12)),
        ("b", prompt(2, 40), SamplingParams(max_tokens=9, temperature=0.8, seed=3, ignore_eos=True)),
        ("c", prompt(3, 17), GREEDY.replace(max_tokens=12)),
        ("d", prompt(4, 9), SamplingParams(max_tokens=8, temperature=1.0, top_k=40, top_p=0.9, seed=5,
                                           ignore_eos=True)),
        ("e", prompt(5, 23), GREEDY.replace(presence_penalty=0.7, max_tokens=9)),
        ("f", prompt(6, 12), GREEDY.replace(max_tokens=20)),
    ]
    want = {rid: solo(alone, ids, p) for rid, ids, p in specs}
    stop = want["c"][4]
    specs[2] = ("c", specs[2][1], specs[2][2].replace(stop_token_ids=(stop,)))
    want["c"] = want["c"][: want["c"].index(stop) + 1]
    llm = ring_llm(tiny_qwen35_dir, 4)
    reqs = [Request(rid, ids, p) for rid, ids, p in specs]
    outs = drive(llm.engine, {0: reqs[:2], 1: [reqs[2]], 3: [reqs[3]], 5: [reqs[4]], 6: [reqs[5]]},
                 cancels={14: ["f"]})
    for rid, _, _ in specs:
        got = tokens(outs[rid])
        if outs[rid][-1].finish_reason == "cancelled":
            assert rid == "f" and got == want["f"][: len(got)]
        else:
            assert got == want[rid], rid
    backend = llm.backend
    assert isinstance(backend, RowsRingBackend)
    assert backend.device_fed > 5 and max(backend.depth_at_collect) == 2
    assert max(llm.engine.batch_sizes) >= 3 and not backend.pending and llm.engine._inflight is None


def test_queued_rounds_under_a_tiny_page_budget(tiny_qwen35_dir: Path, alone: LLM) -> None:
    """Three lanes over 5 pages: preemptions, cancels and decode crossing page boundaries with
    rounds queued; every finished request has its solo tokens, and the pages end free."""
    rng = np.random.default_rng(12)
    llm = ring_llm(tiny_qwen35_dir, 3, kv_pages=5)
    arrivals: dict[int, list[Request]] = {}
    cancels: dict[int, list[str]] = {}
    want = {}
    for i in range(7):
        ids = prompt(200 + i, int(rng.integers(50, 62)))
        params = GREEDY.replace(max_tokens=int(rng.integers(10, 40)))
        if i % 3 == 1:
            params = SamplingParams(max_tokens=params.max_tokens, temperature=0.9, seed=i, ignore_eos=True)
        want[f"r{i}"] = solo(alone, ids, params)
        step = int(rng.integers(0, 12))
        arrivals.setdefault(step, []).append(Request(f"r{i}", ids, params))
        if i % 4 == 3:
            cancels.setdefault(step + int(rng.integers(3, 30)), []).append(f"r{i}")
    outs = drive(llm.engine, arrivals, cancels)
    assert set(outs) == set(want)
    for rid, got_outs in outs.items():
        got = tokens(got_outs)
        if got_outs[-1].finish_reason == "cancelled":
            assert got == want[rid][: len(got)], rid
        else:
            assert got == want[rid], rid
    engine = llm.engine
    assert isinstance(llm.backend, RowsRingBackend) and llm.backend.device_fed > 5
    assert engine.scheduler.preemptions > 0 and not engine.scheduler.running
    engine.forget()
    assert engine.scheduler.allocator is not None and engine.scheduler.allocator.num_free == 5


class AlwaysDrafts(NgramProposer):
    """Drafts every step (the tokens after the last one's first occurrence, else a fixed run):
    each verify rejects or keeps some, and the kept tokens must be the plain greedy ones."""

    def propose(self, ids: list[int], k: int) -> list[int]:
        return (super().propose(ids, k) or [ids[-1] % 97 + 3] * k)[:k]


def test_ngram_speculation_runs_while_a_request_is_alone(tiny_qwen35_dir: Path, alone: LLM) -> None:
    """--spec ngram on lanes of a backend with graphs: a request alone (in the first lane)
    verifies drafts; a second request arriving mid-generation stops that (both decode in
    rounds) and its finish lets the first speculate again; both get their plain greedy tokens."""
    long_ids = prompt(31, 40)
    short_ids = prompt(32, 20)
    p_long, p_short = GREEDY.replace(max_tokens=100), GREEDY.replace(max_tokens=6)
    want_long, want_short = solo(alone, long_ids, p_long), solo(alone, short_ids, p_short)
    llm = ring_llm(tiny_qwen35_dir, 4, spec="ngram", draft_tokens=3)
    engine = llm.engine
    engine.proposer = AlwaysDrafts()
    long, short = Request("long", long_ids, p_long), Request("short", short_ids, p_short)
    engine.add_request(long)
    got: dict[str, list[int]] = {"long": [], "short": []}
    phases: dict[str, int] = {"alone": 0, "together": 0, "after": 0}
    for step in range(300):
        if step == 8:                                      # long decodes from step 3 (3 chunks)
            engine.add_request(short)
        before = engine.spec_stats.drafted
        running = engine.num_running
        for out in engine.step():
            got[out.request_id] += list(out.new_token_ids)
        phase = "alone" if step < 8 else "together" if running > 1 or engine.num_running > 1 else "after"
        phases[phase] += engine.spec_stats.drafted - before
        if not engine.has_unfinished_requests():
            break
    assert got == {"long": want_long, "short": want_short}
    assert phases["alone"] > 0 and phases["together"] == 0 and phases["after"] > 0, phases
    assert long.slot_id is None and engine.scheduler.lanes[0].tokens == [] and not engine.scheduler.running


def test_default_concurrency_sized_by_memory() -> None:
    """CUDA: 16 lanes where their GDN slots fit in a quarter of the memory after the weights,
    fewer where not, at least 1; the CPU: 8."""
    from ninfer_nb.llm import DEFAULT_CUDA_CONCURRENCY, default_concurrency

    slot = 150 << 20                                       # a 27B GDN slot: ~151 MB
    assert DEFAULT_CUDA_CONCURRENCY == 16
    assert default_concurrency("cuda", 70 << 30, slot) == 16
    assert default_concurrency("cuda", 8 << 30, slot) == 2    # 13 slots fit: 4 c + 4 <= 13
    assert default_concurrency("cuda", 1 << 30, slot) == 1
    assert default_concurrency("cuda", None, slot) == default_concurrency("cuda", 1 << 30, 0) == 16
    assert default_concurrency("cpu", 70 << 30, slot) == 8


def test_no_graphs_runs_the_rounds_eagerly(tiny_qwen35_dir: Path, alone: LLM) -> None:
    """cuda_graphs=False on a backend with graphs: rounds are plain forwards (no round graph,
    nothing queued); tokens as with the graphs."""
    import ninfer_nb.llm as llm_module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llm_module, "create_backend", lambda device, **kw: RowsRingBackend())
        llm = LLM(config=EngineConfig(str(tiny_qwen35_dir), device="cpu", max_context=200, prefill_chunk=16,
                                      show_progress=False, max_concurrency=3, cuda_graphs=False))
    backend = llm.backend
    assert isinstance(backend, RowsRingBackend)
    called = []
    for name in ("decode_rows", "pick_rows", "launch_rows"):
        setattr(backend, name, lambda *a, name=name, **kw: called.append(name))
    reqs = [Request("a", prompt(51, 30), GREEDY.replace(max_tokens=9)), Request("b", prompt(52, 12), GREEDY)]
    outs = drive(llm.engine, {0: reqs[:1], 2: reqs[1:]}, {})
    assert tokens(outs["a"]) == solo(alone, prompt(51, 30), GREEDY.replace(max_tokens=9))
    assert tokens(outs["b"]) == solo(alone, prompt(52, 12), GREEDY)
    assert called == [] and max(llm.engine.batch_sizes) == 2
