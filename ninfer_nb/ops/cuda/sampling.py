"""Token selection on the GPU (kernels/sampling.py): argmax, the decode graph's pick-and-feed,
penalties, token counts and the host-driven sampler; the decode graph's sampler over B rows
(kernels/sample_pick.py: `sample_pick` and the device buffers it reads, `SamplePickBuffers`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_nb.kernels import logprobs as K_lp
from ninfer_nb.kernels import sample_pick as K_sp
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


    def sample_pick(self, logits: Any, vocab: int, bufs: "SamplePickBuffers", ids: Any, pos: Any) -> Any:
        """The next token of each row of logits [B, >= vocab] over ids < vocab, sampled with
        each row's parameters in `bufs` (kernels/sample_pick.py: a grammar's bitmask,
        temperature, top-k, top-p, min-p, penalties, logit bias, seed; the host sampler's semantics, exactly), into out
        [B] int32 and fed back: ids[b] = out[b], pos[b] += 1 ([B] int32, the graph's inputs),
        the row's offset + 1 and its token counted. Six kernels, no host sync (graph-safe)."""
        b = logits.shape[0]
        _need(logits.dtype == F32 and logits.ndim == 2 and logits.shape[1] >= vocab, "sample_pick: fp32 [B, >= vocab]")
        _need(b <= bufs.rows and vocab == bufs.vocab, f"sample_pick: {b} rows of {vocab} for buffers of "
              f"{bufs.rows} x {bufs.vocab}")
        n = np.int32(vocab)
        span = self._pick_threads * K_sp.PICK_PER
        grid = (-(-vocab // span), b)
        t = self._pick_threads
        zrow = self.empty((b, vocab))                                    # [B, vocab] fp32
        out = self.empty((b,), np.int32)
        fpar, ipar, hist, zmax, best = bufs.fpar[:b], bufs.ipar[:b], bufs.hist[:b], bufs.zmax[:b], bufs.best[:b]
        self._go(K_sp.pick_prep_kernel, grid, t, logits, n, fpar, ipar, bufs.bias_ids[:b], bufs.bias_val[:b],
                 bufs.mask[:b], bufs.counts, zrow, zmax, hist, best)
        self._go(K_sp.pick_hist_kernel, grid, t, zrow, n, fpar, ipar, zmax, hist, bufs.plan[:b], bufs.arrived[:b])
        self._go(K_sp.pick_gather_kernel, grid, t, zrow, n, fpar, ipar, zmax, bufs.plan[:b], bufs.cand[:b],
                 bufs.cand_n[:b])
        self._go(K_sp.pick_select_kernel, b, self._select_threads, zrow, n, fpar, ipar, zmax, bufs.plan[:b], bufs.cand[:b],
                 bufs.cand_n[:b], bufs.sel[:b], best)
        self._go(K_sp.pick_full_kernel, grid, t, zrow, n, fpar, ipar, zmax, bufs.sel[:b], best)
        self._go(K_sp.pick_finish_kernel, -(-b // 128), 128, best, ipar, bufs.counts, zmax,
                 bufs.cand_n[:b], out, ids, pos)
        return out

    def token_logprobs(self, logits: Any, vocab: int, tokens: Any, n_top: int) -> tuple[Any, Any]:
        """Each row's token's logprob and its n_top (<= 20) most likely alternatives under the
        raw logits [B, >= vocab] (kernels/logprobs.py; tokens [B] int32): out [B, 1 + n_top]
        fp32 (the token's, then the top ones', most likely first) and ids [B, max(n_top, 1)]
        int32. Two kernels, no host sync (graph-safe)."""
        b = logits.shape[0]
        t = self._lp_threads
        g = -(-vocab // (t * K_lp.LP_PER))
        _need(g <= K_lp.MAX_BLOCKS and 0 <= n_top <= K_lp.MAX_TOP, f"token_logprobs: {vocab} ids, top {n_top}")
        part = self.empty((b, 2 * g))                                    # [B, 2 G] block max, sum
        cand = self.empty((b, g * K_lp.MAX_TOP), np.uint64)              # [B, G * MAX_TOP]
        out = self.empty((b, 1 + n_top))
        ids = self.empty((b, max(n_top, 1)), np.int32)
        self._go(K_lp.logprob_partial_kernel, (g, b), t, logits, np.int32(vocab), np.int32(n_top), part, cand)
        self._go(K_lp.logprob_final_kernel, b, t, logits, np.int32(vocab), tokens, np.int32(n_top), np.int32(g),
                 part, cand, out, ids)
        return out, ids

    # threads of the sampler's kernels (the simulator runs every thread in Python: tests shrink them)
    _pick_threads = K_sp.PICK_THREADS
    _select_threads = K_sp.SELECT_THREADS
    _lp_threads = K_lp.LP_THREADS


class SamplePickBuffers:
    """The device state `sample_pick` reads for `rows` rows over `vocab` ids: the parameters
    (written by the host before a replay: `set_row`), the token counts, the step's work
    buffers (zeroed by the kernels themselves). Allocated once, so a captured graph keeps them."""

    def __init__(self, ops: Any, rows: int, vocab: int, max_bias: int = 300) -> None:
        _need(0 < vocab <= K_sp.MAX_VOCAB, f"sample_pick: vocabulary of {vocab}")
        self.ops, self.rows, self.vocab, self.max_bias = ops, rows, vocab, max_bias

        def z(shape: tuple[int, ...], dtype: Any) -> Any:
            return ops.zeros(shape, dtype, persistent=True)

        self.fpar = z((rows, K_sp.NF), np.float32)         # [B, NF] temperature, top-p, min-p, penalties
        self.ipar = z((rows, K_sp.NI), np.int64)           # [B, NI] top-k, seed, offset, bias entries, counts row
        self.bias_ids = z((rows, max_bias), np.int32)      # [B, max_bias]
        self.bias_val = z((rows, max_bias), np.float32)
        self.counts = z((rows, vocab), np.int32)           # [B, V] generated count | PROMPT_BIT
        self.words = -(-vocab // 32)
        self.mask = z((rows, self.words), np.int32)        # [B, ceil(V / 32)] a grammar's allowed ids
        self._pinned: Any = None                           # put_mask_async's staging
        self.zmax = z((rows,), np.uint64)
        self.hist = z((rows, 2 * K_sp.NB), np.uint64)
        self.plan = z((rows, 4), np.uint64)
        self.arrived = z((rows,), np.int32)                # the histogram's block counter (kept 0)
        self.cand = z((rows, K_sp.CAP), np.uint64)
        self.cand_n = z((rows,), np.int32)
        self.sel = z((rows, 2), np.uint64)
        self.best = z((rows,), np.uint64)
        self._fpar = np.zeros((rows, K_sp.NF), np.float32)
        self._fpar[:, K_sp.F_TOP_P] = 1.0
        self._fpar[:, K_sp.F_REP] = 1.0
        self._ipar = np.zeros((rows, K_sp.NI), np.int64)
        self._ipar[:, K_sp.I_CROW] = -1
        self._bias: list[dict[int, float]] = [{} for _ in range(rows)]   # what bias_ids / bias_val hold
        self._put(self.fpar, self._fpar)
        self._put(self.ipar, self._ipar)

    def _put(self, dst: Any, host: np.ndarray) -> None:
        if isinstance(dst, np.ndarray):
            dst[...] = host
        else:
            dst.copy_from_numpy(np.ascontiguousarray(host, dtype=dst.dtype), self.ops.stream)

    def set_row(self, b: int, *, temperature: float, seed: int, offset: int, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, repetition_penalty: float = 1.0, frequency_penalty: float = 0.0,
                presence_penalty: float = 0.0, logit_bias: dict[int, float] | None = None,
                counts: np.ndarray | None = None, mask: np.ndarray | None = None, has_mask: bool = False) -> None:
        """Row b's parameters for the next replay, on the host until `flush`. counts: the row's
        token counts [vocab] int32 (generated count | PROMPT_BIT) to upload now (syncs the
        stream), or None to keep what the device holds (it counts every token it picks);
        penalties read them. mask: the ids a grammar allows this step, int32 words [ceil(vocab
        / 32)] (bit v % 32 of word v // 32), uploaded now (syncs); None: no mask, unless
        has_mask (put_mask_async brings it before the pick). top_k 1 or temperature 0: the
        argmax."""
        bias = logit_bias or {}
        _need(len(bias) <= self.max_bias, f"sample_pick: {len(bias)} logit bias entries (at most {self.max_bias})")
        penalized = repetition_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0
        self._fpar[b] = (temperature if top_k != 1 else 0.0, top_p, min_p, repetition_penalty, frequency_penalty,
                         presence_penalty, 0.0, 0.0)
        self._ipar[b] = (top_k, seed, offset, len(bias), b if penalized else -1, int(mask is not None or has_mask), 0, 0)
        if bias and self._bias[b] != bias:                # uploaded once per bias a row takes
            self._bias[b] = dict(bias)
            ids = np.zeros(self.max_bias, np.int32)
            vals = np.zeros(self.max_bias, np.float32)
            ids[: len(bias)] = list(bias.keys())
            vals[: len(bias)] = list(bias.values())
            self._put(self.bias_ids[b], ids)
            self._put(self.bias_val[b], vals)
        if counts is not None:
            self._put(self.counts[b], counts)
        if mask is not None:
            self._put(self.mask[b], self._mask_words(mask))

    def _mask_words(self, mask: np.ndarray) -> np.ndarray:
        words = np.zeros(self.words, np.int32)
        n = min(self.words, mask.shape[0])
        words[:n] = mask[:n]
        return words

    def put_mask_async(self, b: int, mask: np.ndarray) -> None:
        """Row b's bitmask for the next pick, through row b of a pinned buffer and an async
        copy ordered on the stream (no sync: the step before may still run). The row is reused
        by the next call for b: the caller waits for the pick that read it first."""
        from ninfer_nb.runtime._drv import check, driver
        from ninfer_nb.runtime.pinned import PinnedBuffer

        n = 4 * self.words
        if isinstance(self.mask, np.ndarray):               # the simulator's buffers
            self._put(self.mask[b], self._mask_words(mask))
            return
        if self._pinned is None:
            self._pinned = PinnedBuffer(n * self.rows)
        self._pinned.array()[b * n:(b + 1) * n].view(np.int32)[:] = self._mask_words(mask)
        check(driver().cuMemcpyHtoDAsync(self.mask[b].ptr, self._pinned.ptr + b * n, n, self.ops.stream.cu))

    def flush(self, rows: int) -> None:
        """Upload the first `rows` rows' parameters (two copies; syncs the stream)."""
        self._put(self.fpar[:rows], self._fpar[:rows])
        self._put(self.ipar[:rows], self._ipar[:rows])
