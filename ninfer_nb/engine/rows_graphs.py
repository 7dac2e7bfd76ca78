"""Decode rounds of B sequences on the GPU by CUDA-graph replay (CudaBackend.decode_rows /
pick_rows): one graph per (batch size B, table width P, picked or not, logprobs or not),
captured once and replayed for any set of requests. A picked round whose picks ask for
logprobs also computes them on the device (engine/device_pick.py deliver_logprobs). A round
with grammar rows is split in two graphs: the forward runs while the host computes the rows'
bitmasks (uploaded without a sync), then the pick; a slow grammar step delays the round's pick
by what it takes beyond the forward, not the whole batch by all of it.

A graph bakes in addresses, so everything a round varies lives in fixed device buffers that
the host fills before the replay: one int32 block per graph holding ids [B] | positions [B] |
GDN slots [B] | page table [B, P] (one host-to-device copy), and, for picked rounds, the
sampler's per-row parameters (engine/device_pick.py DevicePicker; one shared set of rows, as
many as the largest B so far). The first round of a key runs eagerly (it compiles the B-row
kernels), the second captures (capture records, then one replay runs it), every later one
replays. Knows nothing about requests: rows are whatever the scheduler put there.

Rounds queued ahead (`launch`, `launch_fed`, `collect`): a picked round's ids come back through
a slot of a pinned ring, signalled by the slot's event, so the host can queue the next round
before it reads them. `launch_fed` replays the last launched round on what its pick fed back
into the graph inputs (each row's token, position + 1, the pick's offset and counts): the same
rows, one token further; only page-table entries that changed are copied (async, from a pinned
mirror), so the device never waits for the host between rounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .backends.base import Pick, RowsForward


@dataclass
class _Round:
    inputs: Any                # [3 B + B P] int32: ids | positions | slots | page table
    ids: Any                   # [B] views into inputs
    pos: Any
    slots: Any
    table: Any                 # [B, P]
    warmed: bool = False
    graph: Any = None
    out: Any = None            # the captured round's output: logits [B, V], or picks [B] int32
                               # (and logprobs [B, 21] fp32, their ids [B, 20] int32)
    pick_graph: Any = None     # a split round's pick (graph: its forward)
    table_host: Any = None     # [B, P] int32: the page table the device buffer holds (queued rounds)
    table_pinned: Any = None   # PinnedBuffer mirror of it (async copies of changed entries)


RING = 4                       # ring slots of queued rounds (2 are ever in flight)
RING_ROWS = 256                # rows per slot: the largest B a queued round may have


class RowsGraphs:
    """The batched decode graphs of one CudaBackend (its ops, stream, scratch and PDL choice)."""

    def __init__(self, ops: Any, stream: Any, scratch: Any, pdl: bool) -> None:
        self.ops, self.stream, self.scratch, self.pdl = ops, stream, scratch, pdl
        self._rounds: dict[tuple[int, int, bool, bool, bool], _Round] = {}
        self._picker: Any = None
        self._ring: Any = None          # PinnedBuffer [RING, RING_ROWS] int32: queued rounds' picks
        self._events: list[Any] = []
        self._pending: list[tuple[int, int]] = []     # (slot, B) launched, not collected, oldest first
        self._launches = 0
        self._last: _Round | None = None              # the round launch_fed replays

    def _round(self, key: tuple[int, int, bool, bool, bool]) -> _Round:
        r = self._rounds.get(key)
        if r is None:
            b, p = key[:2]
            flat = self.ops.zeros((3 * b + b * p,), np.int32, persistent=True)
            r = self._rounds[key] = _Round(flat, flat[:b], flat[b:2 * b], flat[2 * b:3 * b],
                                           flat[3 * b:].reshape(b, p))
        return r

    def _device_picker(self, rows: int, vocab: int) -> Any:
        """The sampler's row buffers for at least `rows` rows; a larger B replaces them (and
        drops the picked graphs, which hold the old addresses)."""
        from .device_pick import DevicePicker

        if self._picker is None or self._picker.rows < rows or self._picker.vocab != vocab:
            self._picker = DevicePicker(self.ops, max(rows, 8), vocab)
            for key in [k for k in self._rounds if k[2]]:
                old = self._rounds.pop(key)
                for g in (old.graph, old.pick_graph):
                    if g is not None:
                        g.close()
        return self._picker

    def run(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int],
            page_table: np.ndarray, picks: Sequence[Pick] | None = None, vocab: int = 0) -> np.ndarray:
        """One round: logits [B, V] fp32 (picks None) or the B picked ids [B] int32 (picks[b]
        for row b over ids < vocab; the logprobs its filters ask for delivered), on the host."""
        from .device_pick import deliver_logprobs

        if self._pending:
            raise RuntimeError("decode round: queued rounds are not collected")
        self._last = None
        r, fn, masked, lp, picker = self._prepare(forward, tokens, positions, slots, page_table, picks, vocab)
        if masked:
            assert picker is not None
            out = self._replay_split(r, fn[0], fn[1], lambda: picker.write_masks_async(list(picks or ())))
        else:
            out = self._replay(r, fn[2])
        if not lp:
            return np.asarray(self.ops.to_numpy(out))
        picked_ids, values, ids = (np.asarray(self.ops.to_numpy(x)) for x in out)
        deliver_logprobs(list(picks or ()), picked_ids, values, ids)
        return picked_ids

    def _prepare(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                 slots: Sequence[int], page_table: np.ndarray, picks: Sequence[Pick] | None,
                 vocab: int) -> tuple[_Round, tuple[Callable[..., Any], ...], bool, bool, Any]:
        """The round's graph inputs written (syncs the stream) and its functions: (round,
        (forward, pick(logits), whole round), masked, logprobs, picker)."""
        from .device_pick import LOGPROBS_TOP, wants_logprobs

        table = np.asarray(page_table, dtype=np.int32)
        b = len(tokens)
        if not (b == len(positions) == len(slots) == table.shape[0]) or table.ndim != 2:
            raise ValueError(f"decode round: {b} tokens, {len(positions)} positions, {len(slots)} slots, "
                             f"page table {table.shape}")
        picked = picks is not None
        picker = self._device_picker(b, vocab) if picked else None   # before _round: it may drop graphs
        lp = picked and wants_logprobs(picks or ())
        masked = picked and any(p[3] is not None and p[3].matcher is not None for p in picks or ())
        r = self._round((b, table.shape[1], picked, lp, masked))
        host = np.concatenate([np.asarray(tokens, np.int32), np.asarray(positions, np.int32),
                               np.asarray(slots, np.int32), table.reshape(-1)])
        r.inputs.copy_from_numpy(host, self.stream)
        r.table_host = None                          # the mirror is rewritten by the next launch
        if picker is not None:
            picker.write(list(picks or ()), masks=not masked)

        def forward_() -> Any:
            return forward(r.ids, r.pos, r.slots, r.table)                   # [B, V]

        def pick_(logits: Any) -> Any:
            assert picker is not None
            out = self.ops.sample_pick(logits, vocab, picker.bufs, r.ids, r.pos)   # [B] int32
            if not lp:
                return out
            return (out, *self.ops.token_logprobs(logits, vocab, out, LOGPROBS_TOP))

        def whole() -> Any:
            return forward_() if picker is None else pick_(forward_())

        return r, (forward_, pick_, whole), masked, lp, picker

    # --- rounds queued ahead ---------------------------------------------------------------
    def launch(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int],
               page_table: np.ndarray, picks: Sequence[Pick], vocab: int) -> None:
        """Enqueue a picked round fed by the host (no logprobs, no grammar rows) and the copy of
        its picks into a ring slot; does not wait for it (collect does)."""
        if self._pending:
            raise RuntimeError("launch: queued rounds are not collected (launch_fed continues them)")
        if len(tokens) > RING_ROWS:
            raise ValueError(f"launch: {len(tokens)} rows, a queued round holds at most {RING_ROWS}")
        r, fn, masked, lp, _ = self._prepare(forward, tokens, positions, slots, page_table, picks, vocab)
        if masked or lp:
            raise ValueError("launch: rounds with grammar rows or logprobs run whole (run)")
        out = self._replay(r, fn[2])
        self._mirror(r, np.asarray(page_table, dtype=np.int32))
        self._last = r
        self._copy_back(out, len(tokens))

    def ahead_ready(self) -> bool:
        """launch_fed can continue the last launched round (its graph is captured)."""
        return self._last is not None and self._last.graph is not None and len(self._pending) < RING

    def launch_fed(self, page_table: np.ndarray) -> None:
        """Enqueue the last launched round again on what its pick fed back (the same rows, one
        token further; page_table [B, P]: their tables now, new entries copied async)."""
        from ..runtime._drv import check, driver

        r = self._last
        if r is None or r.graph is None or r.table_host is None or not self.ahead_ready():
            raise RuntimeError("launch_fed: no captured round to continue")
        table = np.asarray(page_table, dtype=np.int32)
        if table.shape != r.table_host.shape:
            raise ValueError(f"launch_fed: page table {table.shape} for a round of {r.table_host.shape}")
        changed = np.flatnonzero(table != r.table_host)
        if changed.size:
            lo, hi = int(changed[0]), int(changed[-1]) + 1
            r.table_host[...] = table
            mirror = r.table_pinned.array().view(np.int32)
            mirror[lo:hi] = table.reshape(-1)[lo:hi]
            check(driver().cuMemcpyHtoDAsync(r.table.ptr + 4 * lo, r.table_pinned.ptr + 4 * lo, 4 * (hi - lo),
                                             self.stream.cu))
        assert self._picker is not None
        self._picker.stepped(table.shape[0])
        self.scratch.reset()
        r.graph.replay()
        self._copy_back(r.out, table.shape[0])

    def collect(self) -> np.ndarray:
        """The picks [B] int32 of the oldest uncollected launch (waits for that round alone)."""
        if not self._pending:
            raise RuntimeError("collect: no round in flight")
        slot, b = self._pending.pop(0)
        self._events[slot].synchronize()
        return self._ring.array().view(np.int32)[slot * RING_ROWS : slot * RING_ROWS + b].copy()

    def discard(self) -> None:
        """Forget the uncollected launches (their rounds still run, in stream order; nothing
        reads their picks)."""
        self._pending.clear()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def _mirror(self, r: _Round, table: np.ndarray) -> None:
        """What the device's page table now holds, on the host and in pinned memory."""
        from ..runtime.pinned import PinnedBuffer

        if r.table_pinned is None:
            r.table_pinned = PinnedBuffer(max(4, table.nbytes))
        r.table_host = table.copy()
        r.table_pinned.array().view(np.int32)[: table.size] = table.reshape(-1)

    def _copy_back(self, out: Any, b: int) -> None:
        from ..runtime._drv import check, driver
        from ..runtime.events import Event
        from ..runtime.pinned import PinnedBuffer

        if self._ring is None:
            self._ring = PinnedBuffer(4 * RING * RING_ROWS)
            self._events = [Event(timing=False) for _ in range(RING)]
        slot = self._launches % RING
        self._launches += 1
        check(driver().cuMemcpyDtoHAsync(self._ring.ptr + 4 * slot * RING_ROWS, out.ptr, 4 * b, self.stream.cu))
        self._events[slot].record(self.stream)
        self._pending.append((slot, b))

    def _replay(self, r: _Round, fn: Callable[[], Any]) -> Any:
        from ..runtime.graph import CudaGraph

        self.scratch.reset()
        if not r.warmed:
            r.warmed = True
            return fn()
        if r.graph is None:
            graph = CudaGraph(self.stream)
            with self.ops.programmatic_launches(self.pdl):
                r.out = graph.capture(fn)
            r.graph = graph
        r.graph.replay()
        return r.out

    def _replay_split(self, r: _Round, forward: Callable[[], Any], pick: Callable[[Any], Any],
                      masks: Callable[[], None]) -> Any:
        """A round with grammar rows: the forward launched, the masks computed and uploaded while
        it runs, then the pick (eager, capture and replay as _replay, two graphs)."""
        from ..runtime.graph import CudaGraph

        self.scratch.reset()
        if not r.warmed:
            r.warmed = True
            logits = forward()
            masks()
            return pick(logits)
        if r.graph is None:
            fwd, pk = CudaGraph(self.stream), CudaGraph(self.stream)
            with self.ops.programmatic_launches(self.pdl):      # each graph's first kernel: a plain edge
                logits = fwd.capture(forward)
            with self.ops.programmatic_launches(self.pdl):
                r.out = pk.capture(lambda: pick(logits))
            r.graph, r.pick_graph = fwd, pk
        r.graph.replay()
        masks()
        r.pick_graph.replay()
        return r.out

    def time_rounds(self, b: int, picked: bool, replays: int = 16) -> float | None:
        """Device time (us) of the captured B-row round replayed back to back on its last
        inputs (each replay rewrites the caches at those positions); None if not captured."""
        from ..runtime.events import Event

        r = next((v for k, v in self._rounds.items() if k[0] == b and k[2] == picked and not k[3] and not k[4] and v.graph), None)
        if r is None:
            return None
        r.graph.replay()
        e0 = Event().record(self.stream)
        for _ in range(replays):
            r.graph.replay()
        e1 = Event().record(self.stream)
        return float(e0.elapsed_ms(e1) * 1e3 / replays)
