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
once (lanes) get poorer drafts from each other's rows, never other output. CPU backend (the tap reads hiddens back per forward;
on CUDA the decode graphs would need the tap captured). Knows nothing about requests.
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
    final-normed hiddens [T, H] and positions [T] to `sink`."""

    def __init__(self, decoder: Decoder, sink: "MTPProposer") -> None:
        super().__init__(decoder.cfg, decoder.weights)
        self.sink = sink

    def residual_stream(self, ops: Any, batch: "ForwardBatch", state: SequenceState) -> Any:
        x = super().residual_stream(ops, batch, state)
        hidden = ops.rms_norm(x, self.weights.norm, self.cfg.rms_norm_eps)       # [T, H]
        self.sink.record(np.asarray(batch.positions), np.asarray(hidden, dtype=np.float32))
        return x


class MTPProposer:
    def __init__(self, cfg: ModelConfig, decoder: Decoder, backend: "Backend", max_context: int,
                 valid_vocab: int) -> None:
        self.head = MTPHead(cfg, decoder.weights)
        self.ops = backend.ops
        self.valid_vocab = valid_vocab
        shape = (max_context, cfg.num_kv_heads, cfg.head_dim)
        self.cache = KVCache(k=backend.zeros(shape), v=backend.zeros(shape))      # the MTP's own KV
        self.hiddens = np.zeros((max_context, cfg.hidden_size), np.float32)       # h_t by position t
        self.tokens: list[int] = []        # the sequence the MTP cache rows were filled for
        self.filled = 0                    # MTP cache rows 0..filled-1 hold pairs of `tokens`

    def record(self, positions: np.ndarray, hidden: np.ndarray) -> None:
        """The target's final-normed hiddens [T, H] at positions [T] (HiddenTap)."""
        self.hiddens[positions] = hidden

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
        # pair i needs tokens[0..i+1] unchanged
        start, end = min(self.filled, max(lcp - 1, 0)), n - 1
        self.tokens = list(tokens)
        ops, head = self.ops, self.head
        ids = np.asarray(tokens[start + 1 : n], dtype=np.int64)                   # x_{i+1}
        hidden = head.hidden(ops, ids, self.hiddens[start:end], np.arange(start, end), self.cache)
        self.filled = end
        last = hidden[hidden.shape[0] - 1 :]                                      # [1, H]
        drafts: list[int] = []
        for j in range(k):
            drafts.append(int(np.argmax(np.asarray(head.logits(ops, last))[0, : self.valid_vocab])))
            if j + 1 < k:                  # (d_j, its draft hidden) at the next position
                last = head.hidden(ops, np.asarray(drafts[-1:], dtype=np.int64), last,
                                   np.array([end + j]), self.cache)
        return drafts


def mtp_drafting(cfg: ModelConfig, decoder: Decoder, backend: "Backend", max_context: int,
                 valid_vocab: int) -> tuple[Decoder, MTPProposer]:
    """(the decoder the generator must run: the target with its hidden tap, the proposer), or
    InvalidRequestError when the checkpoint has no MTP head or the backend cannot run it."""
    if decoder.weights.mtp is None:
        raise InvalidRequestError("spec mtp: this checkpoint has no MTP head (no mtp.* tensors)")
    if backend.decode_graphs:
        raise InvalidRequestError(f"spec mtp: runs on the CPU backend so far (not {backend.name}); "
                                  f"use spec ngram there")
    proposer = MTPProposer(cfg, decoder, backend, max_context, valid_vocab)
    return HiddenTap(decoder, proposer), proposer
