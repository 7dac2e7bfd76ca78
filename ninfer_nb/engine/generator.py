"""The one-sequence model runner: prefill in chunks with prefix reuse, then decode.

Holds the decoder, the backend, the caches (`SequenceState`: KV at the engine's maximum context,
GDN state in `StateSlots`) and the token ids whose effects are in them. Every model call gets a
`ForwardBatch` of the one sequence, which runs in GDN slot 0. With several requests at once
(engine/scheduler.py) each generator is a lane over one shared state: its GDN slots start at
`slot_base` and its KV rows are pages of the shared pool (`pages`, engine/kv_pages.py; every
model call reserves the pages it writes, OutOfPages when the pool has none); decode rounds of
several lanes go through the scheduler (`feed_row`), prefill chunks and verifies through the
lane. Prefix reuse: a new prompt
continues from the longest cached prefix. Attention caches can be cut anywhere; GDN state
cannot, so two more slots keep snapshots: at the start of the last turn and at the end of the
last prompt (where the next chat turn usually diverges). Speculative decoding: `verify` feeds
[last token, drafts] in one forward and `rollback` cuts the caches back to the accepted prefix.
With a ring of draft slots (one-sequence path, `draft_slots`) the verify's GDN op writes the
state after each of its tokens into ring slots, so a partial accept copies one slot back and
a full accept nothing; else a fourth slot keeps the state before the verify and the kept
tokens run again. Knows nothing about text, requests, sampling or stopping
(engine/llm_engine.py drives it).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..config import ModelConfig
from ..errors import ContextLengthExceededError
from ..models.decoder import Decoder
from ..models.state import PAGE_SIZE, KVCache, KVDtype, SequenceState, new_state
from .backends.base import Backend, Forward
from .batch import ForwardBatch
from .kv_pages import PageTable
from .pick import Pick, PickFilters
from .prefix_cache import Hit, PrefixCache
from .state_slots import StateSlots

RUNNING_SLOT = 0                   # the GDN slot the sequence runs in
TURN_SNAPSHOT, PROMPT_SNAPSHOT = 1, 2
VERIFY_SNAPSHOT = 3                # the state before a speculative verify (verify_slot=True)
DRAFT_RING = 4                     # the first slot of the per-token snapshot ring (draft_slots)
# Verifies write per-token snapshots where a ring exists (False: copy + re-run; set it before
# the first verify: a captured verify graph keeps the forward it was captured with).
SNAPSHOT_ROLLBACK = True


def lane_slots(verify_slot: bool, cached: bool = False, draft_slots: int = 0) -> int:
    """GDN slots one generator uses: running, two snapshots (+ the verify's, + the ring of
    draft_slots); with a prefix cache (its snapshots live in the cache's slots) running (+ the
    verify's)."""
    return (2 if verify_slot else 1) if cached else (DRAFT_RING + draft_slots if verify_slot else 3)


def draft_ring_size(max_draft: int) -> int:
    """Ring slots for verifies of up to max_draft drafts: one per verified token, and one
    holding the state before the verify (the previous round's last kept token)."""
    return max_draft + 2


def gdn_snapshots_run(backend: Backend, cfg: ModelConfig) -> bool:
    """The backend's gdn_decode writes per-token snapshots (snapshots=) for this model's GDN
    shapes (ops.gdn_snapshots_ok)."""
    return bool(backend.ops.gdn_snapshots_ok(cfg.linear_num_value_heads, cfg.linear_num_key_heads,
                                             cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                                             cfg.linear_conv_kernel_dim))


class OutOfPages(RuntimeError):
    """The KV page pool cannot hold the tokens a model call would write (the scheduler
    reserves pages first; this is its safety net)."""


@dataclass
class _Snapshot:
    """GDN slot `slot` holds the state after the first `length` tokens of the cached sequence
    (-1: nothing), and `logits` the logits after them when they were a whole prompt."""

    slot: int
    length: int = -1
    logits: np.ndarray | None = None

    def invalidate(self) -> None:
        self.length, self.logits = -1, None


@dataclass
class _Prefill:
    """A prompt being prefilled: the prefix lengths where chunks must end (a snapshot cut, then
    the prompt's end), or the logits when the whole prompt was cached."""

    prompt: list[int]
    cuts: list[int]
    cached: np.ndarray | None


class Generator:
    def __init__(self, cfg: ModelConfig, decoder: Decoder, backend: Backend, max_context: int,
                 prefill_chunk: int, use_graphs: bool = True, kv_dtype: KVDtype = "fp32",
                 verify_slot: bool = False, *, state: SequenceState | None = None, slot_base: int = 0,
                 pages: PageTable | None = None, cache: PrefixCache | None = None, draft_slots: int = 0,
                 ring_base: int | None = None) -> None:
        """`state` / `slot_base` / `pages`: a lane of a shared state (its GDN slots from
        slot_base, its KV in `pages` of the pool); None: a state of its own, contiguous KV.
        `cache` (paged lanes): the prefix cache the lane starts from (`adopt`) and feeds, in
        place of the lane's own snapshots (an idle lane then holds nothing). `draft_slots`
        (verify_slot): the per-token snapshot ring (draft_ring_size), in slots from `ring_base`
        (a shared state; a state of its own: after the lane's four); 0 or a backend whose GDN
        op cannot snapshot these shapes: copy and re-run."""
        self.cfg, self.decoder, self.backend = cfg, decoder, backend
        # Decode by graph replay where the backend has graphs (CUDA); eager otherwise.
        self.use_graphs = use_graphs and backend.decode_graphs and pages is None
        self.max_context = max_context
        self.prefill_chunk = max(1, prefill_chunk)
        self.state: SequenceState = state if state is not None else new_state(
            cfg, max_context, backend.zeros, kv_dtype,
            gdn_slots=lane_slots(verify_slot, draft_slots=draft_slots if state is None else 0))
        self.pages = pages
        self.cache = cache if pages is not None else None
        self.slots = StateSlots(self.state, backend)
        self.running_slot = slot_base + RUNNING_SLOT           # the GDN slot the sequence runs in
        self._verify_slot = (slot_base + (1 if self.cache is not None else VERIFY_SNAPSHOT)
                             if verify_slot else None)
        self.tokens: list[int] = []           # ids whose effects are in `state`
        self._fed_ahead = False               # decode_token(ahead=True) queued a step for tokens[-1]
        self._prefill: _Prefill | None = None
        self._has_gdn = self.slots.num_slots > 0
        self._snapshots = ([_Snapshot(slot_base + TURN_SNAPSHOT), _Snapshot(slot_base + PROMPT_SNAPSHOT)]
                           if self._has_gdn and self.cache is None else [])
        self._adopted_logits: np.ndarray | None = None   # the logits after an adopted whole prompt
        self._verify_start: int | None = None  # len(tokens) before the unsettled verify
        self._verify_vocab = 0                 # the unsettled verify's argmax vocabulary (0: rows)
        self._table: object = None             # a paged lane's page table as a device row [1, P]
        # the per-token snapshot ring: its slots, the slot [1] the verify runs in and the verify's
        # snapshot slots [ring] as device arrays (a captured verify reads them at replay)
        ring = (draft_slots if verify_slot and (state is None or ring_base is not None) and self._has_gdn
                and draft_slots >= 3 and gdn_snapshots_run(backend, cfg) else 0)
        first = slot_base + DRAFT_RING if ring_base is None else ring_base
        self._ring = list(range(first, first + ring))
        self._ring_dev = (backend.zeros((1,), np.int32), backend.zeros((ring,), np.int32)) if ring else None
        if self._ring_dev is not None:
            backend.load_(self._ring_dev[0], np.array([self.running_slot], np.int32))
        self._settled: tuple[int, int] | None = None    # (ring slot, n): it holds the state after tokens[:n]
        self._verify_snaps: list[int] | None = None     # the unsettled verify's snapshot slots
        self._loaded_snaps: list[int] = []               # what the snapshot device array holds
        self.last_forward_rows = 0      # tokens the last verify or rollback re-run fed (from the verify's start)

    # --- prefix reuse ------------------------------------------------------------------
    def _plan_reuse(self, prompt: list[int]) -> tuple[int, _Snapshot | None]:
        """The longest usable cached prefix of `prompt`: its length and the snapshot it comes
        from (None: the running state as it is, or nothing when the length is 0)."""
        lcp = 0
        limit = min(len(self.tokens), len(prompt))
        while lcp < limit and self.tokens[lcp] == prompt[lcp]:
            lcp += 1
        if not self._has_gdn:
            return min(lcp, len(prompt) - 1), None
        if 0 < lcp == len(self.tokens) < len(prompt):
            return lcp, None
        usable = [s for s in self._snapshots
                  if 0 < s.length <= lcp and (s.length < len(prompt) or s.logits is not None)]
        if usable:
            best = max(usable, key=lambda s: s.length)
            return best.length, best
        return 0, None

    def reusable(self, prompt: list[int]) -> int:
        """Prompt tokens start_prefill would serve from this generator's cache."""
        return self._plan_reuse(prompt)[0]

    def _reuse(self, prompt: list[int]) -> tuple[int, np.ndarray | None]:
        """Bring the state to the longest usable cached prefix of `prompt`. Returns its length
        and, when the whole prompt is cached, the logits after it."""
        length, snap = self._plan_reuse(prompt)
        if snap is not None:
            self.slots.restore(self.running_slot, snap.slot)
            return length, (snap.logits if length == len(prompt) else None)
        if self._has_gdn and length == 0:
            self.slots.reset(self.running_slot)
        return length, None

    def _take_snapshot(self, snap: _Snapshot, logits: np.ndarray | None) -> None:
        self.slots.snapshot(self.running_slot, snap.slot)
        snap.length, snap.logits = len(self.tokens), logits

    # --- steps -------------------------------------------------------------------------
    def _batch(self, ids: object, pos: object, all_logits: bool = False) -> ForwardBatch:
        table = None if self.pages is None else self._table
        return ForwardBatch.single(ids, pos, self.running_slot, all_logits, page_table=table)

    def reserve(self, tokens: int) -> None:
        """Hold KV pages for the first `tokens` positions (a paged lane; no-op otherwise); a
        shared page the next write lands in is copied first (the prefix cache holds it)."""
        if self.pages is None:
            return
        if self._write_page_shared() and not self.pages.copy_on_write(len(self.tokens) // PAGE_SIZE,
                                                                         self._copy_page):
            if not self.unshare_write_page():
                raise OutOfPages("no free KV page to copy a shared page into")
        if not self.pages.grow(tokens):
            raise OutOfPages(f"no free KV page for {tokens} tokens "
                             f"({self.pages.allocator.num_free} of {self.pages.allocator.num_pages} free)")

    def _load_table(self) -> None:
        """A paged lane's page table into its device row, before a model call (a captured
        verify reads the row at replay, so it must be the same buffer every call)."""
        if self.pages is None:
            return
        if self._table is None:
            self._table = self.backend.zeros((1, self.pages.row.shape[0]), np.int32)
        self.backend.load_(self._table, self.pages.row[None, :])

    def pages_needed(self, tokens: int) -> int:
        """Free pages `reserve(tokens)` would take (the copy of a shared page included)."""
        if self.pages is None:
            return 0
        return self.pages.missing(tokens) + int(self._write_page_shared())

    def unshare_write_page(self) -> bool:
        """The prefix cache gives up the shared page the next write lands in (no copy needed
        then); False when it cannot (it is not the cache's leaf, or not shared)."""
        if self.cache is None or not self._write_page_shared():
            return False
        assert self.pages is not None
        return self.cache.unshare(self.pages.pages[len(self.tokens) // PAGE_SIZE]) and not self._write_page_shared()

    def _write_page_shared(self) -> bool:
        p = len(self.tokens)
        return self.pages is not None and p % PAGE_SIZE != 0 and self.pages.shared(p // PAGE_SIZE)

    def _copy_page(self, dst: int, src: int) -> None:
        """Page `dst` := page `src` in every attention layer's pool."""
        d, s = dst * PAGE_SIZE, src * PAGE_SIZE
        for layer in self.state.layers:
            if isinstance(layer, KVCache):
                for buf in (layer.k, layer.v, layer.k_scale, layer.v_scale):
                    if buf is not None:
                        self.backend.copy_(buf[d : d + PAGE_SIZE], buf[s : s + PAGE_SIZE])

    # --- the prefix cache (paged lanes) --------------------------------------------------
    def adopt(self, prompt: list[int], hit: Hit) -> None:
        """Start from the cached prefix `hit` of `prompt` (the lane holds nothing before):
        its pages shared, its GDN state copied into the running slot."""
        self.forget()
        if hit.length == 0 or self.pages is None:
            return
        self.pages.adopt(hit.pages)
        self.tokens = list(prompt[: hit.length])
        if self._has_gdn and self.cache is not None:
            self.cache.restore(hit, self.running_slot)
        self._adopted_logits = hit.logits

    def _cache_insert(self, logits: np.ndarray | None = None) -> None:
        if self.cache is not None and self.pages is not None and self.tokens:
            self.cache.insert(self.tokens, self.pages.pages, self.running_slot if self._has_gdn else None,
                              logits)

    def retire(self) -> None:
        """The lane's request has gone: what its caches hold goes to the prefix cache (when the
        state is settled), then the lane lets everything go."""
        if self._verify_start is None and not self._fed_ahead:
            self._cache_insert()
        self.forget()

    def _eager(self, tokens: list[int], start: int, all_logits: bool = False) -> object:
        """One eager model call on `tokens` at positions start..; the backend's logits."""
        self.reserve(start + len(tokens))
        self._load_table()
        self.backend.begin_step()
        ids, pos = self.backend.ids(tokens, start)
        return self.decoder.forward(self.backend.ops, self._batch(ids, pos, all_logits), self.state)

    def start_prefill(self, prompt: list[int], snapshot_at: int | None = None) -> int:
        """Bring the caches to the longest usable cached prefix of `prompt` and plan the rest;
        returns the reused count. Then call prefill_step until it returns the logits.
        `snapshot_at`: a prefix length worth snapshotting too (where the next turn diverges)."""
        if len(prompt) >= self.max_context:
            raise ContextLengthExceededError(
                f"prompt has {len(prompt)} tokens; the context holds {self.max_context} "
                f"(including at least one generated token)"
            )
        self._fed_ahead = False                # a queued step's token is in `tokens`, like any other
        self._settled = None
        if self.cache is not None:
            return self._start_from_adopted(prompt, snapshot_at)
        start, cached = self._reuse(prompt)
        self.tokens = self.tokens[:start]
        cuts = [len(prompt)]
        if cached is None:
            for snap in self._snapshots:       # tokens past `start` are being replaced
                if snap.length > start:
                    snap.invalidate()
            if self._has_gdn and snapshot_at is not None and start < snapshot_at < len(prompt):
                cuts.insert(0, snapshot_at)
        if self.pages is not None:             # pages past what is still cached go back to the pool
            self.pages.truncate(max([start] + [s.length for s in self._snapshots]))
        self._prefill = _Prefill(prompt, cuts, cached)
        return start

    def _start_from_adopted(self, prompt: list[int], snapshot_at: int | None) -> int:
        """start_prefill of a lane over the prefix cache: it continues from what `adopt` gave."""
        start = len(self.tokens)
        if self.tokens != prompt[:start]:
            raise RuntimeError("start_prefill: the adopted prefix is not the prompt's")
        cached, self._adopted_logits = (self._adopted_logits if start == len(prompt) else None), None
        if start == 0 and self._has_gdn:
            self.slots.reset(self.running_slot)
        cuts = [len(prompt)]
        if snapshot_at is not None and start < snapshot_at < len(prompt):
            cuts.insert(0, snapshot_at)
        self._prefill = _Prefill(prompt, cuts, cached)
        return start

    def prefill_step(self) -> np.ndarray | None:
        """Run the next prefill chunk (up to prefill_chunk tokens, ending at a snapshot cut);
        the logits [V] after the prompt once all of it is in the caches, else None."""
        p = self._prefill
        if p is None:
            raise RuntimeError("prefill_step: no prefill was started")
        if p.cached is not None:
            self._prefill = None
            return p.cached
        end = p.cuts[0]
        c0 = len(self.tokens)
        chunk = p.prompt[c0 : min(c0 + self.prefill_chunk, end)]
        logits = self._eager(chunk, c0)
        self.tokens.extend(chunk)
        if len(self.tokens) < end:
            if len(self.tokens) % PAGE_SIZE == 0:   # a page-aligned chunk end: the cache keeps it
                self._cache_insert()
            return None
        p.cuts.pop(0)
        if p.cuts:                             # a snapshot cut inside the prompt
            if self.cache is not None:
                self._cache_insert()
            else:
                self._take_snapshot(self._snapshots[0], None)
            return None
        self._prefill = None
        last = np.array(self.backend.to_host(logits)[-1], dtype=np.float32)
        if self.cache is not None:
            self._cache_insert(last)
        elif self._has_gdn:
            self._take_snapshot(self._snapshots[1], last)
        return last

    def next_chunk_end(self) -> int:
        """Tokens in the caches after the next prefill_step (its pages are reserved first)."""
        p = self._prefill
        if p is None:
            raise RuntimeError("next_chunk_end: no prefill was started")
        if p.cached is not None:
            return len(self.tokens)
        return min(len(self.tokens) + self.prefill_chunk, p.cuts[0])

    def feed_row(self, token: int) -> int:
        """Take `token` as this lane's row of a decode round (the scheduler runs the forward):
        its position; pages reserved, the token counted as fed."""
        if self._prefill is not None or self._fed_ahead or self._verify_start is not None:
            raise RuntimeError("feed_row: a prefill, queued step or verify is in flight")
        position = len(self.tokens)
        if position >= self.max_context:
            raise ContextLengthExceededError(f"context of {self.max_context} tokens is full")
        self.reserve(position + 1)
        self.tokens.append(token)
        return position

    @property
    def prefilling(self) -> bool:
        """A prefill was started and has chunks left."""
        return self._prefill is not None

    def prefill(self, prompt: list[int], snapshot_at: int | None = None) -> tuple[np.ndarray, int]:
        """Run the whole prompt (reusing the cached prefix). Returns (last logits [V], reused count)."""
        start = self.start_prefill(prompt, snapshot_at)
        while (logits := self.prefill_step()) is None:
            pass
        return logits, start

    def picks_on_device(self, valid_vocab: int) -> bool:
        """decode_token can pick (argmax or sample) in the decode graph for this vocabulary."""
        return self.use_graphs and self.backend.token_pick_vocab == valid_vocab

    def decode_token(self, token: int, valid_vocab: int, *, ahead: bool = False, temperature: float = 0.0,
                     seed: int = 0, offset: int = 0, filters: PickFilters | None = None) -> int:
        """Feed one token; returns the next one, picked over ids < valid_vocab: the argmax
        (temperature 0; lowest id on ties, as np.argmax) or a sample from softmax(logits / T)
        by the Gumbel-max trick with noise from Philox(seed, (offset, id)) (kernels/sampling.py
        pick_feed_kernel). From the decode graph's own pick kernel when the backend captured
        one for this vocabulary (`token_pick_vocab`): 4 bytes come back, not the logits row.
        Else (CPU, no graphs) the argmax of `decode`'s logits; temperature > 0 needs the graph.
        filters: top-k / top-p / min-p, penalties, logit bias (engine/pick.py; the graph's
        sampler, kernels/sample_pick.py, applies them; they need the graph too).

        ahead=True (the caller will feed the returned token next unless it stops): the step
        that consumes the returned token is queued on the device before this one's token is
        read back, so the device runs step after step without waiting for the host. The
        caller's next call must then pass that token (its offset is the device's: one more).
        If the caller stops instead, the queued step still runs: the state then holds the
        returned token too (it is in `tokens`), a consistent state (the next prompt reuses it,
        or diverges before it)."""
        b = self.backend
        if self._prefill is not None:
            raise RuntimeError("decode_token: a prefill is still running")
        self._settled = None
        if not self.picks_on_device(valid_vocab):
            if temperature > 0.0 or filters is not None:
                raise RuntimeError("decode_token: sampling on the device needs the decode graph's pick")
            return int(np.argmax(self.decode(token)[:valid_vocab]))
        forward = self._forward_fn()
        if self._fed_ahead:                   # the last call queued the step consuming `token`
            self._fed_ahead = False
            if token != self.tokens[-1]:
                raise RuntimeError(f"decode_token: token {token} after a step that was queued for "
                                   f"{self.tokens[-1]}")
        else:
            if len(self.tokens) >= self.max_context:
                raise ContextLengthExceededError(f"context of {self.max_context} tokens is full")
            b.discard_tokens()
            b.launch_token_step(forward, token, len(self.tokens), Pick(temperature, seed, offset, filters))
            self.tokens.append(token)
        queued = ahead and b.graph_ready and len(self.tokens) < self.max_context
        if queued:
            b.launch_token_step(forward, None, len(self.tokens))
        nxt = b.collect_token()
        if queued:
            self.tokens.append(nxt)
            self._fed_ahead = True
        return nxt

    def _forward_fn(self, all_logits: bool = False) -> Forward:
        ops = self.backend.ops
        return lambda ids, pos: self.decoder.forward(ops, self._batch(ids, pos, all_logits), self.state)

    def decode(self, token: int) -> np.ndarray:
        """Feed one sampled token; returns the next logits [V]."""
        if self._prefill is not None:
            raise RuntimeError("decode: a prefill is still running")
        self._settled = None
        if self._fed_ahead:
            raise RuntimeError("decode: decode_token(ahead=True) already fed the last token")
        if len(self.tokens) >= self.max_context:
            raise ContextLengthExceededError(f"context of {self.max_context} tokens is full")
        position = len(self.tokens)
        self.reserve(position + 1)
        if self.use_graphs:
            logits = self.backend.decode_step(self._forward_fn(), token, position)
        else:
            logits = self.backend.to_host(self._eager([token], position))[-1]
        self.tokens.append(token)
        return logits

    # --- speculative verify ------------------------------------------------------------
    def verify(self, tokens: list[int], vocab: int = 0) -> np.ndarray:
        """Feed [last sampled token, d1..dK] in one forward at positions p..p+K (the backend's
        verify_step: a graph per K + 1 on CUDA); returns the logits at every one of them
        [K+1, V], or with vocab > 0 each row's argmax over ids < vocab [K+1] (greedy requests:
        K+1 ids come back, not the rows). `rollback` must follow before the next step."""
        if self._prefill is not None or self._fed_ahead:
            raise RuntimeError("verify: a prefill or a queued decode step is in flight")
        start = len(self.tokens)
        if start + len(tokens) > self.max_context:
            raise ContextLengthExceededError(f"context of {self.max_context} tokens is full")
        self.reserve(start + len(tokens))
        self._load_table()
        forward = self._forward_fn(all_logits=True)
        if self._snapshot_verify(len(tokens)):
            forward = self._ring_forward(len(tokens))
        elif self._has_gdn:
            if self._verify_slot is None:
                raise RuntimeError("verify: the generator was made without verify_slot")
            self.slots.snapshot(self.running_slot, self._verify_slot)
            self._settled = None
        out = self.backend.verify_step(forward, tokens, start, vocab)
        self.last_forward_rows = len(tokens)
        self.tokens.extend(tokens)
        self._verify_start, self._verify_vocab = start, vocab
        return out

    def _snapshot_verify(self, n: int) -> bool:
        """An n-token verify writes per-token snapshots into the ring (the same n always does:
        a captured graph is kept per n)."""
        return SNAPSHOT_ROLLBACK and 2 <= n <= len(self._ring) - 1

    def _ring_forward(self, n: int) -> Forward:
        """The n-token verify's forward with the state after token t also in ring slot snaps[t]:
        the ring slots other than the one holding the state before the verify (copied there
        first when none does), written to the device array the GDN op reads."""
        assert self._ring_dev is not None
        before = self._settled[0] if self._settled is not None and self._settled[1] == len(self.tokens) else None
        if before is None:
            before = self._ring[-1]
            self.slots.snapshot(self.running_slot, before)
        snaps = [s for s in self._ring if s != before][:n]
        if snaps != self._loaded_snaps[:n]:                  # the device array is read at replay
            self.backend.load_(self._ring_dev[1][:n], np.array(snaps, np.int32))
            self._loaded_snaps = snaps + self._loaded_snaps[n:]
        self._settled, self._verify_snaps = (before, len(self.tokens)), snaps
        ops, slot, snap = self.backend.ops, self._ring_dev[0], self._ring_dev[1][:n]
        return lambda ids, pos: self.decoder.forward(
            ops, replace(self._batch(ids, pos, True), slot_ids=(-1,), slots=slot, snapshots=snap), self.state)

    def rollback(self, keep: int) -> None:
        """Keep the first `keep` (>= 1) tokens of the last verify in the caches. Attention rows
        past them are stale but unread (attention reads rows up to each query's position, and
        the next step overwrites them). GDN state cannot be cut: a verify that wrote per-token
        snapshots gets the state after its keep-th token back from the ring (one slot copy; none
        when every token is kept). Rejecting every draft (keep 1), and verifies without the
        ring, restore the state from before the verify and run the kept tokens again through
        verify_step (a graph per count on CUDA): exact, reject-all leaves the state
        byte-identical to a plain step of the last token where that step's arithmetic is the
        one-token verify's, which the tests check."""
        start, self._verify_start = self._verify_start, None
        snaps, self._verify_snaps = self._verify_snaps, None
        if start is None:
            raise RuntimeError("rollback: no verify to settle")
        fed = self.tokens[start:]
        if not 1 <= keep <= len(fed):
            raise ValueError(f"rollback: keep {keep} of {len(fed)} verified tokens")
        if snaps is not None and keep == len(fed):
            self._settled = (snaps[keep - 1], len(self.tokens))
        if keep == len(fed):
            return
        del self.tokens[start + keep:]
        if not self._has_gdn:
            return
        if snaps is not None and keep > 1:
            self.slots.restore(self.running_slot, snaps[keep - 1])
            self._settled = (snaps[keep - 1], len(self.tokens))
            return
        if snaps is not None:
            assert self._settled is not None
            self.slots.restore(self.running_slot, self._settled[0])
        else:
            assert self._verify_slot is not None
            self.slots.restore(self.running_slot, self._verify_slot)
        self._settled = None
        self.backend.verify_step(self._forward_fn(all_logits=True), fed[:keep], start, self._verify_vocab)
        self.last_forward_rows = keep

    def logits_all(self, prompt: list[int]) -> np.ndarray:
        """Logits at every position of `prompt` ([T, V]), computed from an empty cache."""
        if len(prompt) > self.max_context:
            raise ContextLengthExceededError(
                f"{len(prompt)} tokens exceed the context of {self.max_context}")
        self.forget()
        if self._has_gdn:
            self.slots.reset(self.running_slot)
        out = []
        for c0 in range(0, len(prompt), self.prefill_chunk):
            chunk = prompt[c0 : c0 + self.prefill_chunk]
            out.append(self.backend.to_host(self._eager(chunk, c0, all_logits=True)))
            self.tokens.extend(chunk)
        return np.concatenate(out, axis=0)

    def forget(self) -> None:
        """Drop the cached prefix (after an error left the state half-written); a lane gives
        its KV pages back."""
        if self.pages is not None:
            self.pages.release()
        self.tokens = []
        self._fed_ahead = False
        self._prefill = None
        self._verify_start = None
        self._settled = self._verify_snaps = None
        self._adopted_logits = None
        for snap in self._snapshots:
            snap.invalidate()
