"""Token selection on the GPU (kernels/sampling.py): argmax, the decode graph's pick-and-feed,
penalties, token counts and the host-driven sampler."""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_nb.kernels import sampling as K_smp

from .launch import F32, CudaOpsBase, _need


class SamplingOps(CudaOpsBase):
    def argmax(self, logits: Any, threads: int = 1024) -> Any:
        out = self.empty((logits.shape[0],), np.int32)
        self._go(K_smp.argmax_kernel, logits.shape[0], threads, logits, out)
        return out

    def pick_feed(self, row: Any, temperature: Any, seed: Any, offset: Any, counter: Any, ids: Any,
                  pos: Any) -> Any:
        """The decode graph's next token from row [1, V] into out [1] int32, over ceil(V / 2048)
        blocks: the argmax (temperature[0] == 0; ties -> lower id) or a sample from
        softmax(row / T) by the Gumbel-max trick (kernels/sampling.py pick_feed_kernel); fed
        back for the next step: ids[0] = out[0], pos[0] += 1, offset[0] += 1 (ids, pos: the
        graph's [1] int32 inputs; temperature [1] fp32, seed / offset [1] int64). counter: [1]
        int32, zero, kept by the caller across steps (the kernel leaves it zero)."""
        _need(row.shape[0] == 1 and row.dtype == F32, "pick_feed: one fp32 row")
        blocks = -(-row.shape[1] // K_smp.PICK_SPAN)
        _need(0 < blocks <= K_smp.PICK_MAX_BLOCKS, f"pick_feed: {row.shape[1]} logits")
        part_v = self.empty((blocks,))                                   # [blocks] fp32
        part_i = self.empty((blocks,), np.int32)                         # [blocks]
        out = self.empty((1,), np.int32)
        self._go(K_smp.pick_feed_kernel, blocks, K_smp.PICK_THREADS, row, temperature, seed, offset,
                 part_v, part_i, counter, out, ids, pos)
        return out

    def apply_penalties(self, logits: Any, counts: Any, rep: Any, freq: Any, pres: Any) -> None:
        b, v = logits.shape
        self._go(K_smp.penalties_kernel, ((v + 255) // 256, b), 256, logits, counts, rep, freq, pres)

    def count_tokens(self, counts: Any, tokens: Any) -> None:
        self._go(K_smp.count_tokens_kernel, 1, max(32, tokens.shape[0]), counts, tokens)

    def sample(self, logits: Any, temperature: Any, top_k: Any, top_p: Any, min_p: Any, seeds: Any,
               offsets: Any, threads: int = 1024) -> Any:
        """Per-row parameters are device vectors [B]; offsets [B] int64 advance by one."""
        b, v = logits.shape
        probs = self.empty((b, v))                                       # [B, V] scratch
        out = self.empty((b,), np.int32)
        self._go(K_smp.sample_kernel, b, threads, logits, temperature, top_k, top_p, min_p, seeds, offsets,
                 probs, out)
        return out

