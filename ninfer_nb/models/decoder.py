"""The decoder stack: embed -> blocks (mixer + FFN, pre-norm residual) -> norm -> lm_head.

Shared by every architecture; what differs lives in the weights each architecture module
builds. `forward` runs one chunk of tokens of one sequence through its caches. Knows nothing
about tokenizers, sampling or devices beyond the `ops` object it is handed.
"""
from __future__ import annotations

from typing import Any

from ..config import ModelConfig
from .layers import attention_block, gdn_block, mlp_block, moe_block
from .state import GDNState, KVCache, SequenceState
from .weights import AttentionWeights, MLPWeights, ModelWeights

# Prefill chunks at least this long use the chunked gated-delta-rule form.
CHUNKED_GDN_MIN_TOKENS = 16


class Decoder:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights) -> None:
        self.cfg = cfg
        self.weights = weights

    def hidden(self, ops: Any, ids: Any, positions: Any, state: SequenceState) -> Any:
        """ids, positions [T] -> final-normed hidden states [T, H]; advances the caches.
        Each residual add is fused with the norm that follows it (add_rms_norm). The residual
        stream x and the normed input h live across the layers; everything a layer allocates
        besides them is handed back when it ends (ops.scope), so a long prefill chunk needs
        one layer's temporaries, not all of them."""
        cfg, w = self.cfg, self.weights
        eps = cfg.rms_norm_eps
        x = ops.embedding(w.embed, ids)
        chunked = ids.shape[0] >= CHUNKED_GDN_MIN_TOKENS
        h = ops.rms_norm(x, w.layers[0].input_norm, eps)
        for i, (lw, cache) in enumerate(zip(w.layers, state.layers)):
            next_norm = w.layers[i + 1].input_norm if i + 1 < len(w.layers) else w.norm
            with ops.scope():
                if isinstance(lw.mixer, AttentionWeights):
                    assert isinstance(cache, KVCache)
                    y = attention_block(ops, cfg, lw.mixer, h, positions, cache)
                else:
                    assert isinstance(cache, GDNState)
                    y = gdn_block(ops, cfg, lw.mixer, h, cache, chunked)
                y, x_mid = ops.add_rms_norm(y, x, lw.post_norm, eps)
                y = mlp_block(ops, lw.ffn, y) if isinstance(lw.ffn, MLPWeights) else moe_block(ops, lw.ffn, y)
                h, x = ops.add_rms_norm(y, x_mid, next_norm, eps, out=(h, x))   # into the kept buffers
        return h

    def logits(self, ops: Any, hidden: Any) -> Any:
        """hidden [T, H] -> logits [T, V]."""
        return ops.linear(hidden, self.weights.lm_head)

    def forward(self, ops: Any, ids: Any, positions: Any, state: SequenceState,
                all_logits: bool = False) -> Any:
        """Logits for every position ([T, V]) or only the last one ([1, V])."""
        h = self.hidden(ops, ids, positions, state)
        if not all_logits:
            h = h[h.shape[0] - 1 :]
        return self.logits(ops, h)
