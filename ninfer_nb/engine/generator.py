"""The single-sequence model runner: prefill in chunks with prefix reuse, then decode.

Holds the decoder, the backend, the caches (`SequenceState`: KV at the engine's maximum context,
GDN state in `StateSlots`) and the token ids whose effects are in them. Every model call gets a
`ForwardBatch` of the one sequence, which runs in GDN slot 0. Prefix reuse: a new prompt
continues from the longest cached prefix. Attention caches can be cut anywhere; GDN state
cannot, so two more slots keep snapshots: at the start of the last turn and at the end of the
last prompt (where the next chat turn usually diverges). Speculative decoding: `verify` feeds
[last token, drafts] in one forward and `rollback` cuts the caches back to the accepted prefix
(a fourth slot keeps the state before the verify). Knows nothing about text, requests,
sampling or stopping (engine/llm_engine.py drives it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..errors import ContextLengthExceededError
from ..models.decoder import Decoder
from ..models.state import KVDtype, SequenceState, new_state
from .backends.base import Backend, Forward
from .batch import ForwardBatch
from .state_slots import StateSlots

RUNNING_SLOT = 0                   # the GDN slot the sequence runs in
TURN_SNAPSHOT, PROMPT_SNAPSHOT = 1, 2
VERIFY_SNAPSHOT = 3                # the state before a speculative verify (verify_slot=True)


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
                 verify_slot: bool = False) -> None:
        self.cfg, self.decoder, self.backend = cfg, decoder, backend
        # Decode by graph replay where the backend has graphs (CUDA); eager otherwise.
        self.use_graphs = use_graphs and backend.decode_graphs
        self.max_context = max_context
        self.prefill_chunk = max(1, prefill_chunk)
        self.state: SequenceState = new_state(cfg, max_context, backend.zeros, kv_dtype,
                                               gdn_slots=4 if verify_slot else 3)
        self.slots = StateSlots(self.state, backend)
        self.tokens: list[int] = []           # ids whose effects are in `state`
        self._fed_ahead = False               # decode_token(ahead=True) queued a step for tokens[-1]
        self._prefill: _Prefill | None = None
        self._has_gdn = self.slots.num_slots > 0
        self._snapshots = [_Snapshot(TURN_SNAPSHOT), _Snapshot(PROMPT_SNAPSHOT)] if self._has_gdn else []
        self._verify_start: int | None = None  # len(tokens) before the unsettled verify

    # --- prefix reuse ------------------------------------------------------------------
    def _reuse(self, prompt: list[int]) -> tuple[int, np.ndarray | None]:
        """Bring the state to the longest usable cached prefix of `prompt`. Returns its length
        and, when the whole prompt is cached, the logits after it."""
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
            self.slots.restore(RUNNING_SLOT, best.slot)
            return best.length, (best.logits if best.length == len(prompt) else None)
        self.slots.reset(RUNNING_SLOT)
        return 0, None

    def _take_snapshot(self, snap: _Snapshot, logits: np.ndarray | None) -> None:
        self.slots.snapshot(RUNNING_SLOT, snap.slot)
        snap.length, snap.logits = len(self.tokens), logits

    # --- steps -------------------------------------------------------------------------
    def _batch(self, ids: object, pos: object, all_logits: bool = False) -> ForwardBatch:
        return ForwardBatch.single(ids, pos, RUNNING_SLOT, all_logits)

    def _eager(self, tokens: list[int], start: int, all_logits: bool = False) -> object:
        """One eager model call on `tokens` at positions start..; the backend's logits."""
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
        start, cached = self._reuse(prompt)
        self.tokens = self.tokens[:start]
        cuts = [len(prompt)]
        if cached is None:
            for snap in self._snapshots:       # tokens past `start` are being replaced
                if snap.length > start:
                    snap.invalidate()
            if self._has_gdn and snapshot_at is not None and start < snapshot_at < len(prompt):
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
            return None
        p.cuts.pop(0)
        if p.cuts:                             # a snapshot cut inside the prompt
            self._take_snapshot(self._snapshots[0], None)
            return None
        self._prefill = None
        last = np.array(self.backend.to_host(logits)[-1], dtype=np.float32)
        if self._has_gdn:
            self._take_snapshot(self._snapshots[1], last)
        return last

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
                     seed: int = 0, offset: int = 0) -> int:
        """Feed one token; returns the next one, picked over ids < valid_vocab: the argmax
        (temperature 0; lowest id on ties, as np.argmax) or a sample from softmax(logits / T)
        by the Gumbel-max trick with noise from Philox(seed, (offset, id)) (kernels/sampling.py
        pick_feed_kernel). From the decode graph's own pick kernel when the backend captured
        one for this vocabulary (`token_pick_vocab`): 4 bytes come back, not the logits row.
        Else (CPU, no graphs) the argmax of `decode`'s logits; temperature > 0 needs the graph.

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
        if not self.picks_on_device(valid_vocab):
            if temperature > 0.0:
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
            b.launch_token_step(forward, token, len(self.tokens), (temperature, seed, offset))
            self.tokens.append(token)
        queued = ahead and b.graph_ready and len(self.tokens) < self.max_context
        if queued:
            b.launch_token_step(forward, None, len(self.tokens))
        nxt = b.collect_token()
        if queued:
            self.tokens.append(nxt)
            self._fed_ahead = True
        return nxt

    def _forward_fn(self) -> Forward:
        ops = self.backend.ops
        return lambda ids, pos: self.decoder.forward(ops, self._batch(ids, pos), self.state)

    def decode(self, token: int) -> np.ndarray:
        """Feed one sampled token; returns the next logits [V]."""
        if self._prefill is not None:
            raise RuntimeError("decode: a prefill is still running")
        if self._fed_ahead:
            raise RuntimeError("decode: decode_token(ahead=True) already fed the last token")
        if len(self.tokens) >= self.max_context:
            raise ContextLengthExceededError(f"context of {self.max_context} tokens is full")
        position = len(self.tokens)
        if self.use_graphs:
            logits = self.backend.decode_step(self._forward_fn(), token, position)
        else:
            logits = self.backend.to_host(self._eager([token], position))[-1]
        self.tokens.append(token)
        return logits

    # --- speculative verify ------------------------------------------------------------
    def verify(self, tokens: list[int]) -> np.ndarray:
        """Feed [last sampled token, d1..dK] in one eager forward at positions p..p+K; returns
        the logits at every one of them [K+1, V]. `rollback` must follow before the next step."""
        if self._prefill is not None or self._fed_ahead:
            raise RuntimeError("verify: a prefill or a queued decode step is in flight")
        start = len(self.tokens)
        if start + len(tokens) > self.max_context:
            raise ContextLengthExceededError(f"context of {self.max_context} tokens is full")
        if self._has_gdn:
            if self.slots.num_slots <= VERIFY_SNAPSHOT:
                raise RuntimeError("verify: the generator was made without verify_slot")
            self.slots.snapshot(RUNNING_SLOT, VERIFY_SNAPSHOT)
        rows = np.asarray(self.backend.to_host(self._eager(tokens, start, all_logits=True)), dtype=np.float32)
        self.tokens.extend(tokens)
        self._verify_start = start
        return rows

    def rollback(self, keep: int) -> None:
        """Keep the first `keep` (>= 1) tokens of the last verify in the caches. Attention rows
        past them are stale but unread (attention reads rows up to each query's position, and
        the next step overwrites them). GDN state cannot be cut: it is restored from before the
        verify and the kept tokens are run again (exact; per-position state in the kernels
        would save this forward)."""
        start, self._verify_start = self._verify_start, None
        if start is None:
            raise RuntimeError("rollback: no verify to settle")
        fed = self.tokens[start:]
        if not 1 <= keep <= len(fed):
            raise ValueError(f"rollback: keep {keep} of {len(fed)} verified tokens")
        if keep == len(fed):
            return
        del self.tokens[start + keep:]
        if self._has_gdn:
            self.slots.restore(RUNNING_SLOT, VERIFY_SNAPSHOT)
            self._eager(fed[:keep], start)

    def logits_all(self, prompt: list[int]) -> np.ndarray:
        """Logits at every position of `prompt` ([T, V]), computed from an empty cache."""
        if len(prompt) > self.max_context:
            raise ContextLengthExceededError(
                f"{len(prompt)} tokens exceed the context of {self.max_context}")
        self.forget()
        if self._has_gdn:
            self.slots.reset(RUNNING_SLOT)
        out = []
        for c0 in range(0, len(prompt), self.prefill_chunk):
            chunk = prompt[c0 : c0 + self.prefill_chunk]
            out.append(self.backend.to_host(self._eager(chunk, c0, all_logits=True)))
            self.tokens.extend(chunk)
        return np.concatenate(out, axis=0)

    def forget(self) -> None:
        """Drop the cached prefix (after an error left the state half-written)."""
        self.tokens = []
        self._fed_ahead = False
        self._prefill = None
        self._verify_start = None
        for snap in self._snapshots:
            snap.invalidate()
