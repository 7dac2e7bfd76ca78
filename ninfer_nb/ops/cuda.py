"""CUDA backend of the op interface: same names and signatures as `ops/cpu.py`, over device
Tensors (fp32 activations, bf16 or fp32 weights, fp32 GDN/conv state, fp32 or bf16 KV cache).

`CudaOps(scratch, stream)` is the `ops` object a model receives: outputs come from the
per-step `ScratchArena` (reset by the runner at the start of each step, so addresses repeat
and the step is graph-capturable), kernels launch on the engine stream. Index inputs (ids,
positions) must be int32 device tensors. Functions documented in ops/cpu.py as in-place
(kv_store, causal_conv1d state, gated_delta_rule state) are in place here too.
`normed` of one token returns a `Normed` record that the decode kernels normalise as they read
it (ops/cpu.py computes it at once); `plain` materialises one for a consumer without such a
kernel. Extras beyond ops/cpu.py: plain, add_rms_norm, argmax, sample, apply_penalties,
count_tokens, empty/zeros/from_numpy/to_numpy, and `upload_weights`.
Under NUMBA_ENABLE_CUDASIM=1, pass a `HostArena` and `SimStream`: tensors are NumPy arrays and
kernels that need warp shuffles / inline PTX are replaced by their simulator-safe siblings.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
from numba import config

from ninfer_nb.kernels import elementwise as K_ew
from ninfer_nb.kernels import embedding as K_emb
from ninfer_nb.kernels import norm as K_norm
from ninfer_nb.kernels import sampling as K_smp
from ninfer_nb.kernels.attention import attention as K_attn
from ninfer_nb.kernels.attention import attention_decode_mma as K_adm
from ninfer_nb.kernels.attention import attention_flash as K_fa
from ninfer_nb.kernels.attention import attention_gemm as K_ag
from ninfer_nb.kernels.attention import rope as K_rope
from ninfer_nb.kernels.gdn import conv1d as K_conv
from ninfer_nb.kernels.gdn import gdn as K_gdn
from ninfer_nb.kernels.gdn import gdn_chunked as K_gdc
from ninfer_nb.kernels.gdn import gdn_chunked_mma as K_gdm
from ninfer_nb.kernels.gdn import gdn_decode as K_gdd
from ninfer_nb.kernels.gdn import gdn_prepare_mma as K_gdp
from ninfer_nb.kernels.linear import gemm_mma as K_mma
from ninfer_nb.kernels.linear import gemm_wgmma as K_wg
from ninfer_nb.kernels.linear import linear as K_lin
from ninfer_nb.kernels.moe import moe as K_moe
from ninfer_nb.kernels.moe import moe_grouped as K_moeg
from ninfer_nb.kernels.moe import moe_pipelined as K_moep
from ninfer_nb.kernels.moe import moe_wgmma as K_moew
from ninfer_nb.runtime.launch import Launcher, NotDeviceArgs
from ninfer_nb.runtime.tensor import Tensor, bfloat16

SIM = bool(config.ENABLE_CUDASIM)
DECODE_MAX_T = 4          # attention: split-K decode kernel up to this many query tokens
ATTENTION_KINDS = ("flash", "gemm", "simt", "mma")    # prefill attention kernels (CudaOps docstring)
ATTN_GEMM_BYTES = 1 << 30  # prefill attention via GEMMs: S + P of one row block stay under this
# Opt-in kernels (name: what), off until a GPU run shows they win, or earlier builds kept for
# A/B runs (bench --experimental NAME; an unknown name lists them). Promoted after the
# H200 run of 2026-11-29 (fifth session): the one-launch decode router
# (moe_router_fused_kernel, 10.6 -> 10.3 us and one launch less per 35B layer) and the
# SwiGLU-epilogue GEMV (gemv_bf16_swiglu_kernel, 89.2 -> 86.3 us per 27B MLP). Promoted after
# a later H200 run that day: the GDN output norm one warp per row (norm.gated_rms_norm_warp_kernel,
# 98304x128: 200.9 -> 52.6 us) and split on a 2-D grid (elementwise.split_rows_kernel,
# T = 2048: 162.3 -> 139.3 us); swiglu on a 2-D grid (279.9 -> 283.3 us) was dropped.
# Dropped after its H200 run of 2026-11-30 (twelfth session): attn_tiled, decode attention with a
# block per (split, kv head) over cp.async-staged K / V tiles (27B 8K fp32 60.3 vs 56.2 us,
# bf16 49.5 vs 50.7; 512 keys 13.3 vs 11.5; both models' decode no faster). Dropped after its
# H200 run of 2026-11-30 (thirteenth session): attn_vec, the split kernel with 16-byte K / V
# loads (35B heads at 8K: fp32 36.4 vs 37.6 us, bf16 32.9 vs 35.1; 27B heads bf16 63.6 vs 51.1;
# decode 35B 381.6 / 358.0 vs 388.4 / 350.7 tok/s at 512 / 8K, 27B 70.4 / 67.4 vs 70.7 / 67.5).
# Promoted after its H200 runs of 2026-11-30 (fourteenth session, the kernel built per head
# dim with its loads batched): attn_mma, decode attention on tensor cores for bf16 KV caches
# (kernels/attention/attention_decode_mma.py), with bf16 the CUDA backend's default cache. Split +
# combine vs the SIMT kernel on the same bf16 cache: 35B heads 16.9 vs 34.8 us at 8K keys,
# 9.2 vs 8.7 at 512; 27B heads 19.5 vs 51.0 and 8.9 vs 10.2. Decode 35B 390.3 / 376.8 tok/s
# at 512 / 8K (fp32 cache 389.8 / 354.0), 27B 70.6 / 68.9 (69.6 / 66.9).
# Promoted after its H200 runs of 2026-11-30 (sixteenth session): the one-token decode GEMVs
# (kernels/linear/linear.py gemv_one_token, one_token_build below). Decode tok/s at 512 / 8K, one
# machine: 35B 406.3 / 388.3 vs 395.8 / 380.2, 27B 72.8 / 71.8 vs 70.8 / 69.7. Dropped in the
# same session: the general decode GEMVs built for 3 blocks per SM (80 registers; every shape
# slower, 35B 359.0 / 363.9 vs 390.1 / 394.5 tok/s at 512).
# Promoted after their H200 runs of 2026-11-30 (seventeenth session): the one-token GEMVs of
# rows longer than 4096 in blocks of 4 warps, and whole rows in one wave for the 27B's 5120-row
# plain weights (one_token_build). 27B decode tok/s at 512 / 8K, one machine: 74.0 / 72.2 vs
# 72.8 / 71.4 (4 warps alone 73.7 / 72.0). The 35B keeps 8-warp blocks (one_token_build says
# why). Dropped in the same session: plain GEMVs at 2 blocks per SM everywhere (27B 72.7 /
# 72.6 vs 71.7 / 72.5 tok/s at 512: noise); normed and SwiGLU ones at 5 blocks of 4 warps (96
# registers, no spills) instead of 4: chain 192.7 vs 186.6 us per layer, 27B 72.5 / 72.5 vs
# 74.7 / 74.6 tok/s at 512.
EXPERIMENTAL: dict[str, str] = {
    "gemv_x8": "the one-token decode GEMVs in 8-warp blocks at every shape, for A/B runs "
               "(ops/cuda.py one_token_build_x8)",
}
# Prefill MoE on the pipelined GEMMs (kernels/moe/moe_wgmma.py on cc 9.0, else moe_pipelined.py)
# from this many routed pairs (T * k) up; fewer keep moe_grouped.py's GEMMs. H200, 35B shape,
# the whole op: T = 2048, k = 9: wgmma 1.02, pipelined 1.40, grouped 3.38 ms; T = 512, k = 8:
# 0.68 / 1.00 / 1.84 ms; 140-280 pairs (pipelined): slower than grouped (more launches).
MOE_PIPELINED_MIN_PAIRS = 1024
# The TF32 GDN prepare kernel (gdn_prepare_mma.py) by default from this key head dim up. Below the
# chunk length (64) a chunk's keys are linearly dependent, and (I + A)^-1 likely amplifies TF32
# rounding (a hypothesis; the measurement is this):
# H200, tiny Qwen3.5 with Dk = 32, the logits moved 2.5-3.4e-2 of the max logit from the CPU
# (8e-3 with the fp32 prepare kernel; one greedy token changed), against 6e-4 output error at the
# 27B shape (Dk = 128) in the kernel test.
GDN_PREPARE_MMA_MIN_DK = 64
# Split-K decode GEMV (4 K slices per row pair) for 2-16 tokens (one token: one_token_build) and
# weights with at most SPLITK_MAX_N rows and at least SPLITK_MIN_K columns. H200, T = 1 (before
# the one-token GEMVs), in the 27B profile: 5120x17408 85 % -> 93 % of copy bandwidth; 5120x6144
# 79 % -> 70 % and 2048x4096 65 % -> 57 % (slower), hence the K floor.
SPLITK_MAX_N = 8192
SPLITK_MIN_K = 12288
# The 2-slice variant (8 rows per block) for K from SPLITK2_MIN_K up to SPLITK_MIN_K. H200, T = 1,
# graph-timed: 5120x6144 20.4 -> 19.9 us (whole rows -> 2 slices; 4 slices 23.2), 2048x4096
# 7.2 -> 6.6 us (4 slices 7.7).
SPLITK2_MIN_K = 4096
# MoE decode expert kernels with more loads in flight per lane (kernels/moe/moe.py), for up
# to this many tokens. H200, 35B profile: 1.04 -> 0.92 ms per decode token; at T = 4 the
# kernel test timed them slower than the plain pair, so batches keep the plain kernels.
MOE_UNROLLED_MAX_T = 1
# The decode router as one thread-block cluster (kernels/moe/moe.py moe_router_cluster_kernel, cc >=
# 9.0, up to 256 routed experts) instead of the arrival-counter kernel. H200, 35B shape
# (scripts/moe_probe.py, 8 layers of distinct weights in a graph): router 9.2 -> 7.9 us, MoE
# block 28.0 -> 27.0 us.
ROUTER_CLUSTER = True
# The GDN mixer's decode middle (conv + gated delta rule + gated norm) as one kernel
# (kernels/gdn/gdn_decode.py, cc >= 9.0: clusters of the value heads that share a key head) instead of
# three launches. H200, graph-timed (tests/kernels test_gdn_decode): 35B shape 8.6 -> 6.9 us,
# 27B shape 9.2 -> 7.4 us; with the warp's 4 state rows reduced together (seventeenth
# session) 6.4 and 7.0 us against the three launches' 8.7 and 9.2.
GDN_DECODE_FUSED = True
F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)


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
    whole rows at 2 blocks.

    H200 (seventeenth session): scripts/chain_probe.py, the 27B GDN layer's four GEMVs
    graph-timed in model order over 4 layers of distinct weights: 193.7 us per layer with the
    8-warp builds, 190.5 with 4 warps, 187.3 with 4 warps and the one-wave rows at 5 blocks
    (190.4 at 6); 2 warps 192.0. Decode on one machine, against all-8-warp builds (bench
    --experimental gemv_x8): 27B 73.4 / 73.4 vs 70.9 / 71.1 tok/s at 512; 35B with 4-warp
    builds for its shapes too 389.8 / 398.3 / 391.6 vs 395.9 / 400.4 / 395.1 (at 8K 374.2 /
    382.0 / 374.4 vs 377.1 / 383.4 / 377.2), hence 8 warps there. The 8-warp builds (sixteenth
    session, scripts/gemv_probe.py, best of 1 / 2 / 4 / 8 slices x 2 / 3 / 4 blocks): 27B
    5120x17408 48.9 -> 46.1 us against the split-K kernel, 35B lm_head 248320x2048 273 -> 236."""
    if k <= 4096:
        return one_token_build_x8(mode, n, k)
    warps = 4
    if mode == "plain":
        if 4 * sm_count <= -(-((n + 1) // 2) // warps) <= 5 * sm_count:     # one wave of whole rows
            return mode, 1, 5, warps
        return mode, 2, (6 if n * k >= 32 << 20 else 4), warps
    return mode, 1, 4, warps


def one_token_build_x8(mode: str, n: int, k: int) -> tuple[str, int, int, int]:
    """one_token_build's 8-warp builds (short rows; every shape under bench --experimental
    gemv_x8): plain 2 K slices at 3 blocks per SM from 32 M weights up, else 2; normed and
    SwiGLU whole rows at 2."""
    if mode == "plain":
        return mode, 2, (3 if n * k >= 32 << 20 else 2), 8
    return mode, 1, 2, 8


@dataclass(frozen=True)
class Normed:
    """rms_norm(x, weight, eps) of one token's residual row, left for the consumer to compute
    (`CudaOps.normed`): the decode GEMVs, the router and the MoE gate_up scale x by the norm
    weight as they stream it and apply 1 / rms at the end (kernels/linear/linear.py
    gemv_one_token "normed"), so the norm costs no launch. Consumers without such a kernel
    call `CudaOps.plain` first."""
    x: Any          # [1, H] fp32 device tensor (the residual stream)
    weight: Any     # [H] fp32
    eps: float

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape)

    @property
    def size(self) -> int:
        return int(self.x.size)


def _kv(t: Any) -> Any:
    """Kernel-facing view: NumPy bf16 arrays become uint16 (Tensors already export '<u2')."""
    if isinstance(t, np.ndarray) and t.dtype == bfloat16:
        return t.view(np.uint16)
    return t


def _ptr(t: Any) -> int:
    return t.ptr if isinstance(t, Tensor) else int(t.ctypes.data)


def _rows(t: Any, d: int) -> Any:
    return t.reshape(-1, d)


def _part_bounds(sizes: tuple[int, ...], slots: int) -> list[int]:
    """The inner boundaries of `sizes` laid side by side, padded with the total to `slots`
    entries (the split kernels' b1, b2, ...: a part past the last real one is empty)."""
    total = sum(sizes)
    return [sum(sizes[:i + 1]) for i in range(len(sizes) - 1)] + [total] * (slots - len(sizes) + 1)


def _flat_parts(flat: Any, t: int, sizes: tuple[int, ...]) -> tuple[Any, ...]:
    """Views [T, size_i] of the parts a split kernel wrote back to back into flat [T * sum]."""
    parts, off = [], 0
    for size in sizes:
        parts.append(flat[off * t:(off + size) * t].reshape(t, size))
        off += size
    return tuple(parts)


def _decode_sized(t: int) -> bool:
    """Whether T query tokens take the split-K decode attention (which also applies an output
    gate in its combine kernel) rather than a prefill kernel."""
    return 0 < t <= DECODE_MAX_T and not SIM


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def unsupported_shapes(cfg: Any) -> list[str]:
    """What in a model config (config.ModelConfig) the CUDA kernels cannot run, one line each
    ("parameter=value: the kernel's need"); empty when the model runs. The shape limits of the
    `_need` checks below that depend on the config alone, so a model is refused at load
    (check_model) instead of failing every request. A pure function: no device needed."""
    bad = []
    if cfg.hidden_size > K_norm.MAX_D:                                   # add_rms_norm
        bad.append(f"hidden_size={cfg.hidden_size}: the CUDA backend's fused residual norm takes rows "
                   f"up to {K_norm.MAX_D}")
    if any(cfg.is_full_attention(i) for i in range(cfg.num_layers)):     # attention
        if cfg.head_dim > K_attn.MAX_D:
            bad.append(f"head_dim={cfg.head_dim}: the CUDA backend's attention takes head dims up to "
                       f"{K_attn.MAX_D}")
        if cfg.num_kv_heads <= 0 or cfg.num_heads % cfg.num_kv_heads:
            bad.append(f"num_key_value_heads={cfg.num_kv_heads}: the CUDA backend's attention needs a "
                       f"divisor of num_attention_heads={cfg.num_heads}")
    if cfg.is_hybrid and not all(cfg.is_full_attention(i) for i in range(cfg.num_layers)):   # GDN
        dk, max_dk = cfg.linear_key_head_dim, 32 * K_gdn.MAX_KPL
        if dk % 32 or not 0 < dk <= max_dk:                              # _gdr_recurrent
            bad.append(f"linear_key_head_dim={dk}: the CUDA backend's gated delta rule needs a multiple "
                       f"of 32 up to {max_dk}")
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        if hk <= 0 or hv % hk:                                           # gated_delta_rule_chunked
            bad.append(f"linear_num_value_heads={hv}: the CUDA backend's gated delta rule needs a "
                       f"multiple of linear_num_key_heads={hk}")
        if cfg.linear_conv_kernel_dim > K_conv.MAX_K:                    # causal_conv1d
            bad.append(f"linear_conv_kernel_dim={cfg.linear_conv_kernel_dim}: the CUDA backend's causal "
                       f"conv1d takes kernels up to {K_conv.MAX_K} wide")
    if cfg.is_moe:
        top_k, n_exp = cfg.num_experts_per_tok, cfg.num_experts
        if n_exp > K_moe.ROUTE_MAX_E:                                    # moe_route
            bad.append(f"num_experts={n_exp}: the CUDA backend's MoE router takes up to "
                       f"{K_moe.ROUTE_MAX_E} experts")
        if not 0 < top_k <= min(K_moe.MAX_TOPK - 1, n_exp):
            bad.append(f"num_experts_per_tok={top_k}: the CUDA backend's MoE router takes 1 to "
                       f"{min(K_moe.MAX_TOPK - 1, n_exp)}")
        for name, value in (("hidden_size", cfg.hidden_size), ("moe_intermediate_size", cfg.moe_intermediate_size)):
            if value % 2:                                                # _moe_experts_grouped
                bad.append(f"{name}={value}: the CUDA backend's MoE expert GEMMs need an even size")
    return bad


def check_model(cfg: Any) -> None:
    """Raise UnsupportedModelError naming every config value the CUDA kernels cannot run."""
    bad = unsupported_shapes(cfg)
    if bad:
        from ninfer_nb.errors import UnsupportedModelError

        raise UnsupportedModelError("; ".join(bad) + "; use --device cpu")


class SimStream:
    """Stand-in for runtime.stream.Stream under the CUDA simulator."""

    numba = 0

    def synchronize(self) -> None:
        pass


class CudaOps:
    def __init__(self, scratch: Any, stream: Any, persistent: Any = None,
                 arch: tuple[int, int] | None = None, sm_count: int = 132, prefill_gemm: str = "auto",
                 prefill_attention: str = "flash") -> None:
        """arch: the device's compute capability; sm_count: its multiprocessors (sizes the
        decode attention split grid); prefill_gemm: auto (wgmma on cc 9.0, else
        mma.sync), mma, or wgmma (cc 9.0 only); prefill_attention: flash (mma.sync flash
        kernel with ldmatrix / cp.async, kernels/attention/attention_flash.py: head dim 256 on cc >= 8.0,
        else as gemm), gemm (S and P through the tensor-core GEMMs, bf16 Q/K/V/P; head dims
        % 64, else simt), simt (fp32 flash kernel on CUDA cores) or mma (the first mma.sync
        flash kernel, kernels/attention/attention.py; measured slower than simt on the H200)."""
        _need(prefill_gemm in ("auto", "mma", "wgmma"), f"prefill_gemm: {prefill_gemm!r}")
        _need(prefill_attention in ATTENTION_KINDS, f"prefill_attention: {prefill_attention!r}")
        self.prefill_attention = prefill_attention
        self.arch = None if arch is None else tuple(arch)
        self.sm_count = sm_count
        hopper = arch is not None and tuple(arch) == (9, 0)
        _need(prefill_gemm != "wgmma" or hopper, f"prefill_gemm=wgmma needs a cc 9.0 GPU (this is {arch})")
        self.scratch = scratch
        self.stream = stream
        self.persistent = persistent
        self.use_wgmma = hopper and prefill_gemm != "mma"
        # Names from EXPERIMENTAL turned on (kernels not yet validated on a GPU); bench
        # --experimental.
        self.experimental: frozenset[str] = frozenset()
        # Decode attention: "auto" (tensor cores on bf16 caches where the shape allows,
        # kernels/attention/attention_decode_mma.py; else the per-q-head SIMT split kernel) or "simt"
        # (always the SIMT kernel: A/B runs, bench --decode-attention simt).
        self.decode_attention = "auto"
        self._router_counter: Any = None   # fused_router's arrival counter [1] int32 (persistent)
        self._launchers: dict[str, Launcher] = {}                     # kernel name -> direct launcher
        self._cluster_ok: dict[tuple[str, int], bool] = {}           # (kernel, cluster size) -> launchable
        self._cu_stream = None if SIM else stream.cu                  # CUstream for cuLaunchKernel
        # Programmatic dependent launch (cc >= 9.0) inside `programmatic_launches()`: a kernel
        # that directly follows another kernel of ours on the stream is launched with the PDL
        # attribute. `_after_kernel` is False after a memset or copy, which keep plain order.
        self._pdl = False
        self._after_kernel = False
        # Chunked GDN state passing: "mma" (TF32 tensor cores, kernels/gdn/gdn_chunked_mma.py) where
        # the key head dim allows it, else "simt" (fp32 FMAs, gdn_chunked.gdc_state_kernel).
        self.gdn_state = "mma"
        # Its chunk-parallel prepare kernel: "mma" (TF32 tile products, kernels/gdn/gdn_prepare_mma.py)
        # where the head dims and alignment allow it, "simt" (fp32, gdn_chunked.gdc_prepare_kernel),
        # or "auto": mma from GDN_PREPARE_MMA_MIN_DK up, simt below.
        self.gdn_prepare = "auto"

    # --- buffers ---------------------------------------------------------------------
    def empty(self, shape: Any, dtype: Any = np.float32) -> Any:
        return self.scratch.empty(tuple(shape) if not isinstance(shape, int) else (shape,), dtype)

    def zeros(self, shape: Any, dtype: Any = np.float32, persistent: bool = False) -> Any:
        arena = self.persistent if persistent else self.scratch
        t = arena.empty(tuple(shape) if not isinstance(shape, int) else (shape,), dtype)
        if isinstance(t, np.ndarray):
            t[...] = 0
        else:
            from ninfer_nb.runtime._drv import check, driver

            n = t.nbytes
            if n:
                check(driver().cuMemsetD8Async(t.ptr, 0, n, self.stream.cu))
                self._after_kernel = False
        return t

    def from_numpy(self, arr: np.ndarray, dtype: Any = None, persistent: bool = True) -> Any:
        a = np.ascontiguousarray(arr if dtype is None else np.asarray(arr).astype(dtype))
        arena = self.persistent if (persistent and self.persistent is not None) else self.scratch
        t = arena.empty(a.shape, a.dtype)
        if isinstance(t, np.ndarray):
            t[...] = a
        else:
            t.copy_from_numpy(a, self.stream)
            self._after_kernel = False
        return t

    def to_numpy(self, t: Any) -> np.ndarray:
        return np.array(t) if isinstance(t, np.ndarray) else t.numpy(self.stream)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Scratch allocated inside is handed back on exit: intermediates of one op (the grouped
        MoE sort and GEMM rows, the chunked GDN's W / Q' / U) or of one decoder layer do not
        pile up over the layers. Nothing allocated inside may be used after the exit.
        Safe because every kernel runs on the one engine stream, in order; the rewind is
        deterministic, so a captured step still allocates the same addresses every time."""
        mark = getattr(self.scratch, "offset", None)
        try:
            yield
        finally:
            if mark is not None:
                self.scratch.offset = mark

    @contextlib.contextmanager
    def programmatic_launches(self, enabled: bool = True) -> Iterator[None]:
        """Launch with programmatic dependent launch inside (cc >= 9.0 and `enabled`; else a
        no-op): each kernel that follows another kernel on the stream may start its blocks
        while that one finishes (see runtime/launch.py). The CUDA backend captures its decode
        graph inside, so the graph's kernel-to-kernel edges are programmatic."""
        before = self._pdl
        self._pdl = enabled and not SIM and self.arch is not None and self.arch >= (9, 0)
        self._after_kernel = False                   # the first launch follows whatever came before
        try:
            yield
        finally:
            self._pdl = before

    def _launcher(self, spec: Any) -> Launcher:
        launcher = self._launchers.get(spec.name)
        if launcher is None:
            launcher = self._launchers[spec.name] = Launcher(spec.get())
        return launcher

    def _go(self, spec: Any, grid: Any, block: int, *args: Any, smem: int = 0, cluster: int = 0) -> None:
        """Launch `spec` on the engine stream: straight through cuLaunchKernel
        (runtime/launch.py) when every array argument is a device Tensor, else (the simulator,
        host arrays) through numba's dispatcher. `cluster` > 0: as thread-block clusters of
        that many blocks (device Tensors only)."""
        if not SIM:
            try:
                self._launcher(spec)(grid, block, self._cu_stream, args, smem, self._pdl and self._after_kernel,
                                     cluster)
                self._after_kernel = True
                return
            except NotDeviceArgs:
                if cluster:
                    raise
        self._after_kernel = True
        if smem:
            spec[grid, block, self.stream.numba, smem](*[_kv(a) for a in args])
        else:
            spec[grid, block, self.stream.numba](*[_kv(a) for a in args])

    # --- elementwise / norms ---------------------------------------------------------
    def embedding(self, table: Any, ids: Any) -> Any:
        _need(ids.dtype == I32, "embedding: ids must be int32")
        t, h = ids.shape[0], table.shape[1]
        out = self.empty((t, h))                                     # [T, H] fp32
        if t:
            spec = K_emb.embedding_f32_kernel if table.dtype == F32 else K_emb.embedding_bf16_kernel
            self._go(spec, ((h + 255) // 256, t), 256, table, ids, out)
        return out

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        d = x.shape[-1]
        out = self.empty(x.shape)
        rows = x.size // d if d else 0
        if rows:
            self._go(K_norm.rms_norm_kernel, rows, K_norm.threads_for(d), _rows(x, d), weight, _rows(out, d), np.float32(eps))
        return out

    def add_rms_norm(self, x: Any, residual: Any, weight: Any, eps: float,
                     out: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
        """(rms_norm(x + residual) * weight, x + residual) in one kernel; `out` = (normed, sum)
        buffers to write instead of new ones (they must not alias x or residual)."""
        d = x.shape[-1]
        _need(d <= K_norm.MAX_D, f"norm rows of {d} > {K_norm.MAX_D}")
        out, res = out if out is not None else (self.empty(x.shape), self.empty(x.shape))
        rows = x.size // d if d else 0
        if (rows >= K_norm.ROWS_MIN_R and d % (4 * K_norm.ROWS_THREADS) == 0
                and all(_ptr(a) % 16 == 0 for a in (x, residual, weight, out, res))):
            self._go(K_norm.add_rms_norm_rows_kernel, rows, K_norm.ROWS_THREADS, x.reshape(-1), residual.reshape(-1),
                     weight, out.reshape(-1), res.reshape(-1), np.int32(d), np.float32(eps))
        elif rows:
            self._go(K_norm.add_rms_norm_kernel, rows, K_norm.threads_for(d), _rows(x, d), _rows(residual, d), weight,
                     _rows(out, d), _rows(res, d), np.float32(eps))
        return out, res

    def normed(self, x: Any, weight: Any, eps: float) -> Any:
        """rms_norm(x, weight, eps) for a consumer to read: one fp32 token row (the decode
        step) comes back as a `Normed` that the next kernel normalises as it reads it; more
        rows (prefill) are normalised here."""
        d = x.shape[-1]
        if (not SIM and x.size == d and d % 8 == 0 and x.dtype == F32 and weight.dtype == F32
                and _ptr(x) % 16 == 0 and _ptr(weight) % 16 == 0):
            return Normed(x, weight, float(eps))
        return self.rms_norm(x, weight, eps)

    def plain(self, x: Any) -> Any:
        """x itself, or a `Normed` computed into a new tensor."""
        return self.rms_norm(x.x, x.weight, x.eps) if isinstance(x, Normed) else x

    def add_into(self, acc: Any, y: Any) -> Any:
        """acc += y in place (the residual stream); returns acc."""
        _need(tuple(acc.shape) == tuple(y.shape), f"add_into: shapes differ {acc.shape} vs {y.shape}")
        if acc.size:
            self._go(K_ew.add_kernel, K_ew.grid_for(acc.size), K_ew.BLOCK, acc.reshape(-1), y.reshape(-1),
                     acc.reshape(-1))
        return acc

    def _unary(self, spec: Any, x: Any) -> Any:
        out = self.empty(x.shape)
        n = x.size
        if n:
            self._go(spec, K_ew.grid_for(n), K_ew.BLOCK, x.reshape(-1), out.reshape(-1))
        return out

    def add(self, x: Any, y: Any) -> Any:
        _need(tuple(x.shape) == tuple(y.shape), f"add: shapes differ {x.shape} vs {y.shape}")
        out = self.empty(x.shape)
        n = x.size
        if n:
            self._go(K_ew.add_kernel, K_ew.grid_for(n), K_ew.BLOCK, x.reshape(-1), y.reshape(-1), out.reshape(-1))
        return out

    def silu(self, x: Any) -> Any:
        return self._unary(K_ew.silu_kernel, x)

    def sigmoid(self, x: Any) -> Any:
        return self._unary(K_ew.sigmoid_kernel, x)

    def swiglu(self, gate_up: Any) -> Any:
        two_i = gate_up.shape[-1]
        inter = two_i // 2
        out = self.empty(tuple(gate_up.shape[:-1]) + (inter,))
        n = out.size
        if n:
            self._go(K_ew.swiglu_kernel, K_ew.grid_for(n), K_ew.BLOCK, _rows(gate_up, two_i), _rows(out, inter))
        return out

    def linear_swiglu(self, x: Any, gate_up: Any) -> Any:
        """swiglu(linear(x, gate_up)); up to GEMV_MAX_T tokens and a bf16 weight: one GEMV
        kernel with the SwiGLU in its epilogue (kernels/linear/linear.py gemv_bf16_swiglu_kernel).
        A wgmma chunk (cc 9.0, T >= gemm_wgmma.MIN_M, I % 64 == 0): one GEMM with the SwiGLU in
        its epilogue (gemm_wgmma_swiglu_kernel) returning h as bf16 bits (uint16) [T, I]: what
        `linear` rounds its input to before its GEMM anyway, so the MLP's result is unchanged,
        and neither the [T, 2I] fp32 product nor an fp32 h goes through memory. Only `linear`
        consumes it (models/layers.py mlp_block)."""
        two_i, k = gate_up.shape
        _need(x.shape[-1] == k and two_i % 2 == 0, f"linear_swiglu: x {x.shape} vs weight {gate_up.shape}")
        if isinstance(x, Normed):                       # one token, the RMSNorm fused in
            if gate_up.dtype == bfloat16 and k % 8 == 0 and _ptr(gate_up) % 16 == 0:
                out = self.empty((1, two_i // 2))                                   # [1, I]
                self._one_token("swiglu", x.x, x.weight, x.eps, gate_up, out, out.reshape(-1), False)
                return out.reshape(tuple(x.shape[:-1]) + (two_i // 2,))
            x = self.plain(x)
        x2 = _rows(x, k)
        t = x2.shape[0]
        inter = two_i // 2
        if (self.use_wgmma and t >= K_wg.MIN_M and not SIM and gate_up.dtype == bfloat16 and x2.dtype == F32
                and k % K_wg.K_ALIGN == 0 and inter % K_wg.K_ALIGN == 0
                and _ptr(x2) % 16 == 0 and _ptr(gate_up) % 16 == 0):
            xb = self._bf16_copy(x2)
            h = self.empty(tuple(x.shape[:-1]) + (inter,), np.uint16)        # [T, I] bf16 bits
            self._go(K_wg.gemm_wgmma_swiglu_kernel, K_wg.gemm_grid(t, two_i), K_wg.THREADS, xb, gate_up,
                     _rows(h, inter), smem=K_wg.SMEM_BYTES)
            return h
        if not (0 < t <= K_lin.GEMV_MAX_T and not SIM
                and gate_up.dtype == bfloat16 and k % 8 == 0 and _ptr(gate_up) % 16 == 0 and _ptr(x2) % 16 == 0):
            return self.swiglu(self.linear(x, gate_up))
        out = self.empty(tuple(x.shape[:-1]) + (two_i // 2,))             # [T, I]
        self._go(K_lin.gemv_bf16_swiglu_kernel, (two_i // 2 + K_lin.GEMV_WARPS - 1) // K_lin.GEMV_WARPS,
                 32 * K_lin.GEMV_WARPS, x2, gate_up, _rows(out, two_i // 2))
        return out

    def sigmoid_mul(self, x: Any, gate: Any) -> Any:
        """x * sigmoid(gate); gate may be [T, 1] against x [T, N] (per-row gate, broadcast)."""
        _need(gate.size > 0 and x.size % gate.size == 0, f"sigmoid_mul: gate {gate.shape} vs x {x.shape}")
        out = self.empty(x.shape)
        n = x.size
        if n:
            self._go(K_ew.sigmoid_mul_kernel, K_ew.grid_for(n), K_ew.BLOCK, x.reshape(-1), gate.reshape(-1),
                     out.reshape(-1), np.int32(x.size // gate.size))
        return out

    def split(self, x: Any, sizes: tuple[int, ...]) -> tuple[Any, ...]:
        """x [T, sum(sizes)] -> contiguous parts [T, size_i] (at most 4). One token: views into
        x, no copy (the decode path); more: one kernel copies the parts into one scratch buffer."""
        n = x.shape[-1]
        _need(sum(sizes) == n and 0 < len(sizes) <= 4, f"split: sizes {sizes} vs {x.shape}")
        t = x.size // n if n else 0
        flat = x.reshape(-1)
        if t > 1:
            flat = self.empty((t * n,))                                   # the parts, back to back
            self._go(K_ew.split_rows_kernel, K_ew.row_grid(t, n), K_ew.BLOCK, _rows(x, n), flat,
                     *(np.int32(b) for b in _part_bounds(sizes, 3)))
        return _flat_parts(flat, t, sizes)

    def linear_split(self, x: Any, weight: Any, bias: Any, sizes: tuple[int, ...]) -> tuple[Any, ...]:
        """split(linear(x, weight, bias), sizes). For a tensor-core chunk (T > 16), one GEMM
        per part on the part's rows of the fused weight (contiguous: weight[n0:n1]) writes each
        part straight into its own buffer, so the split copy pass goes away; x is converted to
        bf16 once for all parts. H200, 2048-token chunk: 16480x5120 36.3 -> 30.1 ms per 27B
        chunk, 12352x2048 10.8 -> 6.6 ms per 35B chunk. Decode keeps linear + split (views)."""
        n, k = weight.shape
        t = x.size // k if k else 0
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        if not (t > K_lin.GEMV_MAX_T and not SIM
                and weight.dtype == bfloat16 and k % K_mma.K_ALIGN == 0 and sum(sizes) == n
                and all(b % 2 == 0 for b in bounds) and _ptr(x) % 16 == 0 and _ptr(weight) % 16 == 0):
            return self.split(self.linear(x, weight, bias), sizes)
        x2 = _rows(x, k)
        xb = self._bf16_copy(x2)                                         # shared by the parts
        parts = []
        for n0, n1 in zip(bounds[:-1], bounds[1:]):
            out = self.empty((t, n1 - n0))                               # [T, size_i]
            self._gemm_bf16(xb, weight[n0:n1], out, bias[n0:n1] if bias is not None else None,
                            np.int32(bias is not None))
            parts.append(out)
        return tuple(parts)

    def gated_rms_norm(self, x: Any, z: Any, weight: Any, eps: float) -> Any:
        """Rows up to WARP_ROW_MAX_D wide (the GDN heads' 128): one warp per row; wider rows:
        one block per row. H200, 98304x128 (a 2048-token 27B chunk): 200.9 -> 52.6 us."""
        d = x.shape[-1]
        out = self.empty(x.shape)
        rows = x.size // d if d else 0
        if rows and d <= K_norm.WARP_ROW_MAX_D:
            self._go(K_norm.gated_rms_norm_warp_kernel, (rows + K_norm.WARP_ROWS - 1) // K_norm.WARP_ROWS,
                     32 * K_norm.WARP_ROWS, _rows(x, d), _rows(z, d), weight, _rows(out, d), np.float32(eps))
        elif rows:
            self._go(K_norm.gated_rms_norm_kernel, rows, K_norm.threads_for(d), _rows(x, d), _rows(z, d), weight,
                     _rows(out, d), np.float32(eps))
        return out

    # --- linear ----------------------------------------------------------------------
    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any:
        n, k = weight.shape
        _need(x.shape[-1] == k, f"linear: x {x.shape} vs weight {weight.shape}")
        out = self.empty(tuple(x.shape[:-1]) + (n,))
        if out.size:
            self._linear_into(x, weight, bias, _rows(out, n))
        return out

    def linear_add(self, x: Any, weight: Any, residual: Any) -> Any:
        """residual += linear(x, weight), in place; returns residual. One token: the GEMV adds
        the residual as its bias and writes over it (each element is read and written by the
        same thread), so the add costs no launch."""
        n, k = weight.shape
        _need(x.shape[-1] == k and residual.shape[-1] == n and x.size // k == residual.size // n,
              f"linear_add: x {x.shape}, weight {weight.shape}, residual {residual.shape}")
        if residual.size == n:
            self._linear_into(x, weight, residual.reshape(-1), _rows(residual, n))
            return residual
        return self.add_into(residual, self.linear(x, weight))

    def _linear_into(self, x: Any, weight: Any, bias: Any, out2: Any) -> None:
        """out2 [T, N] = x @ weight^T (+ bias [N]); bias may alias out2 when T == 1."""
        n, k = weight.shape
        if isinstance(x, Normed):
            if (weight.dtype == bfloat16 and k % 8 == 0 and _ptr(weight) % 16 == 0):
                b = bias if bias is not None else out2.reshape(-1)   # unused dummy when has_bias == 0
                self._one_token("normed", x.x, x.weight, x.eps, weight, out2, b, bias is not None)
                return
            x = self.plain(x)
        x2 = _rows(x, k)
        t = x2.shape[0]
        has_bias = np.int32(bias is not None)
        b = bias if bias is not None else out2.reshape(-1)   # unused dummy when has_bias == 0
        _need(x2.dtype == F32 or (x2.dtype == np.uint16 and t > K_lin.GEMV_MAX_T and weight.dtype == bfloat16
                                  and k % K_mma.K_ALIGN == 0),
              f"linear: bf16 activations ({x2.dtype}) only as a tensor-core GEMM operand")
        if weight.dtype == F32 and t <= K_lin.GEMV_MAX_T and not SIM:
            grid = (n + K_lin.GEMV_F32_WARPS - 1) // K_lin.GEMV_F32_WARPS
            self._go(K_lin.gemv_f32_kernel, grid, 32 * K_lin.GEMV_F32_WARPS, x2, weight, b, out2, has_bias)
        elif weight.dtype == bfloat16 and t <= K_lin.GEMV_MAX_T and not SIM:
            vec = np.int32(k % 8 == 0 and _ptr(weight) % 16 == 0 and _ptr(x2) % 16 == 0)
            ways = 4 if k >= SPLITK_MIN_K else 2 if k >= SPLITK2_MIN_K else 0
            if vec and t == 1:
                self._one_token("plain", x2, x2.reshape(-1), 1.0, weight, out2, b, bias is not None)
            elif vec and n <= SPLITK_MAX_N and ways:
                spec = K_lin.gemv_bf16_splitk_kernel if ways == 4 else K_lin.gemv_bf16_splitk2_kernel
                rows_per_block = K_lin.splitk_rows_per_block(ways)
                grid = (n + rows_per_block - 1) // rows_per_block
                self._go(spec, grid, 32 * K_lin.GEMV_WARPS, x2, weight, b, out2, has_bias)
            else:
                grid = (n + K_lin.GEMV_ROWS_PER_BLOCK - 1) // K_lin.GEMV_ROWS_PER_BLOCK
                self._go(K_lin.gemv_bf16_kernel, grid, 32 * K_lin.GEMV_WARPS, x2, weight, b, out2, has_bias,
                         vec)
        elif (weight.dtype == bfloat16 and not SIM and k % K_mma.K_ALIGN == 0
              and _ptr(x2) % 16 == 0 and _ptr(weight) % 16 == 0 and _ptr(out2) % 16 == 0):
            # tensor cores (t > GEMV_MAX_T): x -> bf16 scratch copy (unless x already is bf16
            # bits, as linear_swiglu's wgmma result), then a bf16 GEMM
            xb = x2 if x2.dtype == np.uint16 else self._bf16_copy(x2)
            self._gemm_bf16(xb, weight, out2, b, has_bias)
        else:
            grid = ((n + K_lin.BN - 1) // K_lin.BN, (t + K_lin.BM - 1) // K_lin.BM)
            self._go(K_lin.gemm_kernel, grid, 256, x2, weight, b, out2, has_bias)

    def _one_token(self, mode: str, x: Any, nw: Any, eps: float, weight: Any, out: Any, bias: Any,
                   has_bias: bool) -> None:
        """kernels/linear/linear.py gemv_one_token for one token: x [1, K], weight [N, K] bf16 (16-byte
        aligned, K % 8 == 0), out [1, N] ([1, N / 2] for "swiglu"); nw / eps: the fused norm's
        (ignored by "plain")."""
        n, k = weight.shape
        mode, ways, blocks, warps = one_token_build(mode, n, k, self.sm_count)
        if "gemv_x8" in self.experimental:
            mode, ways, blocks, warps = one_token_build_x8(mode, n, k)
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

    def _gemm_bf16(self, xb: Any, weight: Any, out: Any, bias: Any = None, has_bias: Any = np.int32(0)) -> None:
        """out [M, N] fp32 = xb [M, K] bf16 @ weight [N, K]^T bf16 (+ bias) on the tensor cores:
        wgmma on cc 9.0 for M >= 256, mma.sync otherwise. K % 64 == 0, 16-byte aligned."""
        m, n = out.shape
        b = bias if bias is not None else out.reshape(-1)               # unused dummy
        if self.use_wgmma and m >= K_wg.MIN_M:
            self._go(K_wg.gemm_wgmma_kernel, K_wg.gemm_grid(m, n), K_wg.THREADS, xb, weight, b, out, has_bias,
                     smem=K_wg.SMEM_BYTES)
        else:
            self._go(K_mma.gemm_mma_kernel, K_mma.gemm_grid(m, n), K_mma.THREADS, xb, weight, b, out, has_bias)

    # --- rotary + attention ----------------------------------------------------------
    def rope(self, x: Any, positions: Any, rotary_dim: int, theta: float) -> Any:
        _need(positions.dtype == I32, "rope: positions must be int32")
        t, heads, _ = x.shape
        out = self.empty(x.shape)
        if t:
            self._go(K_rope.rope_kernel, (heads, t), 128, x, positions, out, np.int32(rotary_dim), np.float64(theta))
        return out

    def qk_norm_rope_store(self, q: Any, k: Any, v: Any, q_norm: Any, k_norm: Any, positions: Any,
                           rotary_dim: int, theta: float, eps: float, k_cache: Any, v_cache: Any,
                           k_scale: Any = None, v_scale: Any = None) -> Any:
        """An attention layer's prologue (ops/cpu.py says what): one kernel for fp32 / bf16
        caches and head dims <= 256; the separate ops otherwise (int8 caches)."""
        _need(positions.dtype == I32, "qk_norm_rope_store: positions must be int32")
        t, hq, d = q.shape
        if k_scale is not None or d > K_rope.FUSED_MAX_D:
            if q_norm is not None:
                q = self.rms_norm(q, q_norm, eps)
                k = self.rms_norm(k, k_norm, eps)
            q = self.rope(q, positions, rotary_dim, theta)
            self.kv_store(k_cache, v_cache, self.rope(k, positions, rotary_dim, theta), v, positions, k_scale, v_scale)
            return q
        out = self.empty(q.shape)                                        # [T, Hq, D]
        if t:
            threads = 32
            while threads < d:
                threads *= 2
            has_norm = q_norm is not None
            qn = q_norm if has_norm else q.reshape(-1)                   # unused dummies
            kn = k_norm if has_norm else q.reshape(-1)
            self._go(K_rope.qk_norm_rope_store_kernel, (hq + k.shape[1], t), threads, q, k, v, qn, kn,
                     np.int32(has_norm), positions, np.int32(rotary_dim), np.float64(theta), np.float32(eps),
                     k_cache, v_cache, out)
        return out

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
                        k_scale: Any = None, v_scale: Any = None) -> Any:
        """ops.cpu.attention_gated: attention(..) * sigmoid(gate) as [T, Hq * D]. Decode-sized T:
        the gate is applied in the split kernels' combine kernel (no sigmoid_mul launch)."""
        t, hq, d = q.shape
        _need(gate.shape[-1] == hq * d and gate.size == t * hq * d, f"attention_gated: gate {gate.shape} vs q {q.shape}")
        out = self.attention(q, k_cache, v_cache, positions, scale, k_scale, v_scale, _gate=_rows(gate, hq * d))
        return out.reshape(t, hq * d) if _decode_sized(t) else self.sigmoid_mul(out.reshape(t, hq * d), gate)

    def attention(self, q: Any, k_cache: Any, v_cache: Any, positions: Any, scale: float,
                  k_scale: Any = None, v_scale: Any = None, _gate: Any = None) -> Any:
        _need(positions.dtype == I32, "attention: positions must be int32")
        t, hq, d = q.shape
        _need(d <= K_attn.MAX_D, f"attention: head_dim {d} > {K_attn.MAX_D}")
        _need(hq % k_cache.shape[1] == 0, "attention: Hq must be a multiple of Hkv")
        out = self.empty((t, hq, d))                                     # [T, Hq, D]
        if t == 0:
            return out
        ks = k_scale if k_scale is not None else q                       # unused dummies when
        vs = v_scale if v_scale is not None else q                       # the cache is not int8
        if _decode_sized(t):
            self._attention_decode(q, k_cache, v_cache, ks, vs, positions, scale, _gate, out)
        else:
            hkv = k_cache.shape[1]                                       # block: 64 (token, q head)
            grid = ((t * (hq // hkv) + K_attn.PRE_BM - 1) // K_attn.PRE_BM, hkv)  # rows of 1 kv head
            if self.prefill_attention == "flash" and K_fa.supported(d, self.arch) and t > K_lin.GEMV_MAX_T:
                self._attention_flash(q, k_cache, v_cache, ks, vs, positions, scale, out)
                return out
            if (self.prefill_attention in ("gemm", "flash") and not SIM and d % K_mma.K_ALIGN == 0
                    and t > K_lin.GEMV_MAX_T):                           # as the linear layers: T <= 16 stays fp32
                self._attention_gemm(q, k_cache, v_cache, ks, vs, positions, scale, out)
                return out
            if self.prefill_attention == "mma" and K_attn.mma_supported(d):  # tensor cores, bf16 Q/K/V/P
                kern, threads = K_attn.attn_prefill_mma_kernel, K_attn.MMA_THREADS
            else:                                                        # SIMT, fp32 throughout
                kern, threads = K_attn.attn_prefill_kernel, K_attn.PRE_THREADS
            self._go(kern, grid, threads, _rows(q, d), k_cache, v_cache,
                     ks, vs, positions, np.float32(scale), _rows(out, d))
        return out

    def _attention_decode(self, q: Any, k_cache: Any, v_cache: Any, ks: Any, vs: Any, positions: Any,
                          scale: float, gate: Any, out: Any) -> None:
        """Split-K decode attention into out [T, Hq, D]: per-split partials, then the combine
        kernel (which applies the output gate when given). bf16 caches (cc >= 8.0, head dims 64
        and 256, up to 8 q heads per kv head): a block per (split, kv head) on tensor cores
        (attention_decode_mma.py); otherwise a block per (split, q head) on CUDA cores
        (attn_split_kernel, any cache dtype)."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        tensor_cores = SIM or (self.arch is not None and self.arch >= (8, 0))
        if (self.decode_attention == "auto" and tensor_cores and k_cache.dtype == bfloat16
                and K_adm.supported(d, hq // hkv)
                and _ptr(q) % 16 == 0 and _ptr(k_cache) % 16 == 0 and _ptr(v_cache) % 16 == 0):
            n_split = K_attn.decode_splits(k_cache.shape[0], hkv * t, K_adm.SPLIT_BLOCKS_PER_SM * self.sm_count)
            kern, grid, args = K_adm.SPLIT_MMA_KERNELS[d], (n_split, hkv, t), ()
            threads, min_split = 32 * K_adm.DEC_WARPS, K_adm.MIN_SPLIT_KEYS
        else:
            n_split = K_attn.decode_splits(k_cache.shape[0], hq * t, K_attn.SPLIT_BLOCKS_PER_SM * self.sm_count)
            kern, grid, args = K_attn.attn_split_kernel, (n_split, hq, t), (ks, vs)
            threads, min_split = 32 * K_attn.SPLIT_WARPS, K_attn.MIN_SPLIT_KEYS
        part_o = self.empty((t, hq, n_split, d))                         # [T, Hq, NS, D]
        part_ml = self.empty((t, hq, n_split, 2))                        # [T, Hq, NS, (max, sum)]
        self._go(kern, grid, threads, q, k_cache, v_cache, *args, positions, np.float32(scale), part_o, part_ml)
        g = gate if gate is not None else part_ml.reshape(-1, 2)        # unused dummy without a gate
        self._go(K_attn.attn_combine_kernel, (hq, t), K_attn.COMBINE_THREADS, part_o, part_ml, positions, g,
                 np.int32(gate is not None), np.int32(min_split), out)

    def _attention_gathers(self, q: Any, k_cache: Any, v_cache: Any, ks: Any, vs: Any,
                           positions: Any) -> tuple[Any, Any, Any]:
        """q, K and V regrouped per kv head in bf16 (attention_gemm's gathers): qb [Hkv, T*G, D],
        kb [Hkv, Lp, D], vt [Hkv, D, Lp]. The number of keys L comes from the host copy of the
        positions (prefill inputs carry one); without it, the whole cache length."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        host = getattr(positions, "host", None)
        n_keys = int(host.max()) + 1 if host is not None and len(host) else k_cache.shape[0]
        lp = K_ag.padded_keys(min(n_keys, k_cache.shape[0]))
        rows = t * (hq // hkv)
        qb = self.empty((hkv, rows, d), np.uint16)                      # [Hkv, T*G, D] bf16
        kb = self.empty((hkv, lp, d), np.uint16)                        # [Hkv, Lp, D]  bf16
        vt = self.empty((hkv, d, lp), np.uint16)                        # [Hkv, D, Lp]  bf16
        self._go(K_ag.attn_gather_q_kernel, (rows, hkv), 128, q, qb)
        self._go(K_ag.attn_gather_kv_kernel, (lp // K_ag.TILE, (d + K_ag.TILE - 1) // K_ag.TILE, hkv),
                 (K_ag.TILE, 8), k_cache, v_cache, ks, vs, positions, kb, vt)
        return qb, kb, vt

    def _attention_flash(self, q: Any, k_cache: Any, v_cache: Any, ks: Any, vs: Any, positions: Any,
                         scale: float, out: Any) -> None:
        """Prefill attention in one flash kernel over the bf16 gathers (kernels/attention/attention_flash.py)."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        with self.scope():
            qb, kb, vt = self._attention_gathers(q, k_cache, v_cache, ks, vs, positions)
            self._go(K_fa.flash_attn_kernel, K_fa.grid(qb.shape[1], hkv), K_fa.THREADS, qb, kb, vt, positions,
                     np.int32(hq // hkv), np.float32(scale), _rows(out, d), smem=K_fa.SMEM_BYTES)

    def _attention_gemm(self, q: Any, k_cache: Any, v_cache: Any, ks: Any, vs: Any, positions: Any,
                        scale: float, out: Any) -> None:
        """Prefill attention as S = Q K^T, softmax, O = P V on the tensor-core GEMMs
        (kernels/attention/attention_gemm.py)."""
        t, hq, d = q.shape
        hkv = k_cache.shape[1]
        grp = hq // hkv
        rows = t * grp
        out2 = _rows(out, d)
        with self.scope():
            qb, kb, vt = self._attention_gathers(q, k_cache, v_cache, ks, vs, positions)
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

    # --- Gated DeltaNet --------------------------------------------------------------
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
                   dt_bias: Any, state: Any, norm_w: Any, eps: float, n_k_heads: int) -> Any:
        """ops.cpu.gdn_decode: conv, gated delta rule and gated norm of decode-sized T. One kernel
        on cc >= 9.0 for the heads it takes (kernels/gdn/gdn_decode.py), else the three ops."""
        t = mixed.shape[0]
        hv, dv, dk = state.shape
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

    def _cluster_fits(self, spec: Any, args: tuple[Any, ...], grid: int, block: int, c: int) -> bool:
        """Whether the GPU can launch `spec` as clusters of c blocks (cuOccupancyMaxActiveClusters;
        a GPU without non-portable cluster sizes refuses c > 8 outright). Cached per kernel and c."""
        ok = self._cluster_ok.get((spec.name, c))
        if ok is None:
            from ninfer_nb.runtime._drv import CudaDriverError

            try:
                ok = self._launcher(spec).max_active_clusters(args, grid, block, c) > 0
            except CudaDriverError:
                ok = False
            self._cluster_ok[(spec.name, c)] = ok
        return ok

    def gated_delta_rule_chunked(self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any,
                                 chunk: int = 64) -> Any:
        """Same contract as gated_delta_rule, chunked WY form (kernels/gdn/gdn_chunked.py, fixed chunk
        K_gdc.C = 64; `chunk` is accepted for parity with ops.cpu). T <= 16 or Dk > 128: the
        recurrent kernel. The sequential state pass runs on TF32 tensor cores
        (kernels/gdn/gdn_chunked_mma.py) for Dk % 16 == 0 unless self.gdn_state == "simt"; the
        prepare kernel too (kernels/gdn/gdn_prepare_mma.py: Dk % 16 == 0, Dv % 4 == 0, 16-byte
        aligned q / k / v) unless self.gdn_prepare == "simt"."""
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
            mma = self.gdn_prepare == "mma" or (self.gdn_prepare == "auto" and dk >= GDN_PREPARE_MMA_MIN_DK)
            if (mma and K_gdp.supported(dk, dv)
                    and _ptr(q) % 16 == 0 and _ptr(k) % 16 == 0 and _ptr(v) % 16 == 0):
                self._go(K_gdp.gdc_prepare_mma_kernel, (nc, hk), K_gdp.THREADS, q, k, v, g, beta, wb, qb, ub,
                         ks, ec, out, smem=K_gdp.SMEM_BYTES)
            else:
                self._go(K_gdc.gdc_prepare_kernel, (nc, hk), K_gdc.PREP_THREADS, q, k, v, g, beta, wb, qb, ub,
                         ks, ec, out)
            if self.gdn_state == "mma" and K_gdm.supported(dk, dv):
                self._go(K_gdm.gdc_state_mma_kernel, K_gdm.grid(hv, dv), K_gdm.THREADS,
                         k, wb, qb, ub, ks, ec, state, out)
            else:
                self._go(K_gdc.gdc_state_kernel, (hv, (dv + K_gdc.R - 1) // K_gdc.R), K_gdc.STATE_THREADS,
                         k, wb, qb, ub, ks, ec, state, out)
        return out

    # --- mixture of experts ----------------------------------------------------------
    def moe_router(self, x: Any, weight: Any, top_k: int, renormalize: bool = True,
                   shared_slot: bool = False) -> tuple[Any, Any]:
        """moe_route(linear(x, weight), ...); for one token of a `Normed` input and a bf16
        router: one kernel (`_moe_router_fused`)."""
        if self._router_fusable(x, weight, top_k, shared_slot):
            return self._moe_router_fused(x, weight, top_k, renormalize, shared_slot)[:2]
        return self.moe_route(self.linear(x, weight), top_k, renormalize, shared_slot)

    def moe(self, x: Any, router: Any, top_k: int, renormalize: bool, shared_slot: bool, gate_up: Any,
            down: Any, residual: Any = None) -> Any:
        """moe_experts(x, *moe_router(x, router, ...), gate_up, down, residual): the routed
        experts (with the shared one, when it is a slot). One token of a `Normed` input: the
        fused router also writes the normed row, which the expert kernels read as plain x."""
        if self._router_fusable(x, router, top_k, shared_slot):
            hid = router.shape[1]
            inter = gate_up.shape[1] // 2
            if (shared_slot and MOE_UNROLLED_MAX_T >= 1 and hid % (256 * K_moe.MOE_WIDE_GU) == 0
                    and inter % 256 == 0 and _ptr(gate_up) % 16 == 0 and _ptr(down) % 16 == 0):
                # decode, wide experts: the router kernel computes the shared slot's h row too
                h = self.empty((top_k + 1, inter))                       # [k + 1, I]
                ids, w, xn = self._moe_router_fused(x, router, top_k, renormalize, shared_slot, gate_up, h)
                w8 = K_moe.MOE_WARPS
                self._go(K_moe.moe_gate_up_wide_kernel, ((inter + w8 - 1) // w8, top_k), 32 * w8, xn, ids,
                         gate_up, h)
                return self._moe_down_wide(h, ids, w, down, 1, hid, residual)
            ids, w, xn = self._moe_router_fused(x, router, top_k, renormalize, shared_slot)
            return self.moe_experts(xn, ids, w, gate_up, down, residual)
        ids, w = self.moe_router(x, router, top_k, renormalize, shared_slot)
        return self.moe_experts(x, ids, w, gate_up, down, residual)

    def _router_fusable(self, x: Any, weight: Any, top_k: int, shared_slot: bool) -> bool:
        n, k = weight.shape
        return (isinstance(x, Normed) and weight.dtype == bfloat16 and k % 8 == 0 and _ptr(weight) % 16 == 0
                and n - int(shared_slot) <= K_moe.ROUTE_MAX_E and 0 < top_k < K_moe.MAX_TOPK)

    def _moe_router_fused(self, x: Any, weight: Any, top_k: int, renormalize: bool, shared_slot: bool,
                          gate_up: Any = None, h: Any = None) -> tuple[Any, Any, Any]:
        """(ids, weights, the normed row xn [1, H]) from one launch of the norm, the router GEMV
        and the top-k: kernels/moe/moe.py moe_router_cluster_kernel (cc >= 9.0, E <= 256; the logits
        meet in one block's shared memory) or moe_router_fused_kernel (a persistent arrival
        counter; the last block routes). With gate_up and h [k + 1, I]: its extra blocks also
        write the shared slot's row h[k]."""
        n, k = weight.shape
        slots = top_k + int(shared_slot)
        ids = self.empty((1, slots), np.int32)                           # [1, k (+1 shared)]
        w = self.empty((1, slots))
        xn = self.empty((1, k))                                          # [1, H] rms_norm(x) * weight
        n_h = 0 if h is None else h.shape[1]
        if h is None:
            gate_up, h = self._dummy_u16_3(), xn                         # placeholders, never read
        warps = K_moe.ROUTE_BLOCK // 32
        args = (_rows(x.x, k), x.weight, np.float32(x.eps), weight, xn)
        cluster = self._router_cluster(n - int(shared_slot), args, gate_up, h)
        if cluster:
            extra = (n_h + int(shared_slot) + warps - 1) // warps           # shared h rows (+ its gate)
            blocks = cluster * (1 + (extra + cluster - 1) // cluster)
            self._go(K_moe.moe_router_cluster_kernel, blocks, K_moe.ROUTE_BLOCK, *args, np.int32(top_k),
                     np.int32(renormalize), np.int32(shared_slot), np.int32(n_h), ids, w, gate_up, h,
                     cluster=cluster)
            return ids, w, xn
        if self._router_counter is None:          # 0 between launches; the last block resets it
            self._router_counter = self.zeros((1,), np.int32, persistent=True)
        logits = self.empty((n,))                                        # [E (+1)] router logits
        blocks = (n + 2 * warps - 1) // (2 * warps) + (n_h + warps - 1) // warps
        self._go(K_moe.moe_router_fused_kernel, blocks, K_moe.ROUTE_BLOCK, *args, logits, self._router_counter,
                 np.int32(top_k), np.int32(renormalize), np.int32(shared_slot), ids, w, gate_up, h)
        return ids, w, xn

    def _router_cluster(self, n_exp: int, args: tuple[Any, ...], gate_up: Any, h: Any) -> int:
        """The cluster size for moe_router_cluster_kernel (one block per 16 routed experts), or 0:
        the arrival-counter kernel (cc < 9.0, more than ROUTE_CLUSTER_MAX blocks, ROUTER_CLUSTER
        off, or a GPU that cannot hold such a cluster)."""
        rows = K_moe.ROUTE_BLOCK // 32 * 2                               # 2 logits per warp
        c = (n_exp + rows - 1) // rows
        if not ROUTER_CLUSTER or SIM or self.arch is None or self.arch < (9, 0) or c > K_moe.ROUTE_CLUSTER_MAX:
            return 0
        ok = self._cluster_ok.get((K_moe.moe_router_cluster_kernel.name, c))
        if ok is None:
            probe = args + (np.int32(1), np.int32(1), np.int32(0), np.int32(0), self.empty((1, 1), np.int32),
                            self.empty((1, 1)), gate_up, h)
            ok = self._cluster_fits(K_moe.moe_router_cluster_kernel, probe, c, K_moe.ROUTE_BLOCK, c)
        return c if ok else 0

    def _dummy_u16_3(self) -> Any:
        return self.empty((1, 1, 8), np.uint16)                          # a typed placeholder

    def moe_route(self, logits: Any, top_k: int, renormalize: bool = True,
                  shared_slot: bool = False) -> tuple[Any, Any]:
        t, cols = logits.shape
        n_exp = cols - int(shared_slot)
        _need(0 < top_k <= min(K_moe.MAX_TOPK - 1, n_exp), f"moe_route: top_k must be in 1..{K_moe.MAX_TOPK - 1}")
        _need(n_exp <= K_moe.ROUTE_MAX_E, f"moe_route: at most {K_moe.ROUTE_MAX_E} experts")
        slots = top_k + int(shared_slot)
        ids = self.empty((t, slots), np.int32)                            # [T, k (+1 shared)]
        w = self.empty((t, slots))
        if t:
            threads = 32                                                 # a power of two, <= E
            while threads < min(n_exp, K_moe.ROUTE_BLOCK):
                threads *= 2
            self._go(K_moe.moe_route_kernel, t, threads, logits, np.int32(top_k), np.int32(renormalize),
                     np.int32(shared_slot), ids, w)
        return ids, w

    def moe_experts(self, x: Any, ids: Any, weights: Any, gate_up: Any, down: Any,
                    residual: Any = None) -> Any:
        """The routed experts' sum [T, H]; with `residual`: residual += it, in place (one
        token: the down kernel adds into the residual stream as it writes)."""
        x = self.plain(x)
        t, hid = x.shape
        top_k = ids.shape[1]
        inter = gate_up.shape[1] // 2
        _need(gate_up.dtype == bfloat16 and down.dtype == bfloat16, "moe_experts: expert weights must be bf16")
        if t == 0:
            return self.empty((t, hid)) if residual is None else residual
        if SIM or t >= K_moeg.GROUPED_MIN_T:     # prefill: grouped by expert (the simulator: always)
            out = self.empty((t, hid))
            self._moe_experts_grouped(x, ids, weights, gate_up, down, out)
            return out if residual is None else self.add_into(residual, out)
        h = self.empty((t * top_k, inter))                               # [T*k, I]
        vec = np.int32(hid % 8 == 0 and inter % 8 == 0 and all(_ptr(a) % 16 == 0 for a in (x, gate_up, down, h)))
        w8 = K_moe.MOE_WARPS
        if t <= MOE_UNROLLED_MAX_T and vec and hid % (256 * K_moe.MOE_UNROLL) == 0 and inter % 256 == 0:
            gate_up_kernel = (K_moe.moe_gate_up_wide_kernel if hid % (256 * K_moe.MOE_WIDE_GU) == 0
                              else K_moe.moe_gate_up_unrolled_kernel)
            self._go(gate_up_kernel, ((inter + w8 - 1) // w8, t * top_k), 32 * w8, x, ids, gate_up, h)
            return self._moe_down_wide(h, ids, weights, down, t, hid, residual)
        out = self.empty((t, hid))
        self._go(K_moe.moe_gate_up_kernel, ((inter + w8 - 1) // w8, t * top_k), 32 * w8, x, ids, gate_up, h, vec)
        self._go(K_moe.moe_down_kernel, ((hid + w8 - 1) // w8, t), 32 * w8, h, ids, weights, down, out, vec)
        return out if residual is None else self.add_into(residual, out)

    def _moe_down_wide(self, h: Any, ids: Any, weights: Any, down: Any, t: int, hid: int, residual: Any) -> Any:
        out = self.empty((t, hid)) if residual is None else _rows(residual, hid)
        w8 = K_moe.MOE_WARPS
        self._go(K_moe.moe_down_wide_kernel, ((hid + w8 - 1) // w8, t), 32 * w8, h, ids, weights, down, out,
                 np.int32(residual is not None))
        return out if residual is None else residual

    def _moe_experts_grouped(self, x: Any, ids: Any, weights: Any, gate_up: Any, down: Any, out: Any) -> None:
        """Prefill MoE grouped by expert (kernels/moe/moe_grouped.py): device-side sort of the
        (token, slot) pairs by expert, SwiGLU and down tensor-core GEMMs over each expert's rows
        (each expert's weights read once per 64-row tile; x and h rounded to bf16 as MMA
        operands, fp32 accumulate), slot-ordered combine into out [T, H]. From
        MOE_PIPELINED_MIN_PAIRS routed pairs the GEMMs are moe_wgmma's (cc 9.0: 64-row wgmma
        tiles, SwiGLU epilogue) or moe_pipelined's (elsewhere).
        Its scratch is handed back to the arena before returning (only `out` lives on); later
        kernels on the same stream are ordered after the combine, so reuse is safe."""
        t, hid = x.shape
        top_k = ids.shape[1]
        n_exp = gate_up.shape[0]
        inter = gate_up.shape[1] // 2
        n_pairs = t * top_k
        _need(hid % 2 == 0 and inter % 2 == 0, "moe_experts (grouped): H and I must be even (bf16x2 words)")
        n_chunks = (n_pairs + K_moeg.SORT_CHUNK - 1) // K_moeg.SORT_CHUNK
        n_tiles = K_moeg.max_row_tiles(n_pairs, n_exp)                   # grid bound, no host sync
        with self.scope():
            ids_f = ids.reshape(-1)                                          # [P = T*k] pair p = t*k + s
            hist = self.empty((n_chunks, n_exp), np.int32)                   # [C, E] counts -> chunk bases
            offs = self.empty((n_exp + 1,), np.int32)                        # [E+1] row offsets
            tile_off = self.empty((n_exp + 1,), np.int32)                    # [E+1] row-tile offsets
            order = self.empty((n_pairs,), np.int32)                         # [P] pair ids, expert-sorted
            h = self.empty((n_pairs, inter), np.uint16)                      # [P, I] bf16 SwiGLU rows, sorted
            y = self.empty((n_pairs, hid))                                   # [P, H] weighted rows, pair order
            self._go(K_moeg.moe_hist_kernel, n_chunks, K_moeg.SORT_THREADS, ids_f, hist)
            self._go(K_moeg.moe_scan_kernel, 1, K_moeg.SORT_THREADS, hist, offs, tile_off)
            self._go(K_moeg.moe_scatter_kernel, n_chunks, K_moeg.SORT_THREADS, ids_f, hist, offs, order)
            aligned = all(_ptr(a) % 16 == 0 for a in (x, gate_up, down))
            if (n_pairs >= MOE_PIPELINED_MIN_PAIRS and not SIM and self.use_wgmma and aligned
                    and hid % K_moew.K_ALIGN == 0 and inter % K_moew.K_ALIGN == 0):
                xb = self._bf16_copy(x)
                self._go(K_moew.moe_wgmma_gate_up_kernel, (inter // K_moew.BN_GU, n_tiles), K_moew.THREADS,
                         xb, gate_up, offs, tile_off, order, np.int32(top_k), h, smem=K_moew.SMEM_BYTES)
                self._go(K_moew.moe_wgmma_down_kernel, ((hid + K_moew.BN - 1) // K_moew.BN, n_tiles),
                         K_moew.THREADS, h, down, offs, tile_off, order, weights.reshape(-1), y,
                         smem=K_moew.SMEM_BYTES)
                ct = K_moeg.COMBINE_THREADS
                self._go(K_moeg.moe_combine_kernel, ((hid + ct - 1) // ct, t), ct, y, ids_f, np.int32(n_exp), out)
                return
            if (n_pairs >= MOE_PIPELINED_MIN_PAIRS and not SIM and hid % K_mma.BK == 0
                    and inter % K_mma.BK == 0 and aligned):
                self._moe_pipelined(x, order, offs, weights, gate_up, down, h, y, top_k)
                ct = K_moeg.COMBINE_THREADS
                self._go(K_moeg.moe_combine_kernel, ((hid + ct - 1) // ct, t), ct, y, ids_f, np.int32(n_exp), out)
                return
            bn = K_moeg.BN_GU
            self._go(K_moeg.moe_grouped_gate_up_kernel, ((inter + bn - 1) // bn, n_tiles), K_moeg.THREADS,
                     x, order, offs, tile_off, gate_up, h, np.int32(top_k))
            bn = K_moeg.BN_DN
            self._go(K_moeg.moe_grouped_down_kernel, ((hid + bn - 1) // bn, n_tiles), K_moeg.THREADS,
                     h, order, offs, tile_off, weights.reshape(-1), down, y)
            ct = K_moeg.COMBINE_THREADS
            self._go(K_moeg.moe_combine_kernel, ((hid + ct - 1) // ct, t), ct, y, ids_f, np.int32(n_exp), out)

    def _moe_pipelined(self, x: Any, order: Any, offs: Any, weights: Any, gate_up: Any, down: Any, h: Any,
                       y: Any, top_k: int) -> None:
        """Steps 1-5 of kernels/moe/moe_pipelined.py: 128-row tile offsets, the gathered bf16 rows,
        gate_up GEMM, SwiGLU to bf16 h, down GEMM scattered to pair rows y (scaled)."""
        n_pairs, hid = y.shape
        n_exp = gate_up.shape[0]
        inter = gate_up.shape[1] // 2
        tile_off = self.empty((n_exp + 1,), np.int32)                    # [E+1] 128-row tile offsets
        xs = self.empty((n_pairs, hid), np.uint16)                       # [P, H] bf16 rows, expert-sorted
        g = self.empty((n_pairs, 2 * inter))                             # [P, 2I] gate | up, fp32
        n_tiles = K_moep.max_row_tiles(n_pairs, n_exp)                   # grid bound, no host sync
        wts = weights.reshape(-1)
        self._go(K_moep.moe_tile_offsets_kernel, 1, 32, offs, tile_off)
        self._go(K_moep.moe_gather_bf16_kernel, n_pairs, K_moep.GATHER_THREADS, x, order, np.int32(top_k), xs)
        self._go(K_moep.moe_mma_grouped_kernel, ((2 * inter + K_mma.BN - 1) // K_mma.BN, n_tiles), K_mma.THREADS,
                 xs, gate_up, offs, tile_off, order, wts, np.int32(0), g)
        st = K_moep.SWIGLU_THREADS
        self._go(K_moep.moe_swiglu_bf16_kernel, max(1, min(K_moep.SWIGLU_MAX_BLOCKS, (n_pairs * inter + st - 1) // st)),
                 st, g, h)
        self._go(K_moep.moe_mma_grouped_kernel, ((hid + K_mma.BN - 1) // K_mma.BN, n_tiles), K_mma.THREADS,
                 h, down, offs, tile_off, order, wts, np.int32(1), y)

    # --- sampling --------------------------------------------------------------------
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


# --- weights -----------------------------------------------------------------------------

def default_keep_fp32(name: str, arr: np.ndarray) -> bool:
    """Small parameters stay fp32: vectors (norms, biases, A_log, dt_bias) and conv1d weights."""
    return arr.ndim < 2 or "conv1d" in name


def upload_weights(weights: dict[str, np.ndarray], dtype: Any = bfloat16, *, arena: Any, stream: Any,
                   progress: Callable[[int, int, str], None] | None = None,
                   keep_fp32: Callable[[str, np.ndarray], bool] = default_keep_fp32) -> dict[str, Any]:
    """Upload host arrays into `arena`: matrices as `dtype` (bf16 by default), small parameters
    (per `keep_fp32`) as fp32, through a pinned staging buffer. progress(done_bytes, total, name)."""
    from ninfer_nb.runtime.pinned import PinnedStaging

    items = []
    total = 0
    for name, a in weights.items():
        want = np.dtype(np.float32) if (keep_fp32(name, a) or a.dtype == np.int32) else np.dtype(dtype)
        if a.dtype in (np.int32, np.int64):
            want = np.dtype(a.dtype)
        items.append((name, a, want))
        total += int(np.prod(a.shape, dtype=np.int64)) * want.itemsize
    out: dict[str, Any] = {}
    if isinstance(arena, _HostLike):
        for name, a, want in items:
            out[name] = np.ascontiguousarray(np.asarray(a).astype(want))
        return out
    staging = PinnedStaging(min(64 << 20, max(total, 1 << 20)))
    done = 0
    try:
        for name, a, want in items:
            host = np.ascontiguousarray(np.asarray(a).astype(want, copy=False))
            t = arena.empty(host.shape, want)
            staging.upload(t, host, stream)
            out[name] = t
            done += host.nbytes
            if progress is not None:
                progress(done, total, name)
    finally:
        staging.close()
    return out


class _HostLike:
    """Marker base for host arenas (simulator)."""


class HostArena(_HostLike):
    """Simulator stand-in for ScratchArena: NumPy arrays, `reset()` does nothing."""

    def empty(self, shape: Any, dtype: Any = np.float32) -> np.ndarray:
        return np.full(shape, np.nan, dtype=dtype) if np.dtype(dtype).kind == "f" else np.zeros(shape, dtype)

    def reset(self) -> None:
        pass


__all__ = ["CudaOps", "HostArena", "SimStream", "upload_weights", "default_keep_fp32", "DECODE_MAX_T"]
