"""Gated DeltaNet on the GPU (kernels/gdn/): causal conv1d, the gates, the recurrent and chunked
gated delta rule, the fused decode step (one sequence, or B sequences on their state slots:
slots [B] in device memory), and the rules that pick among them."""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_nb.kernels import elementwise as K_ew
from ninfer_nb.kernels.gdn import conv1d as K_conv
from ninfer_nb.kernels.gdn import gdn as K_gdn
from ninfer_nb.kernels.gdn import gdn_chunked as K_gdc
from ninfer_nb.kernels.gdn import gdn_chunked_mma as K_gdm
from ninfer_nb.kernels.gdn import gdn_decode as K_gdd
from ninfer_nb.kernels.gdn import gdn_prepare_mma as K_gdp

from .launch import F32, I32, SIM, _flat_parts, _need, _part_bounds, _ptr, _rows
from .norm import NormOps

# The TF32 GDN prepare kernel (gdn_prepare_mma.py) by default from this key head dim up: below
# the chunk length (64) a chunk's keys are linearly dependent and the logits drift from the CPU's.
GDN_PREPARE_MMA_MIN_DK = 64
# The GDN mixer's decode middle (conv + gated delta rule + gated norm) as one kernel
# (kernels/gdn/gdn_decode.py, cc >= 9.0: clusters of the value heads that share a key head)
# instead of three launches.
GDN_DECODE_FUSED = True
# Which fused decode kernel: "cluster" (gdn_decode_kernel: clusters of a key head's row slices),
# "head" (gdn_decode_head_slots_kernel: a value head of a sequence per block or per cluster of
# S = 2 / 4 blocks; any S gives the same bits), or "auto": head for rounds of at least
# GDN_HEAD_MIN_SEQS sequences (H200, 27B / 35B shapes, B = 8: 34.4 / 23.3 us vs 48.9 / 28.0;
# B = 16: 72.0 / 48.4 vs 109.2 / 53.5), cluster below (B = 1: 9.1 / 9.0 vs 7.3 / 6.9 us).
GDN_DECODE_KERNEL = "auto"
GDN_HEAD_MIN_SEQS = 3
# The head kernel's S: 0 takes the smallest the shape allows (S = 2 for Dk = 128: S = 4 was
# slower at B = 1, 8 and 16), else this one (S > 1: clusters, cc >= 9.0).
GDN_HEAD_SPLIT = 0


class GdnOps(NormOps):
    def causal_conv1d(self, x: Any, conv_state: Any, weight: Any) -> Any:
        t, c = x.shape
        _need(weight.shape[1] <= K_conv.MAX_K, f"causal_conv1d: kernel width > {K_conv.MAX_K}")
        out = self.empty((t, c))
        if t >= K_conv.PARALLEL_MIN_T:
            self._conv1d_parallel(x, conv_state, weight, out.reshape(-1), c, c)
        elif t:
            self._go(K_conv.causal_conv1d_kernel, (c + 127) // 128, 128, x, conv_state, weight, out)
        return out

    def causal_conv1d_split(self, x: Any, conv_state: Any, weight: Any,
                            sizes: tuple[int, ...]) -> tuple[Any, ...]:
        """split(causal_conv1d(x, conv_state, weight), sizes), at most 3 parts. A prefill chunk
        (T >= conv1d.PARALLEL_MIN_T): the conv kernel writes each part straight into its own
        contiguous block, no split pass; shorter: conv, then split (views for one token)."""
        t, c = x.shape
        _need(sum(sizes) == c and 0 < len(sizes) <= 3, f"causal_conv1d_split: sizes {sizes} vs {x.shape}")
        _need(weight.shape[1] <= K_conv.MAX_K, f"causal_conv1d: kernel width > {K_conv.MAX_K}")
        if t < K_conv.PARALLEL_MIN_T:
            return self.split(self.causal_conv1d(x, conv_state, weight), sizes)
        flat = self.empty((t * c,))                                       # the parts, back to back
        b1, b2 = _part_bounds(sizes, 2)
        self._conv1d_parallel(x, conv_state, weight, flat, b1, b2)
        return _flat_parts(flat, t, sizes)

    def _conv1d_parallel(self, x: Any, conv_state: Any, weight: Any, out_flat: Any, b1: int, b2: int) -> None:
        t, c = x.shape
        grid = ((c + 127) // 128, (t + K_conv.TOKENS_PER_THREAD - 1) // K_conv.TOKENS_PER_THREAD)
        spec = K_conv.conv1d_tokens_k4_kernel if weight.shape[1] == 4 else K_conv.conv1d_tokens_kernel
        self._go(spec, grid, 128, x, conv_state, weight, out_flat, np.int32(b1), np.int32(b2))
        self._go(K_conv.conv1d_state_kernel, (c + 127) // 128, 128, x, conv_state)

    def gdn_gates(self, a: Any, b: Any, a_log: Any, dt_bias: Any) -> tuple[Any, Any]:
        g = self.empty(a.shape)
        beta = self.empty(a.shape)
        n = a.size
        if n:
            self._go(K_gdn.gdn_gates_kernel, K_ew.grid_for(n), K_ew.BLOCK, a, b, a_log, dt_bias, g, beta)
        return g, beta

    def gated_delta_rule(self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any) -> Any:
        return self._gdr_recurrent(q, k, v, g, beta, None, None, state)

    def gated_delta_rule_raw_gates(self, q: Any, k: Any, v: Any, a: Any, b: Any, a_log: Any, dt_bias: Any,
                                   state: Any) -> Any:
        """gated_delta_rule(q, k, v, *gdn_gates(a, b, a_log, dt_bias), state) in one kernel."""
        return self._gdr_recurrent(q, k, v, a, b, a_log, dt_bias, state)

    def _gdr_recurrent(self, q: Any, k: Any, v: Any, g: Any, beta: Any, a_log: Any, dt_bias: Any,
                       state: Any) -> Any:
        t, hv, dv = v.shape
        dk = k.shape[2]
        _need(dk % 32 == 0 and dk <= 32 * K_gdn.MAX_KPL, f"gated_delta_rule: Dk={dk} must be a multiple of 32, <= {32 * K_gdn.MAX_KPL}")
        out = self.empty((t, hv, dv))                                    # [T, Hv, Dv]
        if t:
            raw = a_log is not None
            a_log = a_log if raw else beta.reshape(-1)                   # unused dummies
            dt_bias = dt_bias if raw else beta.reshape(-1)
            grid = (hv, (dv + K_gdn.GDR_ROWS_PER_BLOCK - 1) // K_gdn.GDR_ROWS_PER_BLOCK)
            self._go(K_gdn.gdr_recurrent_kernel, grid, 32 * K_gdn.GDR_WARPS, q, k, v, g, beta, a_log, dt_bias,
                     np.int32(raw), state, out)
        return out

    def gdn_decode(self, mixed: Any, z: Any, a: Any, b: Any, conv_state: Any, conv_w: Any, a_log: Any,
                   dt_bias: Any, state: Any, norm_w: Any, eps: float, n_k_heads: int, slots: Any = None,
                   snapshots: Any = None) -> Any:
        """ops.cpu.gdn_decode: conv, gated delta rule and gated norm of decode-sized T. One kernel
        on cc >= 9.0 for the heads it takes (kernels/gdn/gdn_decode.py), else the three ops.
        With slots [B] int32 (device): the slot pools, gdn_decode_slots_kernel (a grid row per
        sequence) or, where it does not run, the sequences' slots gathered into scratch, the
        one-sequence ops on each, and scattered back (slots stay device data either way).
        snapshots [T] int32 (device, with slots; the head kernel only): where snapshots[t] >= 0,
        the recurrent and conv state after token t are also written to that slot of the pools."""
        if slots is not None:
            return self._gdn_decode_slots(mixed, z, a, b, conv_state, conv_w, a_log, dt_bias, state, norm_w, eps,
                                          n_k_heads, slots, snapshots)
        _need(snapshots is None, "gdn_decode: snapshots need slot pools (slots)")
        t = mixed.shape[0]
        hv, dv, dk = state.shape
        if t and self._head_kernel(1, hv, n_k_heads, dk, dv, conv_w):       # the sequence as a pool of one slot
            return self._gdn_decode_slots(mixed, z, a, b, conv_state.reshape((1,) + tuple(conv_state.shape)), conv_w,
                                          a_log, dt_bias, state.reshape(1, hv, dv, dk), norm_w, eps, n_k_heads,
                                          self._gdn_buffers(n_k_heads)[0])
        if (GDN_DECODE_FUSED and t and not SIM and self.arch is not None and self.arch >= (9, 0)
                and K_gdd.supported(hv, n_k_heads, dk, dv, conv_w.shape[1])
                and conv_w.dtype == F32 and _ptr(conv_w) % 16 == 0):
            out = self.empty((t, hv * dv))                                # [T, Hv * Dv]
            args = (_rows(mixed, mixed.shape[-1]), _rows(z, hv * dv), _rows(a, hv), _rows(b, hv), conv_state,
                    conv_w, a_log, dt_bias, state, norm_w, out, np.int32(n_k_heads), np.float32(eps))
            grid, c = hv * K_gdd.slices(dv), K_gdd.cluster_size(hv, n_k_heads, dv)
            if self._cluster_fits(K_gdd.gdn_decode_kernel, args, grid, K_gdd.THREADS, c):
                self._go(K_gdd.gdn_decode_kernel, grid, K_gdd.THREADS, *args, cluster=c)
                return out
        qk = n_k_heads * dk
        q, k, v = self.causal_conv1d_split(mixed, conv_state, conv_w, (qk, qk, hv * dv))
        o = self.gated_delta_rule_raw_gates(q.reshape(t, n_k_heads, dk), k.reshape(t, n_k_heads, dk),
                                            v.reshape(t, hv, dv), a, b, a_log, dt_bias, state)
        return self.gated_rms_norm(o.reshape(t * hv, dv), z.reshape(t * hv, dv), norm_w, eps).reshape(t, hv * dv)

    def gdn_snapshots_ok(self, hv: int, n_k_heads: int, dk: int, dv: int, conv_k: int) -> bool:
        """gdn_decode takes snapshots= for these GDN shapes here (the head kernel runs them; a
        speculative verify then keeps the state after each token for rollback)."""
        return GDN_DECODE_FUSED and conv_k == K_gdd.CONV_K and bool(self._head_splits(hv, n_k_heads, dk, dv))

    def _head_kernel(self, n_seq: int, hv: int, n_k_heads: int, dk: int, dv: int, conv_w: Any,
                     snapshots: Any = None) -> bool:
        """gdn_decode_head_slots_kernel runs this call (GDN_DECODE_KERNEL and the round's size, or
        snapshots asked for; shapes it takes)."""
        mode = GDN_DECODE_KERNEL
        wanted = mode == "head" or snapshots is not None or (mode == "auto" and n_seq >= GDN_HEAD_MIN_SEQS)
        return (GDN_DECODE_FUSED and wanted and conv_w.shape[1] == K_gdd.CONV_K
                and bool(self._head_splits(hv, n_k_heads, dk, dv))
                and conv_w.dtype == F32 and (SIM or _ptr(conv_w) % 16 == 0))

    def _head_splits(self, hv: int, n_k_heads: int, dk: int, dv: int) -> list[int]:
        """The S the head kernel can run with here (S > 1: clusters, cc >= 9.0, not the simulator)."""
        clusters = not SIM and self.arch is not None and self.arch >= (9, 0)
        return [sp for sp in K_gdd.HEAD_SPLITS if (sp == 1 or clusters)
                and K_gdd.head_supported(hv, n_k_heads, dk, dv, K_gdd.CONV_K, sp)]

    def _head_split(self, n_seq: int, hv: int, n_k_heads: int, dk: int, dv: int) -> int:
        """S for the head kernel: GDN_HEAD_SPLIT, else the smallest the shape allows (clusters:
        cc >= 9.0 only, never in the simulator)."""
        ok = self._head_splits(hv, n_k_heads, dk, dv)
        if GDN_HEAD_SPLIT:
            _need(GDN_HEAD_SPLIT in ok, f"gdn_decode: head split {GDN_HEAD_SPLIT} not possible here ({ok})")
            return GDN_HEAD_SPLIT
        return ok[0]

    def _gdn_buffers(self, n: int) -> tuple[Any, Any, Any]:
        """(slots [1] = 0, snapshots [1] = -1, arrivals [>= n] zeros) for the head kernel: one
        persistent int32 buffer (the arrival counts are 0 between launches; a captured graph
        keeps the buffer it was captured with, a larger need takes a new one)."""
        buf = getattr(self, "_gdn_buf", None)
        if buf is None or buf.shape[0] < n + 2:
            host = np.zeros(max(n, 1024) + 2, np.int32)
            host[1] = -1
            buf = self._gdn_buf = self.from_numpy(host, persistent=True)
        return buf[0:1], buf[1:2], buf[2:]

    def _gdn_decode_slots(self, mixed: Any, z: Any, a: Any, b: Any, conv_pool: Any, conv_w: Any, a_log: Any,
                          dt_bias: Any, state_pool: Any, norm_w: Any, eps: float, n_k_heads: int, slots: Any,
                          snapshots: Any = None) -> Any:
        t = mixed.shape[0]
        n_seq = slots.shape[0]
        _need(slots.dtype == I32 and len(slots.shape) == 1, "gdn_decode: slots must be [B] int32")
        _need(len(state_pool.shape) == 4 and len(conv_pool.shape) == 3 and conv_pool.shape[0] == state_pool.shape[0],
              f"gdn_decode: slot pools {conv_pool.shape} / {state_pool.shape}")
        _need(n_seq > 0 and t % n_seq == 0, f"gdn_decode: {t} tokens do not split into {n_seq} sequences")
        _, hv, dv, dk = state_pool.shape
        out = self.empty((t, hv * dv))                                    # [T, Hv * Dv]
        if not t:
            return out
        if self._head_kernel(n_seq, hv, n_k_heads, dk, dv, conv_w, snapshots):
            sp = self._head_split(n_seq, hv, n_k_heads, dk, dv)
            _, no_snaps, arrivals = self._gdn_buffers(n_seq * n_k_heads)
            self._go(K_gdd.gdn_decode_head_slots_kernel, (hv * sp, n_seq), K_gdd.head_threads(dk, dv, sp),
                     _rows(mixed, mixed.shape[-1]), _rows(z, hv * dv), _rows(a, hv), _rows(b, hv), conv_pool,
                     conv_w, a_log, dt_bias, state_pool, slots, no_snaps if snapshots is None else snapshots,
                     norm_w, out, arrivals, np.int32(n_k_heads), np.int32(sp), np.float32(eps),
                     cluster=sp if sp > 1 else 0)
            return out
        _need(snapshots is None, "gdn_decode: snapshots need the head kernel (not for these shapes)")
        if (GDN_DECODE_FUSED and not SIM and self.arch is not None and self.arch >= (9, 0)
                and K_gdd.supported(hv, n_k_heads, dk, dv, conv_w.shape[1])
                and conv_w.dtype == F32 and _ptr(conv_w) % 16 == 0):
            args = (_rows(mixed, mixed.shape[-1]), _rows(z, hv * dv), _rows(a, hv), _rows(b, hv), conv_pool,
                    conv_w, a_log, dt_bias, state_pool, slots, norm_w, out, np.int32(n_k_heads), np.float32(eps))
            gx, c = hv * K_gdd.slices(dv), K_gdd.cluster_size(hv, n_k_heads, dv)
            if self._cluster_fits(K_gdd.gdn_decode_slots_kernel, args, gx, K_gdd.THREADS, c):
                self._go(K_gdd.gdn_decode_slots_kernel, (gx, n_seq), K_gdd.THREADS, *args, cluster=c)
                return out
        n = t // n_seq
        with self.scope():
            conv = self.empty((n_seq,) + tuple(conv_pool.shape[1:]))      # [B, K-1, C]
            st = self.empty((n_seq, hv, dv, dk))                          # [B, Hv, Dv, Dk]
            conv2, st2 = conv.reshape(n_seq, -1), st.reshape(n_seq, -1)
            pools = (conv_pool.reshape(conv_pool.shape[0], -1), state_pool.reshape(state_pool.shape[0], -1))
            for pool, tmp in zip(pools, (conv2, st2)):
                self._go(K_gdd.slot_gather_kernel, K_ew.grid_for(tmp.size, 256), 256, pool, slots, tmp)
            for i in range(n_seq):
                r = slice(i * n, (i + 1) * n)
                o = self.gdn_decode(mixed[r], z[r], a[r], b[r], conv[i], conv_w, a_log, dt_bias, st[i], norm_w, eps,
                                    n_k_heads)
                self._go(K_gdd.copy_f32_kernel, K_ew.grid_for(o.size, 256), 256, o.reshape(-1), out[r].reshape(-1))
            for pool, tmp in zip(pools, (conv2, st2)):
                self._go(K_gdd.slot_scatter_kernel, K_ew.grid_for(tmp.size, 256), 256, tmp, slots, pool)
        return out

    def gated_delta_rule_chunked(self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any,
                                 chunk: int = 64) -> Any:
        """Same contract as gated_delta_rule, chunked WY form (kernels/gdn/gdn_chunked.py, fixed chunk
        K_gdc.C = 64; `chunk` is accepted for parity with ops.cpu). T <= 16 or Dk > 128: the
        recurrent kernel. The sequential state pass runs on TF32 tensor cores
        (kernels/gdn/gdn_chunked_mma.py) for Dk % 16 == 0 unless self.choices.gdn_state == "simt"; the
        prepare kernel too (kernels/gdn/gdn_prepare_mma.py: Dk % 16 == 0, Dv % 4 == 0, 16-byte
        aligned q / k / v) unless self.choices.gdn_prepare == "simt"."""
        t, hv, dv = v.shape
        hk, dk = k.shape[1], k.shape[2]
        if t <= K_gdc.RECURRENT_MAX_T or not K_gdc.supported(dk, dv):
            return self.gated_delta_rule(q, k, v, g, beta, state)
        _need(hv % hk == 0, f"gated_delta_rule_chunked: Hv={hv} must be a multiple of Hk={hk}")
        nc = (t + K_gdc.C - 1) // K_gdc.C
        out = self.empty((t, hv, dv))      # [T, Hv, Dv]: O_intra from kernel 1, += Q' S^T in kernel 2
        with self.scope():
            wb = self.empty((hv, t, dk))   # [Hv, T, Dk]  W  = T (beta e^gam k^)
            qb = self.empty((hv, t, dk))   # [Hv, T, Dk]  Q' = e^gam q^ - M (beta e^gam k^)
            ub = self.empty((hv, t, dv))   # [Hv, T, Dv]  U  = T (beta v)
            ks = self.empty((hv, t))       # [Hv, T]      |k|^-1 e^(gam_last - gam)
            ec = self.empty((hv, nc))      # [Hv, nc]     e^gam_last per chunk
            prepare = self.choices.gdn_prepare
            mma = prepare == "mma" or (prepare == "auto" and dk >= GDN_PREPARE_MMA_MIN_DK)
            if (mma and K_gdp.supported(dk, dv)
                    and _ptr(q) % 16 == 0 and _ptr(k) % 16 == 0 and _ptr(v) % 16 == 0):
                self._go(K_gdp.gdc_prepare_mma_kernel, (nc, hk), K_gdp.THREADS, q, k, v, g, beta, wb, qb, ub,
                         ks, ec, out, smem=K_gdp.SMEM_BYTES)
            else:
                self._go(K_gdc.gdc_prepare_kernel, (nc, hk), K_gdc.PREP_THREADS, q, k, v, g, beta, wb, qb, ub,
                         ks, ec, out)
            if self.choices.gdn_state == "mma" and K_gdm.supported(dk, dv):
                self._go(K_gdm.gdc_state_mma_kernel, K_gdm.grid(hv, dv), K_gdm.THREADS,
                         k, wb, qb, ub, ks, ec, state, out)
            else:
                self._go(K_gdc.gdc_state_kernel, (hv, (dv + K_gdc.R - 1) // K_gdc.R), K_gdc.STATE_THREADS,
                         k, wb, qb, ub, ks, ec, state, out)
        return out

