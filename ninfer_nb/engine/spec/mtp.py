"""MTP drafting: the checkpoint's own multi-token-prediction head proposes K tokens a round.

The head (models/mtp.py) reads the target's final-normed hidden h_t with the token after it:
`HiddenTap` is the target's decoder with a tap that keeps h_t of every position the target
runs (prefill chunks, verifies, plain steps, rollback re-runs) in a host array by position.
Each round `MTPProposer.propose(tokens, k)`:
1. catches the MTP cache up with the accepted sequence: pairs (tokens[i + 1], h_i) at
   positions i from the first row not yet filled for this sequence to len(tokens) - 2 (the
   whole prompt after a prefill, the kept tokens after a verify), in one forward; its last
   row's logits give d1;
2. chains: (d_j, the previous draft hidden) at the next position gives d_{j+1}, k - 1 times.
Draft rows past the accepted sequence are overwritten by the next catch-up, so the MTP cache
stays in step with the accepted tokens; a new prompt keeps the rows of its common prefix with
the last one. Drafts are greedy (argmax over the valid vocabulary); the verify's acceptance
rule keeps the output the target's. One head cache and hidden store: requests decoding at
once (lanes) get poorer drafts from each other's rows, never other output. On CUDA the head
runs eagerly between the verify graphs; a verify graph's hidden rows are read back after its
replay (`settle`, called by the engine after each round); a plain step's (decode graph) hidden
is not, so the next catch-up reads a stale row there (a worse draft, never other output).
Knows nothing about requests.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...config import ModelConfig
from ...errors import InvalidRequestError
from ...models.decoder import Decoder
from ...models.mtp import MTPHead
from ...models.state import KVCache, SequenceState

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..batch import ForwardBatch


class HiddenTap(Decoder):
    """The target decoder, unchanged in its results, that also hands every forward's
    final-normed hiddens [T, H] and positions [T] to `sink` (MTPProposer.tapped)."""

    def __init__(self, decoder: Decoder, sink: "MTPProposer") -> None:
        super().__init__(decoder.cfg, decoder.weights)
        self.sink = sink

    def residual_stream(self, ops: Any, batch: "ForwardBatch", state: SequenceState) -> Any:
        x = super().residual_stream(ops, batch, state)
        hidden = ops.rms_norm(x, self.weights.norm, self.cfg.rms_norm_eps)       # [T, H]
        self.sink.tapped(batch.positions, hidden, batch.all_logits)
        return x


class MTPProposer:
    def __init__(self, cfg: ModelConfig, decoder: Decoder, backend: "Backend", max_context: int,
                 valid_vocab: int) -> None:
        self.head = MTPHead(cfg, decoder.weights)
        self.backend, self.ops = backend, backend.ops
        self.valid_vocab = valid_vocab
        self._shortlist: tuple[int, Any] | None = None   # (rows, head view), set_draft_vocab
        shape = (max_context, cfg.num_kv_heads, cfg.head_dim)
        self.cache = KVCache(k=backend.zeros(shape), v=backend.zeros(shape))      # the MTP's own KV
        self.hiddens = np.zeros((max_context, cfg.hidden_size), np.float32)       # h_t by position t
        self.tokens: list[int] = []        # the sequence the MTP cache rows were filled for
        self.filled = 0                    # MTP cache rows 0..filled-1 hold pairs of `tokens`
        # CUDA graphs: the hidden rows each captured forward writes, by (rows, all_logits): the
        # replays of a verify round (or its rollback) rewrite them; `settle` reads them back
        self._graph_rows: dict[tuple[int, bool], Any] = {}
        self._last_eager: tuple[int, int] | None = None   # positions [a, b) of the last eager tap

    def set_draft_vocab(self, rows: int | None) -> None:
        """Draft over ids < rows only (a shortlist of the LM head's first rows; None: all ids)."""
        self._shortlist = None if rows is None else (rows, self.head.shortlist_head(rows))

    def tapped(self, positions: Any, hidden: Any, all_logits: bool) -> None:
        """A target forward's final-normed hiddens [T, H] at positions [T] (HiddenTap). Eager:
        kept by position now. Under CUDA graph capture: the captured buffer is remembered
        (nothing can be read back during a capture)."""
        n = int(hidden.shape[0])
        if self._capturing():
            self._graph_rows[(n, bool(all_logits))] = hidden
            return
        pos = getattr(positions, "host", None)
        pos = np.asarray(self.backend.to_host(positions) if pos is None else pos, dtype=np.int64)
        self.hiddens[pos] = np.asarray(self.backend.to_host(hidden), dtype=np.float32)
        self._last_eager = (int(pos[0]), int(pos[-1]) + 1)

    def _capturing(self) -> bool:
        if not self.backend.decode_graphs:
            return False
        from ...runtime._drv import check, driver

        status = check(driver().cuStreamIsCapturing(self.backend.stream.cu))   # type: ignore[attr-defined]
        return int(status) != 0

    def settle(self, start: int, keep: int, ran: int | None = None) -> None:
        """After a verify round that left `keep` tokens at positions start.. in the caches: the
        last target forward ran `ran` (None: keep) tokens from start, the kept ones first (the
        verify, or the rollback's re-run; Generator.last_forward_rows). If it was a graph
        replay, read its hidden rows of the kept tokens back now (before the next step reuses
        the scratch memory)."""
        ran = keep if ran is None else ran
        if self._last_eager == (start, start + ran):
            self._last_eager = None                     # an eager forward: tapped already
            return
        rows = self._graph_rows.get((ran, True))
        if rows is not None:
            host = np.asarray(self.backend.to_host(rows), dtype=np.float32)
            self.hiddens[start : start + keep] = host[:keep]

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k greedy MTP drafts to follow `tokens` (prompt + output, every token but the
        last already run through the target)."""
        n = len(tokens)
        if k <= 0 or n < 2:
            return []
        lcp = 0
        limit = min(len(self.tokens), n)
        while lcp < limit and self.tokens[lcp] == tokens[lcp]:
            lcp += 1
        # pair i needs tokens[0..i+1] unchanged; the last pair always runs (its output drafts d1)
        end = n - 1
        start = min(self.filled, max(lcp - 1, 0), end - 1)
        self.tokens = list(tokens)
        b, ops, head = self.backend, self.ops, self.head
        b.begin_step()
        ids, pos = b.ids(tokens[start + 1 : n], start)                            # x_{i+1}, positions i
        hidden = head.hidden(ops, ids, self._array(self.hiddens[start:end]), pos, self.cache)
        self.filled = end
        last = hidden[hidden.shape[0] - 1 :]                                      # [1, H]
        drafts: list[int] = []
        vocab, shortlist = (self.valid_vocab, None) if self._shortlist is None else self._shortlist
        for j in range(k):
            row = np.asarray(b.to_host(head.logits(ops, last, shortlist)), dtype=np.float32).reshape(-1)
            drafts.append(int(np.argmax(row[: min(vocab, self.valid_vocab)])))
            if j + 1 < k:                  # (d_j, its draft hidden) at the next position
                ids, pos = b.ids(drafts[-1:], end + j)
                last = head.hidden(ops, ids, last, pos, self.cache)
        return drafts

    def _array(self, x: np.ndarray) -> Any:
        """A host array as the backend's (a scratch copy on CUDA)."""
        if self.backend.decode_graphs:
            return self.ops.from_numpy(np.ascontiguousarray(x), persistent=False)
        return x


def mtp_drafting(cfg: ModelConfig, decoder: Decoder, backend: "Backend", max_context: int,
                 valid_vocab: int) -> tuple[Decoder, MTPProposer]:
    """(the decoder the generator must run: the target with its hidden tap, the proposer), or
    InvalidRequestError when the checkpoint has no MTP head."""
    if decoder.weights.mtp is None:
        raise InvalidRequestError("spec mtp: this checkpoint has no MTP head (no mtp.* tensors)")
    proposer = MTPProposer(cfg, decoder, backend, max_context, valid_vocab)
    return HiddenTap(decoder, proposer), proposer
