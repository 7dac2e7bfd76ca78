"""Dense linear layers on the GPU: decode GEMVs (kernels/linear/linear.py), tensor-core prefill
GEMMs (gemm_mma.py, gemm_wgmma.py), and the shape rules that pick among them."""
from __future__ import annotations

from typing import Any

import numpy as np

from ninfer_nb.kernels.linear import gemm_mma as K_mma
from ninfer_nb.kernels.linear import gemm_wgmma as K_wg
from ninfer_nb.kernels.linear import gemv_mma as K_gm
from ninfer_nb.kernels.linear import linear as K_lin
from ninfer_nb.models.weights import DenseWeight, QuantizedWeight

from .launch import F32, SIM, _need, _ptr, _rows
from .linear_quant import QuantLinearOps, is_quantized, linear_record, quant_record
from .norm import Normed
from .records import dense

# Split-K decode GEMV (4 K slices per row pair) for 2-16 tokens (one token: one_token_build),
# weights of at most SPLITK_MAX_N rows and at least SPLITK_MIN_K columns (shorter rows lose).
SPLITK_MAX_N = 8192
SPLITK_MIN_K = 12288
# The 2-slice variant (8 rows per block) for K from SPLITK2_MIN_K up to SPLITK_MIN_K.
SPLITK2_MIN_K = 4096
NO_BIAS = np.int32(0)     # the GEMMs' has_bias flag without a bias
# 3..16 tokens (a decode round of B sequences, a verify): the tensor-core GEMV (gemv_mma.py,
# cc >= 8.0), which reads the weights once for all tokens; the SIMT GEMVs stream them again per
# 4 tokens with per-token work on every weight (two tokens: the SIMT GEMV, measured faster).
GEMV_MMA = True
GEMV_MMA_MIN_T = 3
# 3..16 tokens: v3 of the tensor-core GEMV (gemv_mma.py gemv_mma3: warps over row tiles, x
# shared through L1, the work split evenly over one wave of blocks), with the residual add and
# the SwiGLU in its epilogue; measured faster than v1 + the separate add / SwiGLU launch on
# every 27B shape at T >= 4 (docs/perf-log.md). Two tokens stay on the SIMT GEMV (faster).
GEMV_MMA3 = True
GEMV_MMA3_MIN_T = 3
# Measured on the 27B's weights (K >= 5120); shorter rows (the 35B's K = 2048 / 4096: a few
# columns per block at one wave) keep v1 unless the weight is large (its LM head).
GEMV_MMA3_MIN_K = 5120
GEMV_MMA3_MIN_WEIGHT = 64 << 20


def mma3_plan(mode: str, t: int, n: int, k: int, sm_count: int = 132) -> tuple[tuple[str, int, int, int, int, int], int]:
    """(build, blocks) of gemv_mma3 for T tokens x an [n, k] weight (swiglu: n = 2I): blocks of
    4 warps, 4 per SM, one block per resident slot (the work split evenly: one wave, no tail);
    2 row tiles per warp (x read once per 128 rows) from 8192 rows up, else 1 (the 5120-row
    weights: fewer blocks share a row group). The best or within 3 % of the best of the builds
    x grids measured (dev/gemv_probe.py --mma) on every 27B shape at T = 4, 8, 16."""
    tiles = 2 if mode == "swiglu" or n >= 8192 else 1
    build = (mode, 4, tiles, 4 // tiles, 4, 0)
    units = K_gm.v3_groups(mode, 4, tiles, n) * (k // K_gm.K_ALIGN)
    return build, min(units, build[4] * sm_count)


# gemv_mma4 (gemv_mma.py v4: the weights through per-warp cp.async rings, x split once per block
# into shared memory) where mma4_plan has a build; KernelChoices.multi_token_gemv = "auto" takes
# it where GEMV_MMA4_AUTO (measured faster than gemv_mma3 on every 27B shape at T = 4, 8, 16).
GEMV_MMA4_AUTO = True
MMA4_MIN_T = 2                             # plain GEMVs from 2 tokens where a side is >= 8192 (measured; SwiGLU
MMA4_T2_MIN_SIDE = 8192                    # from 3: at 2 the SIMT GEMV was faster)
MMA4_MIN_K = 2048
MMA4_SHORT_K = 5120                        # rows shorter than this: only weights of MMA4_SHORT_MIN_N rows up
MMA4_SHORT_MIN_N = 8192                    # (measured: the 35B GDN input 12352 x 2048; its 2048-row out_proj not)
# (mode, warps, tiles, kb, stages, blocks per SM, ldmatrix, staged x)
MMA4_PLAIN = ("plain", 8, 1, 4, 3, 2, 1, 1)
MMA4_SWIGLU = ("swiglu", 4, 2, 4, 3, 2, 1, 1)


def mma4_plan(mode: str, t: int, n: int, k: int, sm_count: int = 132) -> tuple[tuple[Any, ...], int] | None:
    """(build, blocks) of gemv_mma4 for T tokens x an [n, k] weight (swiglu: n = 2I), or None
    (K below MMA4_MIN_K, below MMA4_SHORT_K with fewer than MMA4_SHORT_MIN_N rows, not a
    multiple of a stage; fewer than MMA4_MIN_T tokens, SwiGLU 3): 128-column stages in a ring of 3 per warp,
    A fragments by ldmatrix, x staged once per block, 2 blocks per SM, one block per resident
    slot (stream-K); plain: 8 warps of one row tile, SwiGLU: 4 warps of a gate and an up tile.
    The best or within 3 % of the best of the builds measured (dev/gemv_probe.py --mma) on the
    27B shapes at T = 4, 8, 16 (down, 17408 x 5120, out_proj, gate_up, LM head)."""
    build = MMA4_SWIGLU if mode == "swiglu" else MMA4_PLAIN
    cols = 32 * build[3]
    groups = K_gm.v3_groups(mode, build[1], build[2], n)
    if (k < MMA4_MIN_K or (k < MMA4_SHORT_K and n < MMA4_SHORT_MIN_N) or k % cols or groups > K_gm.MAX_GROUPS
            or t < (MMA4_MIN_T if mode != "swiglu" and max(n, k) >= MMA4_T2_MIN_SIDE else 3)):
        return None
    return build, min(groups * (k // cols), build[5] * sm_count)


def one_token_build(mode: str, n: int, k: int, sm_count: int = 132) -> tuple[str, int, int, int]:
    """(mode, K slices, blocks per SM, warps per block) of the one-token decode GEMV
    (kernels/linear/linear.py gemv_one_token) for an [n, k] weight on `sm_count` SMs.

    Rows longer than 4096 (the 27B's weights): blocks of 4 warps, twice as many per SM as
    8-warp ones, so a block carries half the work, a kernel's last blocks trail for half as
    long and the next kernel's blocks find room sooner. Plain weights: 2 K slices at 6 blocks
    per SM (80 registers) from 32 M weights up, else 4; but whole rows at 5 blocks (92
    registers; at 6 ptxas spills 12 bytes) when that is one wave of 4-5 blocks on every SM (the
    27B's 5120-row weights: 640 blocks of equal work, no tail wave). Normed and SwiGLU: whole
    rows at 4 blocks (128 registers).
    Shorter rows (the 35B's K = 2048 / 4096, a block's rows stream in 2-4 passes): blocks of 8
    warps; plain 2 K slices at 3 blocks per SM from 32 M weights up, else 2; normed and SwiGLU
    whole rows at 2 blocks. (The measurements behind these builds: docs/perf-log.md.)"""
    if k <= 4096:
        return one_token_build_x8(mode, n, k)
    warps = 4
    if mode == "plain":
        if 4 * sm_count <= -(-((n + 1) // 2) // warps) <= 5 * sm_count:     # one wave of whole rows
            return mode, 1, 5, warps
        return mode, 2, (6 if n * k >= 32 << 20 else 4), warps
    return mode, 1, 4, warps


def one_token_build_x8(mode: str, n: int, k: int) -> tuple[str, int, int, int]:
    """one_token_build's 8-warp builds for short rows: plain 2 K slices at 3 blocks per SM from
    32 M weights up, else 2; normed and SwiGLU whole rows at 2."""
    if mode == "plain":
        return mode, 2, (3 if n * k >= 32 << 20 else 2), 8
    return mode, 1, 2, 8


class LinearOps(QuantLinearOps):
    def linear_swiglu(self, x: Any, gate_up: Any) -> Any:
        """swiglu(linear(x, gate_up)); up to GEMV_MAX_T tokens and a bf16 weight: one GEMV
        kernel with the SwiGLU in its epilogue (kernels/linear/linear.py gemv_bf16_swiglu_kernel).
        A wgmma chunk (cc 9.0, T >= gemm_wgmma.MIN_M, I % 64 == 0): one GEMM with the SwiGLU in
        its epilogue (gemm_wgmma_swiglu_kernel) returning h as bf16 bits (uint16) [T, I]: what
        `linear` rounds its input to before its GEMM anyway, so the MLP's result is unchanged,
        and neither the [T, 2I] fp32 product nor an fp32 h goes through memory. Only `linear`
        consumes it (models/layers.py mlp_block). Quantized weights: linear_quant.py."""
        if is_quantized(gate_up):
            return self._quant_swiglu(x, quant_record(gate_up, "linear_swiglu"))
        w = dense(gate_up, "linear_swiglu")
        gate_up, bf16 = w.data, w.dtype == "bf16"
        two_i, k = gate_up.shape
        _need(x.shape[-1] == k and two_i % 2 == 0, f"linear_swiglu: x {x.shape} vs weight {gate_up.shape}")
        if isinstance(x, Normed):                       # one token, the RMSNorm fused in
            if bf16 and k % 8 == 0 and _ptr(gate_up) % 16 == 0:
                out = self.empty((1, two_i // 2))                                   # [1, I]
                self._one_token("swiglu", x.x, x.weight, x.eps, gate_up, out, out.reshape(-1), False)
                return out.reshape(tuple(x.shape[:-1]) + (two_i // 2,))
            x = self.plain(x)
        x2 = _rows(x, k)
        t = x2.shape[0]
        inter = two_i // 2
        if (self.use_wgmma and t >= K_wg.MIN_M and not SIM and bf16 and x2.dtype == F32
                and k % K_wg.K_ALIGN == 0 and inter % K_wg.K_ALIGN == 0
                and _ptr(x2) % 16 == 0 and _ptr(gate_up) % 16 == 0):
            xb = self._bf16_copy(x2)
            h = self.empty(tuple(x.shape[:-1]) + (inter,), np.uint16)        # [T, I] bf16 bits
            self._go(K_wg.gemm_wgmma_swiglu_kernel, K_wg.gemm_grid(t, two_i), K_wg.THREADS, xb, gate_up,
                     _rows(h, inter), smem=K_wg.SMEM_BYTES)
            return h
        if (bf16 and x2.dtype == F32 and self._gemv_mma3(t, k, two_i, "swiglu") and _ptr(x2) % 16 == 0
                and _ptr(gate_up) % 16 == 0):
            out = self.empty(tuple(x.shape[:-1]) + (inter,))            # [T, I]
            self._gemv_mma3_into("swiglu", x2, gate_up, out.reshape(-1), _rows(out, inter), NO_BIAS, 0)
            return out
        if not (0 < t <= K_lin.GEMV_MAX_T and not SIM
                and bf16 and k % 8 == 0 and _ptr(gate_up) % 16 == 0 and _ptr(x2) % 16 == 0) or self._gemv_mma(t, k):
            return self.swiglu(self.linear(x, w))       # (2..16 tokens: the tensor-core GEMV, then SwiGLU)
        out = self.empty(tuple(x.shape[:-1]) + (two_i // 2,))             # [T, I]
        self._go(K_lin.gemv_bf16_swiglu_kernel, (two_i // 2 + K_lin.GEMV_WARPS - 1) // K_lin.GEMV_WARPS,
                 32 * K_lin.GEMV_WARPS, x2, gate_up, _rows(out, two_i // 2))
        return out

    def linear_split(self, x: Any, weight: Any, bias: Any, sizes: tuple[int, ...]) -> tuple[Any, ...]:
        """split(linear(x, weight, bias), sizes). For a tensor-core chunk (T > 16), one GEMM
        per part on the part's rows of the fused weight (contiguous: weight[n0:n1]) writes each
        part straight into its own buffer, so the split copy pass goes away; x is converted to
        bf16 once for all parts. Decode keeps linear + split (views)."""
        if is_quantized(weight):
            return self.split(self.linear(x, weight, bias), sizes)
        w = dense(weight, "linear_split")
        weight = w.data
        n, k = weight.shape
        t = x.size // k if k else 0
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        if not (t > K_lin.GEMV_MAX_T and not SIM
                and w.dtype == "bf16" and k % K_mma.K_ALIGN == 0 and sum(sizes) == n
                and all(b % 2 == 0 for b in bounds) and _ptr(x) % 16 == 0 and _ptr(weight) % 16 == 0):
            return self.split(self.linear(x, w, bias), sizes)
        x2 = _rows(x, k)
        xb = self._bf16_copy(x2)                                         # shared by the parts
        parts = []
        for n0, n1 in zip(bounds[:-1], bounds[1:]):
            out = self.empty((t, n1 - n0))                               # [T, size_i]
            self._gemm_bf16(xb, weight[n0:n1], out, bias[n0:n1] if bias is not None else None,
                            np.int32(bias is not None))
            parts.append(out)
        return tuple(parts)

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any:
        w = linear_record(weight, "linear")
        n, k = w.shape
        _need(x.shape[-1] == k, f"linear: x {x.shape} vs weight {w.shape}")
        out = self.empty(tuple(x.shape[:-1]) + (n,))
        if out.size:
            self._linear_into(x, w, bias, _rows(out, n))
        return out

    def linear_add(self, x: Any, weight: Any, residual: Any) -> Any:
        """residual += linear(x, weight), in place; returns residual. One token: the GEMV adds
        the residual as its bias and writes over it (each element is read and written by the
        same thread), so the add costs no launch."""
        w = linear_record(weight, "linear_add")
        n, k = w.shape
        _need(x.shape[-1] == k and residual.shape[-1] == n and x.size // k == residual.size // n,
              f"linear_add: x {x.shape}, weight {w.shape}, residual {residual.shape}")
        if residual.size == n:
            self._linear_into(x, w, residual.reshape(-1), _rows(residual, n))
            return residual
        t = x.size // k
        if (isinstance(w, DenseWeight) and w.dtype == "bf16" and not isinstance(x, Normed) and x.dtype == F32
                and self._gemv_mma3(t, k, n) and _ptr(x) % 16 == 0 and _ptr(w.data) % 16 == 0):
            self._gemv_mma3_into("plain", _rows(x, k), w.data, residual.reshape(-1), _rows(residual, n), NO_BIAS, 1)
            return residual
        return self.add_into(residual, self.linear(x, w))

    def _linear_into(self, x: Any, w: DenseWeight | QuantizedWeight, bias: Any, out2: Any) -> None:
        """out2 [T, N] = x @ w^T (+ bias [N]); bias may alias out2 when T == 1. The kernel
        follows w's storage tag: bf16 GEMVs / tensor-core GEMMs, or the fp32 kernels; a
        quantized record goes to linear_quant.py."""
        if isinstance(w, QuantizedWeight):
            self._quant_into(x, w, bias, out2)
            return
        weight, bf16 = w.data, w.dtype == "bf16"
        n, k = weight.shape
        if isinstance(x, Normed):
            if (bf16 and k % 8 == 0 and _ptr(weight) % 16 == 0):
                b = bias if bias is not None else out2.reshape(-1)   # unused dummy when has_bias == 0
                self._one_token("normed", x.x, x.weight, x.eps, weight, out2, b, bias is not None)
                return
            x = self.plain(x)
        x2 = _rows(x, k)
        t = x2.shape[0]
        has_bias = np.int32(bias is not None)
        b = bias if bias is not None else out2.reshape(-1)   # unused dummy when has_bias == 0
        _need(x2.dtype == F32 or (x2.dtype == np.uint16 and t > K_lin.GEMV_MAX_T and bf16
                                  and k % K_mma.K_ALIGN == 0),
              f"linear: bf16 activations ({x2.dtype}) only as a tensor-core GEMM operand")
        if w.dtype == "f32" and t <= K_lin.GEMV_MAX_T and not SIM:
            grid = (n + K_lin.GEMV_F32_WARPS - 1) // K_lin.GEMV_F32_WARPS
            self._go(K_lin.gemv_f32_kernel, grid, 32 * K_lin.GEMV_F32_WARPS, x2, weight, b, out2, has_bias)
        elif bf16 and t <= K_lin.GEMV_MAX_T and not SIM:
            vec = np.int32(k % 8 == 0 and _ptr(weight) % 16 == 0 and _ptr(x2) % 16 == 0)
            ways = 4 if k >= SPLITK_MIN_K else 2 if k >= SPLITK2_MIN_K else 0
            if vec and t == 1:
                self._one_token("plain", x2, x2.reshape(-1), 1.0, weight, out2, b, bias is not None)
            elif vec and self._gemv_mma3(t, k, n):
                self._gemv_mma3_into("plain", x2, weight, b, out2, has_bias, 0)
            elif vec and self._gemv_mma(t, k):
                self._gemv_mma_into(x2, weight, b, out2, has_bias)
            elif vec and n <= SPLITK_MAX_N and ways:
                spec = K_lin.gemv_bf16_splitk_kernel if ways == 4 else K_lin.gemv_bf16_splitk2_kernel
                rows_per_block = K_lin.splitk_rows_per_block(ways)
                grid = (n + rows_per_block - 1) // rows_per_block
                self._go(spec, grid, 32 * K_lin.GEMV_WARPS, x2, weight, b, out2, has_bias)
            else:
                grid = (n + K_lin.GEMV_ROWS_PER_BLOCK - 1) // K_lin.GEMV_ROWS_PER_BLOCK
                self._go(K_lin.gemv_bf16_kernel, grid, 32 * K_lin.GEMV_WARPS, x2, weight, b, out2, has_bias,
                         vec)
        elif (bf16 and not SIM and k % K_mma.K_ALIGN == 0
              and _ptr(x2) % 16 == 0 and _ptr(weight) % 16 == 0 and _ptr(out2) % 16 == 0):
            # tensor cores (t > GEMV_MAX_T): x -> bf16 scratch copy (unless x already is bf16
            # bits, as linear_swiglu's wgmma result), then a bf16 GEMM
            xb = x2 if x2.dtype == np.uint16 else self._bf16_copy(x2)
            self._gemm_bf16(xb, weight, out2, b, has_bias)
        else:
            grid = ((n + K_lin.BN - 1) // K_lin.BN, (t + K_lin.BM - 1) // K_lin.BM)
            self._go(K_lin.gemm_kernel, grid, 256, x2, weight, b, out2, has_bias)

    def _gemv_mma(self, t: int, k: int) -> bool:
        """Whether T tokens x K columns take the tensor-core GEMV (the caller checked bf16 and
        16-byte alignment)."""
        return (GEMV_MMA and not SIM and t >= GEMV_MMA_MIN_T and K_gm.supported(t, k) and self.arch is not None
                and tuple(self.arch) >= (8, 0))

    def _gemv_mma3(self, t: int, k: int, n: int, mode: str = "plain") -> bool:
        """Whether T tokens x an [n, K] weight take gemv_mma3 (bf16 and alignment checked by the
        caller); GEMV_MMA = False turns off both tensor-core GEMVs (the SIMT ones run)."""
        mma4 = self._mma4_on() and mma4_plan(mode, t, n, k, self.sm_count) is not None
        return (GEMV_MMA and GEMV_MMA3 and not SIM and (mma4 or GEMV_MMA3_MIN_T <= t) and t <= K_gm.MAX_T
                and k % K_gm.K_ALIGN == 0 and (mma4 or k >= GEMV_MMA3_MIN_K or n * k >= GEMV_MMA3_MIN_WEIGHT)
                and self.arch is not None and tuple(self.arch) >= (8, 0)
                and K_gm.v3_groups("plain", 4, 1, n) <= K_gm.MAX_GROUPS)

    def _mma4_on(self) -> bool:
        """Whether KernelChoices.multi_token_gemv sends the tensor-core GEMV to gemv_mma4 (where
        mma4_plan has a build)."""
        pick = self.choices.multi_token_gemv
        return pick == "mma4" or (pick == "auto" and GEMV_MMA4_AUTO)

    def _gemv_mma3_into(self, mode: str, x2: Any, weight: Any, b: Any, out2: Any, has_bias: Any,
                        accumulate: int) -> None:
        """out2 [T, N] (=/+=) x2 [T, K] @ weight^T (+ b), or out2 [T, I] = swiglu of it, by
        gemv_mma4 (mma4_plan) where KernelChoices.multi_token_gemv picks it, else gemv_mma3
        (mma3_plan's build and grid)."""
        n, k = weight.shape
        t = x2.shape[0]
        counter = getattr(self, "_mma3_counter", None)
        if counter is None:                 # 0 between launches; each row group's last block resets it
            counter = self._mma3_counter = self.zeros((K_gm.MAX_GROUPS,), np.int32, persistent=True)
        plan4 = mma4_plan(mode, t, n, k, self.sm_count) if self._mma4_on() else None
        if plan4 is not None:
            b4, blocks = plan4
            segs = K_gm.v3_segments(K_gm.v3_groups(mode, b4[1], b4[2], n), k, blocks, 32 * b4[3])
            ws = self.empty((segs, t, n))
            spec = K_gm.gemv_mma4(*b4)
            K_gm.prefer_shared(spec, force=True)
            self._go(spec, blocks, 32 * b4[1], x2, weight, b, out2, has_bias, np.int32(accumulate), ws, counter,
                     smem=K_gm.v4_smem(*b4[1:5], *b4[7:8]))
            return
        build, blocks = mma3_plan(mode, t, n, k, self.sm_count)
        segs = K_gm.v3_segments(K_gm.v3_groups(mode, build[1], build[2], n), k, blocks)
        ws = self.empty((segs, t, n))       # partial sums of the row groups that blocks share
        spec = K_gm.gemv_mma3(*build)
        K_gm.prefer_shared(spec)            # (ring builds only)
        self._go(spec, blocks, 32 * build[1], x2, weight, b, out2, has_bias, np.int32(accumulate), ws, counter)

    def _gemv_mma_into(self, x2: Any, weight: Any, b: Any, out2: Any, has_bias: Any) -> None:
        """out2 [T, N] = x2 [T, K] @ weight^T (+ b) by gemv_mma_kernel (16 rows per block, its 8
        warps over K)."""
        n = weight.shape[0]
        self._go(K_gm.gemv_mma_kernel, K_gm.grid(n), K_gm.THREADS, x2, weight, b, out2, has_bias)

    def _one_token(self, mode: str, x: Any, nw: Any, eps: float, weight: Any, out: Any, bias: Any,
                   has_bias: bool) -> None:
        """kernels/linear/linear.py gemv_one_token for one token: x [1, K], weight [N, K] bf16 (16-byte
        aligned, K % 8 == 0), out [1, N] ([1, N / 2] for "swiglu"); nw / eps: the fused norm's
        (ignored by "plain")."""
        n, k = weight.shape
        mode, ways, blocks, warps = one_token_build(mode, n, k, self.sm_count)
        pairs = n // 2 if mode == "swiglu" else (n + 1) // 2
        per_block = warps // ways
        self._go(K_lin.gemv_one_token(mode, ways, blocks, warps), (pairs + per_block - 1) // per_block,
                 32 * warps, _rows(x, k), nw, np.float32(eps), weight, bias, out, np.int32(has_bias))

    def _bf16_copy(self, x2: Any) -> Any:
        """x2 [M, K] fp32 -> a bf16 (uint16 bits, RNE) scratch copy, the tensor-core GEMMs' A."""
        xb = self.empty(tuple(x2.shape), np.uint16)                      # [M, K] bf16 bits
        n = x2.size
        self._go(K_mma.f32_to_bf16_kernel, K_mma.cvt_grid(n), K_mma.CVT_THREADS, x2.reshape(-1), xb.reshape(-1))
        return xb

    def _gemm_bf16(self, xb: Any, weight: Any, out: Any, bias: Any = None, has_bias: Any = NO_BIAS) -> None:
        """out [M, N] fp32 = xb [M, K] bf16 @ weight [N, K]^T bf16 (+ bias) on the tensor cores:
        wgmma on cc 9.0 for M >= 256, mma.sync otherwise. K % 64 == 0, 16-byte aligned."""
        m, n = out.shape
        b = bias if bias is not None else out.reshape(-1)               # unused dummy
        if self.use_wgmma and m >= K_wg.MIN_M:
            self._go(K_wg.gemm_wgmma_kernel, K_wg.gemm_grid(m, n), K_wg.THREADS, xb, weight, b, out, has_bias,
                     smem=K_wg.SMEM_BYTES)
        else:
            self._go(K_mma.gemm_mma_kernel, K_mma.gemm_grid(m, n), K_mma.THREADS, xb, weight, b, out, has_bias)

