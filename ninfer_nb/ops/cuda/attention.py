"""RoPE, KV-cache stores and causal GQA attention on the GPU (kernels/attention/): split-K decode
(tensor cores on bf16 caches, else SIMT) and the prefill kernels (flash, GEMM, SIMT). With a
page table (ops/base.py: B sequences, paged caches) every kernel takes its paged build
(kernels/attention/paging.py): decode rows each through their sequence's table row, prefill
one launch per sequence; without one, the contiguous builds run exactly as before."""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_nb.kernels.attention import attention as K_attn
from ninfer_nb.kernels.attention import attention_decode_mma as K_adm
from ninfer_nb.kernels.attention import attention_flash as K_fa
from ninfer_nb.kernels.attention import attention_gemm as K_ag
from ninfer_nb.kernels.attention import paging as K_page
from ninfer_nb.kernels.attention import rope as K_rope
from ninfer_nb.kernels.linear import gemm_mma as K_mma
from ninfer_nb.kernels.linear import gemm_wgmma as K_wg
from ninfer_nb.kernels.linear import linear as K_lin
from ninfer_nb.runtime.tensor import bfloat16

from ..base import PAGE_SIZE
from .launch import I32, SIM, _need, _ptr, _rows
from .linear import LinearOps

assert K_page.PAGE == PAGE_SIZE

DECODE_MAX_T = 4          # attention: split-K decode kernel up to this many query tokens
ATTN_GEMM_BYTES = 1 << 30  # prefill attention via GEMMs: S + P of one row block stay under this

def _decode_sized(t: int, n_seq: int = 1) -> bool:
    """Whether T query tokens of n_seq sequences (T / n_seq each) take the split-K decode
    attention (which also applies an output gate in its combine kernel) rather than a prefill
    kernel."""
    return 0 < t and t // n_seq <= DECODE_MAX_T and not SIM


def _n_seq(page_table: Any) -> int:
    return 1 if page_table is None else int(page_table.shape[0])


def _check_table(op: str, t: int, page_table: Any) -> None:
    if page_table is not None:
        _need(page_table.dtype == I32 and len(page_table.shape) == 2,
              f"{op}: page_table must be [B, P] int32, got {page_table.shape} {page_table.dtype}")
        _need(t % page_table.shape[0] == 0, f"{op}: {t} tokens do not split into {page_table.shape[0]} sequences")


class AttentionOps(LinearOps):
    def rope(self, x: Any, positions: Any, table: Any) -> Any:
        """ops/cpu.py rope: x [T, heads, D] rotated by the table [3, rotary_dim/2] (models/rope.py)."""
        _need(positions.dtype == I32, "rope: positions must be int32")
        _need(table.shape[0] == 3 and 2 * table.shape[1] <= x.shape[2], f"rope: table {table.shape} vs x {x.shape}")
        t, heads, _ = x.shape
        out = self.empty(x.shape)
        if t:
            self._go(K_rope.rope_kernel, (heads, t), 128, x, positions, table, out)
        return out

    def qk_norm_rope_store(self, q: Any, k: Any, v: Any, q_norm: Any, k_norm: Any, positions: Any,
                           rope_table: Any, eps: float, k_cache: Any, v_cache: Any,
                           k_scale: Any = None, v_scale: Any = None, page_table: Any = None) -> Any:
        """An attention layer's prologue (ops/cpu.py says what): one kernel for fp32 / bf16
        caches and head dims <= 256; the separate ops otherwise (int8 caches)."""
        _need(positions.dtype == I32, "qk_norm_rope_store: positions must be int32")
        _need(rope_table.shape[0] == 3 and 2 * rope_table.shape[1] <= q.shape[2],
              f"qk_norm_rope_store: rope table {rope_table.shape} vs q {q.shape}")
        t, hq, d = q.shape
        _check_table("qk_norm_rope_store", t, page_table)
        if k_scale is not None or d > K_rope.FUSED_MAX_D:
            if q_norm is not None:
                q = self.rms_norm(q, q_norm, eps)
                k = self.rms_norm(k, k_norm, eps)
            q = self.rope(q, positions, rope_table)
            rows = positions if page_table is None else self.cache_rows(positions, page_table)
            self.kv_store(k_cache, v_cache, self.rope(k, positions, rope_table), v, rows, k_scale, v_scale)
            return q
        out = self.empty(q.shape)                                        # [T, Hq, D]
        if t:
            threads = 32
            while threads < d:
                threads *= 2
            has_norm = q_norm is not None
            qn = q_norm if has_norm else q.reshape(-1)                   # unused dummies
            kn = k_norm if has_norm else q.reshape(-1)
            tables = () if page_table is None else (page_table,)
            kern = K_rope.qk_norm_rope_store_kernel if page_table is None else K_rope.qk_norm_rope_store_paged_kernel
            self._go(kern, (hq + k.shape[1], t), threads, q, k, v, qn, kn,
                     np.int32(has_norm), positions, rope_table, np.float32(eps),
                     k_cache, v_cache, *tables, out)
        return out

    def cache_rows(self, positions: Any, page_table: Any) -> Any:
        """ops.cpu.cache_rows on the device: the cache row [T] int32 of each token (scratch)."""
        t = positions.shape[0]
        rows = self.empty((t,), np.int32)                                # [T]
        if t:
            self._go(K_page.cache_rows_kernel, (t + 127) // 128, 128, positions, page_table, rows)
        return rows

    def kv_store(self, k_cache: Any, v_cache: Any, k: Any, v: Any, positions: Any,
                 k_scale: Any = None, v_scale: Any = None) -> None:
        """Caches fp32 / bf16, or int8 codes when scales [S, Hkv, D/64] are given."""
        _need(positions.dtype == I32, "kv_store: positions must be int32")
        t, hkv, d = k.shape
        if not t:
            return
        if k_scale is not None:
            _need(d % K_attn.GROUP == 0, f"kv_store: int8 cache needs head_dim % {K_attn.GROUP} == 0")
            self._go(K_attn.kv_store_int8_kernel, (hkv, t), 32, k_cache, v_cache, k_scale, v_scale,
                     k, v, positions)
        else:
            self._go(K_attn.kv_store_kernel, (hkv, t), 128, k_cache, v_cache, k, v, positions)

    def attention_gated(self, q: Any, k_cache: Any, v_cache: Any, positions: Any, scale: float, gate: Any,
                        k_scale: Any = None, v_scale: Any = None, page_table: Any = None) -> Any:
        """ops.cpu.attention_gated: attention(..) * sigmoid(gate) as [T, Hq * D]. Decode-sized T:
        the gate is applied in the split kernels' combine kernel (no sigmoid_mul launch)."""
        t, hq, d = q.shape
        _need(gate.shape[-1] == hq * d and gate.size == t * hq * d, f"attention_gated: gate {gate.shape} vs q {q.shape}")
        out = self.attention(q, k_cache, v_cache, positions, scale, k_scale, v_scale, page_table,
                             _gate=_rows(gate, hq * d))
        if _decode_sized(t, _n_seq(page_table)):
            return out.reshape(t, hq * d)
        return self.sigmoid_mul(out.reshape(t, hq * d), gate)

    def attention(self, q: Any, k_cache: Any, v_cache: Any, positions: Any, scale: float,
                  k_scale: Any = None, v_scale: Any = None, page_table: Any = None, _gate: Any = None) -> Any:
        """ops.cpu.attention. Decode-sized (T / B <= DECODE_MAX_T tokens per sequence): the
        split-K decode kernels, every row through its own sequence's page table row. Else the
        prefill kernels, one launch per sequence (a page table [1, P] each)."""
        _need(positions.dtype == I32, "attention: positions must be int32")
        t, hq, d = q.shape
        _need(d <= K_attn.MAX_D, f"attention: head_dim {d} > {K_attn.MAX_D}")
        _need(hq % k_cache.shape[1] == 0, "attention: Hq must be a multiple of Hkv")
        _check_table("attention", t, page_table)
        out = self.empty((t, hq, d))                                     # [T, Hq, D]
        if t == 0:
            return out
        ks = k_scale if k_scale is not None else q                       # unused dummies when
        vs = v_scale if v_scale is not None else q                       # the cache is not int8
        n_seq = _n_seq(page_table)
        if _decode_sized(t, n_seq):
            self._attention_decode(q, k_cache, v_cache, ks, vs, positions, scale, _gate, out, page_table)
        elif n_seq == 1:
            self._attention_prefill(q, k_cache, v_cache, ks, vs, positions, scale, out, page_table)
        else:
            n = t // n_seq
            for b in range(n_seq):
                self._attention_prefill(q[b * n:(b + 1) * n], k_cache, v_cache, ks, vs, positions[b * n:(b + 1) * n],
                                        scale, out[b * n:(b + 1) * n], page_table[b:b + 1])
        return out

    def _attention_prefill(self, q: Any, k_cache: Any, v_cache: Any, ks: Any, vs: Any, positions: Any,
                           scale: float, out: Any, page_table: Any) -> None:
        """One sequence's prefill-sized attention into out [T, Hq, D]: the flash kernel, the
        GEMMs or the SIMT kernel (through page_table [1, P] when given)."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]                                           # block: 64 (token, q head)
        grid = ((t * (hq // hkv) + K_attn.PRE_BM - 1) // K_attn.PRE_BM, hkv)  # rows of 1 kv head
        if self.choices.prefill_attention == "flash" and K_fa.supported(d, self.arch) and t > K_lin.GEMV_MAX_T:
            self._attention_flash(q, k_cache, v_cache, ks, vs, positions, scale, out, page_table)
            return
        if (self.choices.prefill_attention in ("gemm", "flash") and not SIM and d % K_mma.K_ALIGN == 0
                and t > K_lin.GEMV_MAX_T):                               # as the linear layers: T <= 16 stays fp32
            self._attention_gemm(q, k_cache, v_cache, ks, vs, positions, scale, out, page_table)
            return
        if page_table is None:
            self._go(K_attn.attn_prefill_kernel, grid, K_attn.PRE_THREADS, _rows(q, d), k_cache, v_cache,
                     ks, vs, positions, np.float32(scale), _rows(out, d))
        else:
            self._go(K_attn.attn_prefill_paged_kernel, grid, K_attn.PRE_THREADS, _rows(q, d), k_cache, v_cache,
                     ks, vs, positions, page_table, np.float32(scale), _rows(out, d))

    def _attention_decode(self, q: Any, k_cache: Any, v_cache: Any, ks: Any, vs: Any, positions: Any,
                          scale: float, gate: Any, out: Any, page_table: Any = None) -> None:
        """Split-K decode attention into out [T, Hq, D]: per-split partials, then the combine
        kernel (which applies the output gate when given). bf16 caches (cc >= 8.0, head dims 64
        and 256, up to 8 q heads per kv head): a block per (split, kv head) on tensor cores
        (attention_decode_mma.py); otherwise a block per (split, q head) on CUDA cores
        (attn_split_kernel, any cache dtype). With page_table [B, P]: their paged builds, each
        token t's keys through row t // (T / B) of the table."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        tensor_cores = SIM or (self.arch is not None and self.arch >= (8, 0))
        paged = page_table is not None
        tables = (page_table,) if paged else ()
        # the longest sequence the keys can hold (sizes the split count)
        cache_len = k_cache.shape[0] if not paged else min(k_cache.shape[0], page_table.shape[1] * PAGE_SIZE)
        if (self.choices.decode_attention == "auto" and tensor_cores and k_cache.dtype == bfloat16
                and K_adm.supported(d, hq // hkv)
                and _ptr(q) % 16 == 0 and _ptr(k_cache) % 16 == 0 and _ptr(v_cache) % 16 == 0):
            n_split = K_attn.decode_splits(cache_len, hkv * t, K_adm.SPLIT_BLOCKS_PER_SM * self.sm_count)
            args: tuple[Any, ...] = ()                                   # the split kernel's scales
            kern = (K_adm.SPLIT_MMA_PAGED_KERNELS if paged else K_adm.SPLIT_MMA_KERNELS)[d]
            grid = (n_split, hkv, t)
            threads, min_split = 32 * K_adm.DEC_WARPS, K_adm.MIN_SPLIT_KEYS
        else:
            n_split = K_attn.decode_splits(cache_len, hq * t, K_attn.SPLIT_BLOCKS_PER_SM * self.sm_count)
            kern = K_attn.attn_split_paged_kernel if paged else K_attn.attn_split_kernel
            grid, args = (n_split, hq, t), (ks, vs)
            threads, min_split = 32 * K_attn.SPLIT_WARPS, K_attn.MIN_SPLIT_KEYS
        part_o = self.empty((t, hq, n_split, d))                         # [T, Hq, NS, D]
        part_ml = self.empty((t, hq, n_split, 2))                        # [T, Hq, NS, (max, sum)]
        self._go(kern, grid, threads, q, k_cache, v_cache, *args, positions, *tables, np.float32(scale),
                 part_o, part_ml)
        g = gate if gate is not None else part_ml.reshape(-1, 2)        # unused dummy without a gate
        self._go(K_attn.attn_combine_kernel, (hq, t), K_attn.COMBINE_THREADS, part_o, part_ml, positions, g,
                 np.int32(gate is not None), np.int32(min_split), out)

    def _attention_gathers(self, q: Any, k_cache: Any, v_cache: Any, ks: Any, vs: Any,
                           positions: Any, page_table: Any = None) -> tuple[Any, Any, Any]:
        """q, K and V regrouped per kv head in bf16 (attention_gemm's gathers): qb [Hkv, T*G, D],
        kb [Hkv, Lp, D], vt [Hkv, D, Lp]. The number of keys L comes from the host copy of the
        positions (prefill inputs carry one); without it, the whole cache length (paged: the
        table's pages). page_table [1, P]: the keys through it."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        host = getattr(positions, "host", None)
        cache_len = k_cache.shape[0] if page_table is None else page_table.shape[1] * PAGE_SIZE
        n_keys = int(host.max()) + 1 if host is not None and len(host) else cache_len
        lp = K_ag.padded_keys(min(n_keys, cache_len))
        rows = t * (hq // hkv)
        qb = self.empty((hkv, rows, d), np.uint16)                      # [Hkv, T*G, D] bf16
        kb = self.empty((hkv, lp, d), np.uint16)                        # [Hkv, Lp, D]  bf16
        vt = self.empty((hkv, d, lp), np.uint16)                        # [Hkv, D, Lp]  bf16
        self._go(K_ag.attn_gather_q_kernel, (rows, hkv), 128, q, qb)
        grid = (lp // K_ag.TILE, (d + K_ag.TILE - 1) // K_ag.TILE, hkv)
        if page_table is None:
            self._go(K_ag.attn_gather_kv_kernel, grid, (K_ag.TILE, 8), k_cache, v_cache, ks, vs, positions, kb, vt)
        else:
            self._go(K_ag.attn_gather_kv_paged_kernel, grid, (K_ag.TILE, 8), k_cache, v_cache, ks, vs, positions,
                     page_table, kb, vt)
        return qb, kb, vt

    def _attention_flash(self, q: Any, k_cache: Any, v_cache: Any, ks: Any, vs: Any, positions: Any,
                         scale: float, out: Any, page_table: Any = None) -> None:
        """Prefill attention in one flash kernel over the bf16 gathers (kernels/attention/attention_flash.py)."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        with self.scope():
            qb, kb, vt = self._attention_gathers(q, k_cache, v_cache, ks, vs, positions, page_table)
            self._go(K_fa.flash_attn_kernel, K_fa.grid(qb.shape[1], hkv), K_fa.THREADS, qb, kb, vt, positions,
                     np.int32(hq // hkv), np.float32(scale), _rows(out, d), smem=K_fa.SMEM_BYTES)

    def _attention_gemm(self, q: Any, k_cache: Any, v_cache: Any, ks: Any, vs: Any, positions: Any,
                        scale: float, out: Any, page_table: Any = None) -> None:
        """Prefill attention as S = Q K^T, softmax, O = P V on the tensor-core GEMMs
        (kernels/attention/attention_gemm.py)."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        grp = hq // hkv
        rows = t * grp
        out2 = _rows(out, d)
        with self.scope():
            qb, kb, vt = self._attention_gathers(q, k_cache, v_cache, ks, vs, positions, page_table)
            lp = kb.shape[1]
            # rows per S / P block: S (fp32) and P (bf16) of one block stay under ATTN_GEMM_BYTES
            block = max(K_wg.MIN_M, min(rows, ATTN_GEMM_BYTES // (6 * lp) // K_wg.MIN_M * K_wg.MIN_M))
            for h in range(hkv):
                kb_h = kb[h : h + 1].reshape(lp, d)
                vt_h = vt[h : h + 1].reshape(d, lp)
                qb_h = qb[h : h + 1].reshape(rows, d)
                for r0 in range(0, rows, block):
                    r1 = min(rows, r0 + block)
                    with self.scope():
                        s = self.empty((r1 - r0, lp))                   # [R, Lp] fp32 scores
                        self._gemm_bf16(qb_h[r0:r1], kb_h, s)
                        p = self.empty((r1 - r0, lp), np.uint16)        # [R, Lp] bf16 probabilities
                        self._go(K_ag.attn_softmax_rows_kernel, r1 - r0, K_ag.SOFTMAX_THREADS, s, positions,
                                 np.int32(r0), np.int32(grp), np.float32(scale), p)
                        o = self.empty((r1 - r0, d))                    # [R, D] fp32
                        self._gemm_bf16(p, vt_h, o)
                        self._go(K_ag.attn_scatter_o_kernel, r1 - r0, 128, o, np.int32(r0), np.int32(h),
                                 np.int32(grp), np.int32(hq), out2)

