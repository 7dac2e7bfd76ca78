"""The Qwen3.5 / 3.6 MTP head's forward, written once against the `ops` interface.

For the pairs (x_{t+1}, h_t) at positions p_t (x_{t+1}: the token after position t, h_t: the
target's final-normed hidden at t):
    e = rmsnorm(embed(x_{t+1})) * w_e,  h = rmsnorm(h_t) * w_h     (zero-centred norms, +1 applied)
    u = fc [e | h]  = fc_e e + fc_h h
    u = decoder layer (gated full attention over the MTP's own KV cache at p_t, then MLP / MoE)
    draft hidden = rmsnorm(u) * w_norm;  draft logits = lm_head(draft hidden)   (the target's head)
The embedding and LM head are the target's. Filling the MTP cache over a prompt is one call
on its pairs; a draft step feeds (draft token, the previous draft hidden) at the next position.
Knows nothing about proposing, verifying or devices (engine/spec/mtp.py drives it).
"""
from __future__ import annotations

from typing import Any

from ..config import ModelConfig
from .layers import attention_block, mlp_block, moe_block
from .state import KVCache
from .weights import AttentionWeights, DenseWeight, LinearWeight, MLPWeights, ModelWeights, MTPWeights


class MTPHead:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights) -> None:
        if weights.mtp is None:
            raise ValueError("MTPHead: the model has no MTP weights")
        self.cfg = cfg
        self.w: MTPWeights = weights.mtp
        self.embed, self.lm_head = weights.embed, weights.lm_head

    def hidden(self, ops: Any, next_ids: Any, hidden: Any, positions: Any, cache: KVCache) -> Any:
        """next_ids [T] (x_{t+1}), hidden [T, H] (h_t), positions [T] (p_t) -> the draft
        hiddens [T, H] after the MTP's final norm; writes the MTP cache rows at `positions`."""
        w, eps = self.w, self.cfg.rms_norm_eps
        e = ops.rms_norm(ops.embedding(self.embed, next_ids), w.norm_embedding, eps)      # [T, H]
        h = ops.rms_norm(hidden, w.norm_hidden, eps)                                      # [T, H]
        x = ops.linear_add(h, w.fc_hidden, ops.linear(e, w.fc_embedding))                 # [T, H]
        layer = w.layer
        assert isinstance(layer.mixer, AttentionWeights)
        with ops.scope():
            attention_block(ops, self.cfg, layer.mixer, ops.normed(x, layer.input_norm, eps), positions,
                            cache, x)
            n = ops.normed(x, layer.post_norm, eps)
            if isinstance(layer.ffn, MLPWeights):
                mlp_block(ops, layer.ffn, n, x)
            else:
                moe_block(ops, layer.ffn, n, x)
        return ops.rms_norm(x, w.norm, eps)

    def logits(self, ops: Any, draft_hidden: Any, head: LinearWeight | None = None) -> Any:
        """draft hiddens [T, H] -> logits [T, V] through the target's LM head (or `head`: a
        shortlist of its rows, `shortlist_head`)."""
        return ops.linear(draft_hidden, self.lm_head if head is None else head)

    def shortlist_head(self, rows: int) -> LinearWeight:
        """The LM head's first `rows` rows (ids < rows: BPE vocabularies put the frequent tokens
        first), a view: the full head's read dominates a draft step's cost. A quantized head
        keeps all its rows."""
        h = self.lm_head
        if isinstance(h, DenseWeight) and 0 < rows < h.shape[0]:
            return DenseWeight(h.data[:rows], h.dtype)
        return h
