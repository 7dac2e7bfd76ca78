"""Linear layers on quantized weights (models/weights.py QuantizedWeight, quant/formats.py) on
the GPU. Records in the tiled device layout (quant/tiled.py: int4 / int8 groupwise, fp8
128 x 128 blocks; what engine/upload_policy.py uploads wherever it applies) take the
tensor-core decode GEMVs of kernels/linear/gemv_tiled.py for 1..16 tokens; canonical groupwise
records (shapes the tiled layout does not take) the SIMT GEMVs of kernels/linear/gemv_quant.py.
One-token GEMVs on tiled int4 rows of K >= 5120 take gemv_tiled.gemv_t1 (GEMV_T1, t1_build).
Prefill chunks (T > 16) dequantize the weight into a bf16 scratch matrix and run the dense bf16
path (tensor-core GEMMs). A GEMM that dequantizes tiles in shared memory is later work.
`LinearOps` (linear.py) routes quantized records here; `tiled_build` picks the GEMV build per
shape. Expert stacks [E, N, K] go to ops/cuda/moe.py.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import numpy as np

from ninfer_nb.errors import UnsupportedModelError
from ninfer_nb.kernels.linear import gemv_quant as K_q
from ninfer_nb.kernels.linear import gemv_tiled as K_t
from ninfer_nb.models.weights import DenseWeight, LinearWeight, QuantizedWeight, as_linear
from ninfer_nb.quant.tiled import TILE_ROWS, is_tiled, tile_cols

from .launch import F32, _need, _ptr, _rows
from .norm import Normed, NormOps
from .records import dense


def quant_record(w: QuantizedWeight, op: str) -> QuantizedWeight:
    """w itself when the kernels here read it (a tiled or canonical groupwise matrix);
    UnsupportedModelError else (other layouts, expert stacks)."""
    if (w.format.layout != "groupwise" and not is_tiled(w.format)) or w.ndim != 2:
        raise UnsupportedModelError(f"{op}: no CUDA kernel for {w.format.name} weights of shape {w.shape}")
    return w


def linear_record(weight: Any, op: str) -> DenseWeight | QuantizedWeight:
    """The record of a linear weight that the CUDA kernels read: a quantized matrix as it is
    (quant_record), else the dense record (records.dense refuses what has no kernel)."""
    w = as_linear(weight)
    return quant_record(w, op) if isinstance(w, QuantizedWeight) else dense(w, op)


def is_quantized(weight: LinearWeight | Any) -> bool:
    return isinstance(weight, QuantizedWeight)


def quant_build(mode: str, tokens: int, n: int, row_bytes: int, sm_count: int = 132,
                bits: int = 4) -> tuple[int, int, int]:
    """(K slices, warps per block, blocks per SM) of the gemv_quant build for an [n, K] weight
    whose rows hold `row_bytes` code bytes (`bits` per code). Normed and SwiGLU: whole rows.
    Plain: the number of K slices (1, 2, 4; at least one 512-byte step each) whose row-pair
    tasks fill the resident warps in the fewest waves of task length (a few-row weight such as
    the 27B's 5120 x 17408 has 2560 pairs for 1584-2112 resident warps: 4 slices make short
    waves instead of two long ones). Multi-token plain: 4 slices for up to 8192 rows (as the
    bf16 split-K GEMV), else 1."""
    if tokens > 1:
        ways = 4 if mode == "plain" and n <= 8192 and row_bytes >= 4 * K_q.STEP else 1
        return ways, 4, 3               # 4 tokens' accumulators and x: 168 registers, no spills
    blocks = K_q.one_token_blocks(bits, mode)
    if mode != "plain":
        return 1, 4, blocks
    slots = sm_count * 4 * blocks                       # resident warps
    pairs = (n + 1) // 2
    best, best_time = 1, float("inf")
    for ways in (1, 2, 4):
        if ways > 1 and ways * K_q.STEP > row_bytes:
            break
        waves = -(-pairs * ways // slots) / ways
        if waves < best_time:
            best, best_time = ways, waves
    return best, 4, blocks


# gemv_tiled.gemv_t1 for one token on dense weights: the kinds it takes (NINFER_GEMV_T1="i4,i8,fp8",
# "1": all, "0": none) and the shortest rows (by default int4 rows of K >= 5120: measured faster
# than gemv_tiled on the 27B shapes; the 8-bit kinds and the 35B's K <= 4096 not yet measured);
# for the MoE experts with NINFER_GEMV_T1_MOE=1 (not measured yet).
_T1_ENV = os.environ.get("NINFER_GEMV_T1")
GEMV_T1 = frozenset(("i4", "i8", "fp8") if _T1_ENV == "1" else
                    [v for v in (_T1_ENV or "i4").split(",") if v not in ("", "0")])
GEMV_T1_MIN_K = 5120 if _T1_ENV is None else 0
GEMV_T1_MOE = os.environ.get("NINFER_GEMV_T1_MOE", "0") == "1"
SMEM_PER_SM = 228 * 1024           # shared memory of an SM (cc 9.0); each block also takes 1 KB + its static part


T1_IN_FLIGHT = 6 << 20             # bytes of weight copies in flight that keep HBM busy (assumed)


@lru_cache(maxsize=None)
def t1_build(mode: str, n: int, k: int, kind: str, zp: bool = False, split: bool = False,
             sm_count: int = 132) -> tuple[int, int, int, int] | None:
    """(K slices, warps per block, ring stages, blocks per SM) of the gemv_t1 build for an [n, k]
    weight: blocks of 8 warps, up to 3 per SM (registers), fewer where the staged x and the rings
    take more shared memory. Of the stage counts (8 .. 3) and K slices (1 .. 8; each slice at
    least a ring of K-tiles) the one that keeps the most weight bytes in flight (up to
    T1_IN_FLIGHT: stages - 1 K-tiles of 1 KB per resident warp) with the least tail (a last
    wave of blocks on part of the SMs), the fewest slices among equals. None when no block fits
    in an SM's shared memory (rows too long to stage)."""
    warps = 8
    nt = -(-n // TILE_ROWS)
    pairs = nt // 2 if "swiglu" in mode else (nt + 1) // 2
    kts = k // tile_cols(4 if kind == "i4" else 8)
    best: tuple[int, int, int, int] | None = None
    best_eff = -1.0
    for stages in range(8, 2, -1):
        per_block = K_t.t1_smem(kind, zp, split, warps, stages, k) + 1024 + 256
        bps = min(SMEM_PER_SM // per_block, 3)
        if bps == 0:
            continue
        slots = sm_count * bps
        for ways in (1, 2, 4, 8):
            if ways > 1 and ways * stages > kts:
                break
            blocks = -(-pairs // (warps // ways))
            waves = -(-blocks // slots)
            flight = min(blocks, slots) * warps * (stages - 1) * 1024
            eff = min(1.0, flight / T1_IN_FLIGHT) * blocks / (waves * slots) if waves > 1 else \
                min(1.0, flight / T1_IN_FLIGHT)
            if eff > best_eff + 1e-9:
                best, best_eff = (ways, warps, stages, 3), eff
    return best


def t1_moe_build(experts: str, k_all: int, kind: str) -> tuple[int, int, int, int]:
    """(K slices, warps, stages, blocks per SM) of the MoE gemv_t1 builds: blocks of 8 warps, an
    8-stage ring, K slices of at least 8 K-tiles (gate_up up to 4, down up to 8: the few long
    rows of the slots' concatenated K)."""
    kts = k_all // tile_cols(4 if kind == "i4" else 8)
    ways = 8 if experts == "down" else 4
    while ways > 1 and kts < 8 * ways:
        ways //= 2
    return ways, 8, 8, 3


def tiled_kind(q: QuantizedWeight) -> tuple[str, bool, bool]:
    """(kind, zero points, split) of a tiled record: the gemv_tiled build's format part."""
    fmt = q.format
    if fmt.layout == "fp8-block-tiled":
        return "fp8", False, False
    return ("i4" if fmt.bits == 4 else "i8"), fmt.zero_points, fmt.bits == 4 and fmt.group_size == 32


def moe_build(experts: str, n: int, k_all: int, kind: str, slots: int, sm_count: int = 132) -> tuple[int, int, int]:
    """(K slices, warps, blocks per SM) of the MoE gemv_tiled builds: gate_up 4 K slices per tile
    pair (slots x I / 16 pairs: 288 for the 35B, too few to fill the GPU whole); down 8 K slices of the slots'
    concatenated rows in blocks of 8 warps (H / 32 tile pairs: few, long tasks)."""
    if experts == "gate_up":
        return 4, 4, 3
    return 8, 8, 1


def tiled_build(mode: str, tokens: int, n: int, k: int, kind: str, sm_count: int = 132,
                heavy: bool = False) -> tuple[int, int, int]:
    """(K slices, warps per block, blocks per SM) of the gemv_tiled build for an [n, k] weight:
    blocks of 4 warps (150-160 registers with the next pass's loads in flight: 3 blocks per SM
    for up to 8 tokens, 2 for 16); the
    number of K slices (1, 2, 4; each at least one pass of K-tiles) whose tile-pair tasks fill
    the resident warps in the fewest waves of a whole row's time (a few-row weight such as the
    27B's 5120 x 17408 has 160 tile pairs for 2112 resident warps: 4 slices). `heavy` (zero
    points or int4 groups of 32: more words per K-tile in flight) takes 2 blocks (no spills)."""
    warps, blocks = 4, (3 if tokens <= 8 and not heavy else 2)
    nt = -(-n // TILE_ROWS)
    pairs = nt // 2 if "swiglu" in mode else (nt + 1) // 2
    kts = k // tile_cols(4 if kind == "i4" else 8)
    slots = sm_count * warps * blocks
    best, best_time = 1, float("inf")
    for ways in (1, 2, 4):
        if ways > 1 and ways * K_t.UNROLL > kts:
            break
        waves = -(-pairs * ways // slots) / ways
        if waves < best_time - 1e-9:
            best, best_time = ways, waves
    if blocks == 3 and pairs * best <= 2 * warps * sm_count:
        blocks = 2                  # one wave at 2 blocks: the 2-block build holds its loads without spills
    return best, warps, blocks


class QuantLinearOps(NormOps):
    def embedding(self, table: Any, ids: Any) -> Any:
        """NormOps.embedding, and the rows of a tiled quantized table (a GGUF / converted
        checkpoint's quantized embedding stays quantized on the GPU): [T, H] fp32."""
        if not (isinstance(table, QuantizedWeight) and is_tiled(table.format)):
            return super().embedding(table, ids)
        _need(ids.dtype == np.int32, "embedding: ids must be int32")
        kind, zp, _ = tiled_kind(table)
        t, h = ids.shape[0], table.shape[1]
        out = self.empty((t, h))                                            # [T, H] fp32
        if t:
            scales = table.arrays["scales"].reshape(-1).view(np.uint32)
            zeros = table.arrays["zeros"].reshape(-1) if zp else scales
            self._go(K_t.embedding_tiled_kernel, (-(-h // K_t.EMBED_THREADS), t), K_t.EMBED_THREADS,
                     table.arrays["codes"].reshape(-1).view(np.uint32), scales, zeros,
                     np.int32(K_t.KINDS.index(kind)), np.int32(zp), np.int32(table.format.group_size.bit_length() - 1),
                     np.int32(table.shape[0]), ids.reshape(-1), out)
        return out

    def _linear_into(self, x: Any, w: Any, bias: Any, out2: Any) -> None:
        raise NotImplementedError            # LinearOps' dense path (the prefill fallback)

    def _quant_into(self, x: Any, q: QuantizedWeight, bias: Any, out2: Any) -> None:
        """out2 [T, N] = x @ dequantize(q)^T (+ bias [N]); bias may alias out2 when T == 1.
        Up to 16 tokens of fp32 x (16-byte aligned): the quantized GEMVs (a Normed token: the
        RMSNorm fused in); else dequantize into bf16 and take the dense path."""
        n, k = q.shape
        aligned = _ptr(q.arrays["codes"]) % 16 == 0
        if isinstance(x, Normed):
            if aligned and _ptr(x.x) % 16 == 0:
                self._quant_gemv("normed", 1, x.x, x.weight, x.eps, q, bias, out2)
                return
            x = self.plain(x)
        x2 = _rows(x, k)
        t = x2.shape[0]
        if aligned and t <= K_q.MAX_TOKENS and x2.dtype == F32 and _ptr(x2) % 16 == 0:
            self._quant_gemv("plain", 1 if t == 1 else 4, x2, x2.reshape(-1), 1.0, q, bias, out2)
            return
        with self.scope():                  # the bf16 copy [N, K] is handed back after its GEMM
            self._linear_into(x, DenseWeight(self._dequant_bf16(q), "bf16"), bias, out2)

    def _quant_swiglu(self, x: Any, q: QuantizedWeight) -> Any:
        """swiglu(linear(x, q)) for a quantized gate_up [2I, K]: the SwiGLU GEMV for one normed
        token or up to 16 tokens, else linear + swiglu."""
        two_i, k = q.shape
        _need(x.shape[-1] == k and two_i % 2 == 0, f"linear_swiglu: x {x.shape} vs weight {q.shape}")
        aligned = _ptr(q.arrays["codes"]) % 16 == 0 and (not is_tiled(q.format) or two_i % (2 * TILE_ROWS) == 0)
        if isinstance(x, Normed):
            if aligned and _ptr(x.x) % 16 == 0:
                out = self.empty((1, two_i // 2))                                   # [1, I]
                self._quant_gemv("swiglu", 1, x.x, x.weight, x.eps, q, None, out)
                return out.reshape(tuple(x.shape[:-1]) + (two_i // 2,))
            x = self.plain(x)
        x2 = _rows(x, k)
        t = x2.shape[0]
        if not (aligned and 0 < t <= K_q.MAX_TOKENS and x2.dtype == F32 and _ptr(x2) % 16 == 0):
            lin = self.empty((t, two_i))                                            # [T, 2I]
            self._quant_into(x2, q, None, lin)
            return self.swiglu(lin.reshape(tuple(x.shape[:-1]) + (two_i,)))
        out = self.empty((t, two_i // 2))                                           # [T, I]
        self._quant_gemv("swiglu", 4, x2, x2.reshape(-1), 1.0, q, None, out)
        return out.reshape(tuple(x.shape[:-1]) + (two_i // 2,))

    def _quant_gemv(self, mode: str, tokens: int, x2: Any, nw: Any, eps: float, q: QuantizedWeight, bias: Any,
                    out2: Any) -> None:
        """Launch the quantized GEMV for `mode` / `tokens` (1: one token, "swiglu" with the norm
        fused in; 4: up to 16 tokens): gemv_tiled on a tiled record, else gemv_quant."""
        if is_tiled(q.format):
            self._tiled_gemv(("normed_swiglu" if tokens == 1 else "swiglu") if mode == "swiglu" else mode,
                             x2, nw, eps, q, bias, out2)
            return
        fmt = q.format
        codes = q.arrays["codes"]
        n = q.shape[0]
        ways, warps, blocks = quant_build(mode, tokens, n, codes.shape[1], self.sm_count, fmt.bits)
        pairs = n // 2 if mode == "swiglu" else (n + 1) // 2
        per_block = warps // ways
        zeros = q.arrays["zeros"] if fmt.zero_points else codes           # unused dummy when no zero points
        b = bias if bias is not None else out2.reshape(-1)                 # unused dummy when has_bias == 0
        self._go(K_q.gemv_quant(fmt.bits, mode, tokens, ways, warps, blocks), -(-pairs // per_block), 32 * warps,
                 x2, nw, np.float32(eps), codes, q.arrays["scales"].view(np.uint16), zeros,
                 np.int32(fmt.group_size.bit_length() - 1), np.int32(fmt.zero_points), b, out2,
                 np.int32(bias is not None))

    def _tiled_gemv(self, mode: str, x2: Any, nw: Any, eps: float, q: QuantizedWeight, bias: Any, out2: Any,
                    ids: Any = None, ew: Any = None, experts: str = "", grid_y: int = 1) -> None:
        """kernels/linear/gemv_tiled.py for a tiled record (tiled_build picks the build; MoE
        builds pass ids / ew, the expert mode and the slots as grid_y)."""
        kind, zp, split = tiled_kind(q)
        n, k = q.shape[-2:]
        t = x2.shape[0]
        if (GEMV_T1_MOE and experts) or (kind in GEMV_T1 and not experts and t == 1 and k >= GEMV_T1_MIN_K
                                          and t1_build(mode, n, k, kind, zp, split, self.sm_count) is not None):
            self._t1_gemv(mode, x2, nw, eps, q, bias, out2, ids, ew, experts, grid_y)
            return
        if experts:
            ways, warps, blocks = moe_build(experts, n, x2.shape[1], kind, grid_y, self.sm_count)
        else:
            ways, warps, blocks = tiled_build(mode, t, n, k, kind, self.sm_count, zp or split)
        nt = -(-n // TILE_ROWS)
        pairs = nt // 2 if "swiglu" in mode else (nt + 1) // 2
        codes = q.arrays["codes"].reshape(-1).view(np.uint32)
        scales = q.arrays["scales"].reshape(-1).view(np.uint32)
        zeros = q.arrays["zeros"].reshape(-1) if zp else scales            # unused dummy without zero points
        b = bias if bias is not None else out2.reshape(-1)                 # unused dummy when has_bias == 0
        if ids is None:
            ids, ew = self._tiled_dummies()
        gshift = q.format.group_size.bit_length() - 1
        ntg = 1 if t <= 8 or experts else 2
        self._go(K_t.gemv_tiled(kind, zp, split, mode, ntg, ways, warps, blocks, experts, q.format.group_size),
                 (-(-pairs // (warps // ways)), grid_y), 32 * warps, x2, nw, np.float32(eps), codes, scales, zeros,
                 np.int32(gshift), np.int32(n), np.int32(k), b, out2, np.int32(bias is not None), ids, ew)

    def _t1_gemv(self, mode: str, x2: Any, nw: Any, eps: float, q: QuantizedWeight, bias: Any, out2: Any,
                 ids: Any = None, ew: Any = None, experts: str = "", grid_y: int = 1) -> None:
        """kernels/linear/gemv_tiled.py gemv_t1 on a tiled record: one token, or the MoE builds
        (one x row per block: any number of tokens)."""
        kind, zp, split = tiled_kind(q)
        n, k = q.shape[-2:]
        k_all = x2.shape[1]
        if experts:
            ways, warps, stages, blocks = t1_moe_build(experts, k_all, kind)
        else:
            build = t1_build(mode, n, k, kind, zp, split, self.sm_count)
            assert build is not None
            ways, warps, stages, blocks = build
        nt = -(-n // TILE_ROWS)
        pairs = nt // 2 if "swiglu" in mode else (nt + 1) // 2
        scales = q.arrays["scales"].reshape(-1).view(np.uint32)
        if ids is None:
            ids, ew = self._tiled_dummies()
        self._go(K_t.gemv_t1(kind, zp, split, mode, ways, warps, stages, blocks, q.format.group_size, experts),
                 (-(-pairs // (warps // ways)), grid_y), 32 * warps, x2, nw, np.float32(eps),
                 q.arrays["codes"].reshape(-1).view(np.uint32), scales,
                 q.arrays["zeros"].reshape(-1) if zp else scales, np.int32(q.format.group_size.bit_length() - 1),
                 np.int32(n), np.int32(k), bias if bias is not None else out2.reshape(-1), out2,
                 np.int32(bias is not None), ids, ew, smem=K_t.t1_smem(kind, zp, split, warps, stages, k_all))

    def _tiled_dummies(self) -> tuple[Any, Any]:
        """Typed placeholders for the MoE arguments of the dense gemv_tiled builds (never read)."""
        d = getattr(self, "_tiled_dummy", None)
        if d is None:
            d = (self.zeros((1, 1), np.int32, persistent=True), self.zeros((1, 1), np.float32, persistent=True))
            self._tiled_dummy = d
        return d

    def _dequant_bf16(self, q: QuantizedWeight) -> Any:
        """dequantize(q) as a bf16 (uint16 bits) scratch matrix [N, K] (the prefill GEMMs' B)."""
        fmt = q.format
        codes = q.arrays["codes"]
        wb = self.empty(tuple(q.shape), np.uint16)                         # [N, K] bf16 bits
        if is_tiled(fmt):
            kind, zp, _ = tiled_kind(q)
            scales = q.arrays["scales"].reshape(-1).view(np.uint32)
            zeros = q.arrays["zeros"].reshape(-1) if zp else scales
            self._go(K_t.dequant_tiled_bf16_kernel, K_t.dequant_grid(codes.size), K_t.DEQUANT_THREADS,
                     codes.reshape(-1).view(np.uint32), scales, zeros, np.int32(K_t.KINDS.index(kind)), np.int32(zp),
                     np.int32(fmt.group_size.bit_length() - 1), wb)
            return wb
        zeros = q.arrays["zeros"] if fmt.zero_points else codes
        self._go(K_q.dequant_bf16_kernel, K_q.dequant_grid(codes.size), K_q.DEQUANT_THREADS, codes,
                 q.arrays["scales"].view(np.uint16), zeros, np.int32(fmt.group_size.bit_length() - 1),
                 np.int32(fmt.zero_points), np.int32(fmt.bits), wb)
        return wb
