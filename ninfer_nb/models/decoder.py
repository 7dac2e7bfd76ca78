"""The decoder stack: embed -> blocks (mixer + FFN, pre-norm residual) -> norm -> lm_head.

Shared by every architecture; what differs lives in the weights each architecture module
builds. `forward` runs a `ForwardBatch` (engine/batch.py: tokens, positions, each sequence's
GDN slot and KV page table) through the caches. Knows nothing about tokenizers, sampling or devices beyond the
`ops` object it is handed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import ModelConfig
from .layers import attention_block, gdn_block, mlp_block, moe_block
from .state import GDNSlots, KVCache, SequenceState

if TYPE_CHECKING:
    from ..engine.batch import ForwardBatch
from .weights import AttentionWeights, MLPWeights, ModelWeights

# Prefill chunks at least this long use the chunked gated-delta-rule form.
CHUNKED_GDN_MIN_TOKENS = 16


class Decoder:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights) -> None:
        self.cfg = cfg
        self.weights = weights

    def residual_stream(self, ops: Any, batch: "ForwardBatch", state: SequenceState) -> Any:
        """batch (ids, positions [T]) -> the residual stream after the last block [T, H] (before the
        final norm); advances the caches. The stream x is one buffer that each block's output
        projection adds into in place (ops.linear_add, moe_experts(residual=)); each block reads
        ops.normed(x), which one decode token's consumers compute inside their own kernels
        (the CUDA backend's Normed) and a prefill chunk gets as a normed copy. Everything a
        layer allocates besides x is handed back when it ends (ops.scope), so a long prefill
        chunk needs one layer's temporaries, not all of them."""
        cfg, w = self.cfg, self.weights
        eps = cfg.rms_norm_eps
        # a decode round names its GDN slots in a backend array; a prefill chunk, its one slot
        slots = batch.slots
        slot = batch.only_slot() if slots is None else -1
        positions, page_table = batch.positions, batch.page_table
        x = ops.embedding(w.embed, batch.token_ids)                     # [T, H], updated in place
        chunked = batch.num_seqs == 1 and batch.num_tokens >= CHUNKED_GDN_MIN_TOKENS
        for lw, cache in zip(w.layers, state.layers):
            with ops.scope():
                h = ops.normed(x, lw.input_norm, eps)
                if isinstance(lw.mixer, AttentionWeights):
                    assert isinstance(cache, KVCache)
                    attention_block(ops, cfg, lw.mixer, h, positions, cache, x, page_table)
                else:
                    assert isinstance(cache, GDNSlots)
                    gdn_block(ops, cfg, lw.mixer, h, cache if slots is not None else cache.slot(slot),
                              chunked, x, slots, batch.snapshots)
                h = ops.normed(x, lw.post_norm, eps)
                if isinstance(lw.ffn, MLPWeights):
                    mlp_block(ops, lw.ffn, h, x)
                else:
                    moe_block(ops, lw.ffn, h, x)
        return x

    def hidden(self, ops: Any, batch: "ForwardBatch", state: SequenceState) -> Any:
        """batch -> final-normed hidden states [T, H]; advances the caches."""
        x = self.residual_stream(ops, batch, state)
        return ops.rms_norm(x, self.weights.norm, self.cfg.rms_norm_eps)

    def logits(self, ops: Any, hidden: Any) -> Any:
        """hidden [T, H] -> logits [T, V]."""
        return ops.linear(hidden, self.weights.lm_head)

    def forward(self, ops: Any, batch: "ForwardBatch", state: SequenceState) -> Any:
        """Logits for every position ([T, V], batch.all_logits) or only the last one ([1, V])."""
        x = self.residual_stream(ops, batch, state)
        if not batch.all_logits:
            x = x[x.shape[0] - 1 :]
        return self.logits(ops, ops.normed(x, self.weights.norm, self.cfg.rms_norm_eps))
