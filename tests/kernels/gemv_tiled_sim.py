"""Simulator cases of kernels/linear/gemv_tiled.py (run by test_gemv_tiled.py in a subprocess
with NUMBA_ENABLE_CUDASIM=1): each format (int4 g32 / g64 with and without zero points, int8,
fp8) and mode against quant/dequant.py + NumPy on fresh random data, through quant/tiled.py's
layout. Shapes: N = 40 rows (3 row tiles: a lone last tile, padded rows), K = 5 or 6 K-tiles
(one full pass and a tail), 1 / 3 / 11 tokens, 1 and 2 K slices; MoE gate_up / down with 3
slots of a 4-expert stack."""
from __future__ import annotations

import os

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run through test_gemv_tiled.py"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from ninfer_nb.kernels.linear import gemv_tiled as K_t  # noqa: E402
from ninfer_nb.ops import cpu  # noqa: E402
from ninfer_nb.ops.cuda import CudaOps  # noqa: E402
from ninfer_nb.quant.dequant import dequantize, quantize  # noqa: E402
from ninfer_nb.quant.formats import FP8_BLOCK, groupwise  # noqa: E402
from ninfer_nb.quant.tiled import tile  # noqa: E402
from tests.support.cuda_helpers import HostArena, SimStream  # noqa: E402

N = 40


@pytest.fixture
def ops() -> CudaOps:
    return CudaOps(HostArena(), SimStream(), persistent=HostArena())


def rnd(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def close(a, b, tol=2e-2):
    """Relative to the largest reference value: x goes through bf16 in the kernels."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), "NaN in kernel output (unwritten element?)"
    err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)
    assert err <= tol, f"relative error {err:.3e} > {tol}"


def kind_of(fmt):
    if fmt.layout == "fp8-block":
        return "fp8", False, False
    return ("i4" if fmt.bits == 4 else "i8"), fmt.zero_points, fmt.bits == 4 and fmt.group_size == 32


def weight(rng, fmt, shape):
    q = quantize(rnd(rng, *shape) * 0.5, fmt)
    t = tile(q)
    zeros = t.arrays["zeros"] if fmt.zero_points else np.zeros(1, np.uint32)
    args = (t.arrays["codes"].reshape(-1).view(np.uint32), t.arrays["scales"].reshape(-1).view(np.uint32),
            zeros.reshape(-1), np.int32(fmt.group_size.bit_length() - 1))
    return args, dequantize(q)


def launch(ops, build, pairs, slots, x, nw, wargs, n_rows, k_exp, bias, out, has_bias, ids=None, ew=None):
    kind, zp, split, mode, ntg, ways, warps, blocks = build[:8]
    ids = ids if ids is not None else np.zeros((1, 1), np.int32)
    ew = ew if ew is not None else np.zeros((1, 1), np.float32)
    per_block = warps // ways
    codes, scales, zeros, gshift = wargs
    ops._go(K_t.gemv_tiled(*build, group=1 << int(gshift)), (-(-pairs // per_block), slots), 32 * warps, x, nw, np.float32(1e-6), codes,
            scales, zeros, gshift, np.int32(n_rows), np.int32(k_exp), bias, out, np.int32(has_bias), ids, ew)


FORMATS = [groupwise(4, 64), groupwise(4, 32, True), groupwise(4, 32), groupwise(4, 128, True), groupwise(8, 128), groupwise(8, 32, True), FP8_BLOCK]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_gemv_tiled_plain_and_normed(ops, fmt):
    """T = 1 / 3 / 11 plain (the residual as bias at T = 1), normed, at 1 and 2 K slices."""
    rng = np.random.default_rng(fmt.bits * 100 + fmt.group_size + fmt.zero_points)
    kind, zp, split = kind_of(fmt)
    k = 384 if kind == "i4" else 160 if fmt.group_size == 32 else 256     # 6 / 5 / 8 K-tiles
    wargs, wf = weight(rng, fmt, (N, k))
    nt = -(-N // 16)
    for t_, ways in ((1, 1), (3, 2), (11, 1)):
        x, r = rnd(rng, t_, k), rnd(rng, t_, N)
        ntg = 1 if t_ <= 8 else 2
        out = r.copy()
        has_bias = t_ == 1
        launch(ops, (kind, zp, split, "plain", ntg, ways, 4, 2), (nt + 1) // 2, 1, x, x.reshape(-1), wargs, N, k,
               out.reshape(-1) if has_bias else r[0], out, has_bias)
        close(out, (r if has_bias else 0) + cpu.linear(x, wf))
    x, nw = rnd(rng, 1, k), rnd(rng, k)
    out = np.full((1, N), np.nan, np.float32)
    launch(ops, (kind, zp, split, "normed", 1, 2, 4, 2), (nt + 1) // 2, 1, x, nw, wargs, N, k, out[0], out, False)
    close(out, cpu.linear(cpu.rms_norm(x, nw, 1e-6), wf))


@pytest.mark.parametrize("fmt", [groupwise(4, 64), groupwise(8, 128), FP8_BLOCK], ids=lambda f: f.name)
def test_gemv_tiled_swiglu(ops, fmt):
    """gate_up [2I, K], I = 32 (2 tile pairs): 5 tokens plain x, one normed token."""
    rng = np.random.default_rng(7 + fmt.bits)
    kind, zp, split = kind_of(fmt)
    inter, k = 32, (128 if kind == "i4" else 256)
    wargs, wf = weight(rng, fmt, (2 * inter, k))
    x = rnd(rng, 5, k)
    out = np.full((5, inter), np.nan, np.float32)
    launch(ops, (kind, zp, split, "swiglu", 1, 2, 4, 2), 2, 1, x, x.reshape(-1), wargs, 2 * inter, k, out[0], out,
           False)
    close(out, cpu.swiglu(cpu.linear(x, wf)))
    x, nw = rnd(rng, 1, k), rnd(rng, k)
    out = np.full((1, inter), np.nan, np.float32)
    launch(ops, (kind, zp, split, "normed_swiglu", 1, 1, 2, 2), 2, 1, x, nw, wargs, 2 * inter, k, out[0], out,
           False)
    close(out, cpu.swiglu(cpu.linear(cpu.rms_norm(x, nw, 1e-6), wf)))


def launch_t1(ops, build, n_rows, x, nw, wargs, bias, out, has_bias):
    kind, zp, split, mode, ways, warps, stages, blocks = build
    nt = -(-n_rows // 16)
    pairs = nt // 2 if "swiglu" in mode else (nt + 1) // 2
    codes, scales, zeros, gshift = wargs
    k = x.shape[1]
    ops._go(K_t.gemv_t1(*build, group=1 << int(gshift)), -(-pairs // (warps // ways)), 32 * warps, x, nw,
            np.float32(1e-6), codes, scales, zeros, gshift, np.int32(n_rows), np.int32(k), bias, out,
            np.int32(has_bias), np.zeros((1, 1), np.int32), np.zeros((1, 1), np.float32),
            smem=K_t.t1_smem(kind, zp, split, warps, stages, k))


T1_TOL = 2e-3       # x goes through fp16 (11 bits) times a power of two, the codes exactly


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_gemv_t1_plain_and_normed(ops, fmt):
    """The one-token build: the residual as bias (plain, 2 K slices of 4 warps, a ring of 3
    stages refilled: 6 K-tiles per slice), normed (whole rows, 2 stages); N = 40 (a lone
    last tile, padded rows); x with a large |x| (the fp16 staging scales it down)."""
    rng = np.random.default_rng(fmt.bits * 10 + fmt.group_size + fmt.zero_points)
    kind, zp, split = kind_of(fmt)
    k = 768 if kind == "i4" else 384                                    # 12 K-tiles
    wargs, wf = weight(rng, fmt, (N, k))
    x, r = rnd(rng, 1, k), rnd(rng, 1, N)
    x[0, 7] = 3.0e5
    out = r.copy()
    launch_t1(ops, (kind, zp, split, "plain", 2, 4, 3, 1), N, x, x.reshape(-1), wargs, out.reshape(-1), out, True)
    close(out, r + cpu.linear(x, wf), T1_TOL)
    x, nw = rnd(rng, 1, k) * np.float32(1e-3), rnd(rng, k)
    out = np.full((1, N), np.nan, np.float32)
    launch_t1(ops, (kind, zp, split, "normed", 1, 2, 2, 1), N, x, nw, wargs, out[0], out, False)
    close(out, cpu.linear(cpu.rms_norm(x, nw, 1e-6), wf), T1_TOL)


@pytest.mark.parametrize("fmt", [groupwise(4, 64), groupwise(8, 128), FP8_BLOCK], ids=lambda f: f.name)
def test_gemv_t1_swiglu(ops, fmt):
    """gate_up [2I, K], I = 64 (4 tile pairs over 2 blocks): one normed token, one plain token."""
    rng = np.random.default_rng(17 + fmt.bits)
    kind, zp, split = kind_of(fmt)
    inter, k = 64, (512 if kind == "i4" else 256)
    wargs, wf = weight(rng, fmt, (2 * inter, k))
    x, nw = rnd(rng, 1, k), rnd(rng, k) * np.float32(0.2)
    out = np.full((1, inter), np.nan, np.float32)
    launch_t1(ops, (kind, zp, split, "normed_swiglu", 2, 4, 4, 1), 2 * inter, x, nw, wargs, out[0], out, False)
    close(out, cpu.swiglu(cpu.linear(cpu.rms_norm(x, nw, 1e-6), wf)), T1_TOL)
    out = np.full((1, inter), np.nan, np.float32)
    x = x * np.float32(0.1)
    launch_t1(ops, (kind, zp, split, "swiglu", 1, 2, 8, 1), 2 * inter, x, x.reshape(-1), wargs, out[0], out, False)
    close(out, cpu.swiglu(cpu.linear(x, wf)), T1_TOL)


@pytest.mark.parametrize("fmt", [groupwise(4, 64), FP8_BLOCK], ids=lambda f: f.name)
def test_gemv_t1_moe(ops, fmt):
    """The MoE one-token builds on a stack of 4 experts, 2 tokens x 3 slots (an expert twice):
    gate_up per routed pair, then down over each token's slots (their weights folded into x,
    expert pointers per K-tile) into the residual."""
    rng = np.random.default_rng(23 + fmt.bits)
    kind, zp, split = kind_of(fmt)
    e, inter, hid = 4, 32 if kind == "i4" else 64, 256
    gu_args, gu = weight(rng, fmt, (e, 2 * inter, hid))
    dn_args, dn = weight(rng, fmt, (e, hid, inter * (2 if kind == "i4" else 2)))
    kx = dn.shape[-1]                                                   # the down experts' K (>= a K-tile)
    ids = np.array([[2, 0, 2], [1, 3, 0]], np.int32)
    ew = np.array([[0.5, -1.25, 0.75], [1.0, 0.25, -0.5]], np.float32)
    xn = rnd(rng, 2, hid)
    h = np.full((6, inter), np.nan, np.float32)
    ops._go(K_t.gemv_t1(kind, zp, split, "swiglu", 2, 4, 3, 1, fmt.group_size, "gate_up"), (inter // 32, 6), 128, xn,
            xn.reshape(-1), np.float32(1e-6), *gu_args, np.int32(2 * inter), np.int32(hid), h.reshape(-1), h,
            np.int32(0), ids, ew, smem=K_t.t1_smem(kind, zp, split, 4, 3, hid))
    want_h = np.stack([cpu.swiglu(cpu.linear(xn[p // 3:p // 3 + 1], gu[ids.flat[p]]))[0] for p in range(6)])
    close(h, want_h, T1_TOL)
    hh = np.concatenate([h, rnd(rng, 6, kx - inter)], axis=1)            # [6, kx]
    r = rnd(rng, 2, hid)
    out = r.copy()
    ops._go(K_t.gemv_t1(kind, zp, split, "plain", 4, 4, 2, 1, fmt.group_size, "down"), (8, 2), 128,
            hh.reshape(2, -1), hh.reshape(-1), np.float32(1e-6), *dn_args, np.int32(hid), np.int32(kx),
            out.reshape(-1), out, np.int32(1), ids, ew, smem=K_t.t1_smem(kind, zp, split, 4, 2, 3 * kx))
    want = r + np.stack([sum(ew[t, s] * cpu.linear(hh[3 * t + s:3 * t + s + 1], dn[ids[t, s]])[0]
                             for s in range(3)) for t in range(2)])
    close(out, want, T1_TOL)


def test_cuda_ops_one_token_on_gemv_t1(ops, monkeypatch):
    """CudaOps' one-token linear ops on a tiled int4 record through the gemv_t1 dispatch
    (ops/cuda/linear_quant.py, its K floor lowered to this K): plain, the residual add,
    Normed, and the normed SwiGLU, vs NumPy."""
    from ninfer_nb.ops.cuda import linear_quant as LQ
    from ninfer_nb.ops.cuda.norm import Normed

    monkeypatch.setattr(LQ, "GEMV_T1_MIN_K", 0)
    rng = np.random.default_rng(31)
    fmt = groupwise(4, 64)
    k = 256
    q = quantize(rnd(rng, N, k) * 0.5, fmt)
    gu = quantize(rnd(rng, 64, k) * 0.5, fmt)
    wf, guf = dequantize(q), dequantize(gu)
    x, nw, r = rnd(rng, 1, k), rnd(rng, k), rnd(rng, 1, N)
    close(ops.linear(x, tile(q)), cpu.linear(x, wf), T1_TOL)
    close(ops.linear_add(x, tile(q), r.copy()), r + cpu.linear(x, wf), T1_TOL)
    xn = cpu.rms_norm(x, nw, 1e-6)
    close(ops.linear(Normed(x, nw, 1e-6), tile(q)), cpu.linear(xn, wf), T1_TOL)
    close(ops.linear_swiglu(Normed(x, nw, 1e-6), tile(gu)), cpu.linear_swiglu(xn, guf), T1_TOL)


def test_gemv_tiled_moe(ops):
    """MoE on an int4 stack of 4 experts, 2 tokens x 3 slots (an expert twice): gate_up per
    routed pair, then down summed over each token's slots with their weights into the
    residual."""
    rng = np.random.default_rng(11)
    fmt = groupwise(4, 64)
    e, inter, hid = 4, 32, 128
    gu_args, gu = weight(rng, fmt, (e, 2 * inter, hid))
    dn_args, dn = weight(rng, fmt, (e, hid, inter * 2))                # K = 64: one K-tile per expert
    ids = np.array([[2, 0, 2], [1, 3, 0]], np.int32)
    ew = np.array([[0.5, -1.25, 0.75], [1.0, 0.25, -0.5]], np.float32)
    xn = rnd(rng, 2, hid)
    h = np.full((6, inter), np.nan, np.float32)
    launch(ops, ("i4", False, False, "swiglu", 1, 1, 2, 2, "gate_up"), 2, 6, xn, xn.reshape(-1), gu_args,
           2 * inter, hid, h.reshape(-1), h, False, ids, ew)
    want_h = np.stack([cpu.swiglu(cpu.linear(xn[p // 3:p // 3 + 1], gu[ids.flat[p]]))[0] for p in range(6)])
    close(h, want_h)
    # down: [hid, 64] experts (inter = 32 is half a K-tile of int4: h gets 32 more columns)
    hh = np.concatenate([h, rnd(rng, 6, inter)], axis=1)                 # [6, 64]
    r = rnd(rng, 2, hid)
    out = r.copy()
    launch(ops, ("i4", False, False, "plain", 1, 2, 4, 2, "down"), 4, 2, hh.reshape(2, -1), hh.reshape(-1),
           dn_args, hid, 2 * inter, out.reshape(-1), out, True, ids, ew)
    want = r + np.stack([sum(ew[t, s] * cpu.linear(hh[3 * t + s:3 * t + s + 1], dn[ids[t, s]])[0]
                             for s in range(3)) for t in range(2)])
    close(out, want)


@pytest.mark.parametrize("fmt", [groupwise(4, 32, True), groupwise(4, 128), groupwise(8, 64, True), FP8_BLOCK],
                         ids=lambda f: f.name)
def test_dequant_tiled_bf16(ops, fmt):
    """The prefill's bf16 copy of a tiled weight: dequantize(q) rounded to bf16, bit for bit."""
    import ml_dtypes

    from ninfer_nb.kernels.linear import gemv_tiled as K

    rng = np.random.default_rng(fmt.bits + fmt.group_size)
    q = quantize(rnd(rng, 20, 256), fmt)
    t = tile(q)
    kind, zp, _ = kind_of(fmt)
    out = np.zeros((20, 256), np.uint16)
    scales = t.arrays["scales"].reshape(-1).view(np.uint32)
    zeros = t.arrays["zeros"].reshape(-1) if zp else scales
    ops._go(K.dequant_tiled_bf16_kernel, 1, K.DEQUANT_THREADS, t.arrays["codes"].reshape(-1).view(np.uint32), scales,
            zeros,
            np.int32(K.KINDS.index(kind)), np.int32(zp), np.int32(fmt.group_size.bit_length() - 1), out)
    want = dequantize(q).astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(out, want)


def _tiny_model_logits(ops, cfg, weights_fmt):
    """Decode 3 tokens, then 1, of a tiny random model in `weights_fmt` through CudaOps on the
    tiled records (engine/upload_policy.py's device layout) and through ops.cpu on the
    canonical ones: (got, want) logits of both steps."""
    from dataclasses import replace

    from ninfer_nb.engine.backend import CpuBackend
    from ninfer_nb.engine.batch import ForwardBatch
    from ninfer_nb.models.decoder import Decoder
    from ninfer_nb.models.state import new_state
    from ninfer_nb.models.weights import QuantizedWeight, map_weights
    from ninfer_nb.quant.tiled import device_layout

    w = CpuBackend().random_weights(cfg, seed=3, weights=weights_fmt)
    wt = map_weights(w, lambda r: device_layout(r) if isinstance(r, QuantizedWeight) else r, lambda a: a)
    assert wt.lm_head.format.layout.endswith("-tiled")
    ops.choices = replace(ops.choices, gdn_state="simt", gdn_prepare="simt")   # simulated mma: CI time
    rng = np.random.default_rng(23)
    ids = rng.integers(0, cfg.vocab_size, 8)
    pos = np.arange(8)
    cpu_state = new_state(cfg, 16, np.zeros)
    Decoder(cfg, w).forward(cpu, ForwardBatch.single(ids[:4], pos[:4]), cpu_state)
    sim_state = new_state(cfg, 16, lambda shape, dtype=np.float32: ops.zeros(shape, dtype, persistent=True))
    for dst, src in zip(sim_state.layers, cpu_state.layers):
        for name, buf in vars(src).items():
            if buf is not None:
                getattr(dst, name)[...] = buf
    out = []
    for a, b in ((4, 7), (7, 8)):
        want = Decoder(cfg, w).forward(cpu, ForwardBatch.single(ids[a:b], pos[a:b], all_logits=True), cpu_state)
        got = Decoder(cfg, wt).forward(ops, ForwardBatch.single(ids[a:b].astype(np.int32),
                                                                pos[a:b].astype(np.int32), all_logits=True),
                                       sim_state)
        out.append((got, want))
    return out


@pytest.mark.skipif(not os.environ.get("NINFER_SLOW_SIM"),
                    reason="minutes in the simulator; NINFER_SLOW_SIM=1 runs it (CI keeps the per-op cases)")
def test_tiny_models_decode_on_tiled_weights(ops):
    """A tiny Qwen3.5 hybrid in int4-g64 and a tiny MoE one whose expert stacks are int4 too
    (bench --random --weights): the tiled GEMVs (3 tokens, then 1 with the norm / residual
    fused) and the MoE gate_up / down builds give ops.cpu's logits (x as bf16 operands: 1e-2
    dense (seen 0.4-0.9 %); the MoE model's routing amplifies it to 2.5 % at 3 tokens: 5e-2)."""
    from ninfer_nb.config import ModelConfig
    from ninfer_nb.models.presets import PRESETS

    dense = ModelConfig.from_hf(dict(
        PRESETS["tiny-qwen3.5"], vocab_size=96, hidden_size=64, intermediate_size=64,
        num_hidden_layers=2, full_attention_interval=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32))
    moe = ModelConfig.from_hf(dict(
        PRESETS["tiny-qwen3.5-moe"], vocab_size=96, hidden_size=64, num_hidden_layers=2,
        full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64))
    for cfg, tol in ((dense, 1e-2), (moe, 5e-2)):
        for got, want in _tiny_model_logits(ops, cfg, "int4-g64"):
            close(got, want, tol)


def test_cuda_moe_experts_on_tiled_stacks(ops):
    """CudaOps.moe_experts on tiled int4 stacks (5 experts, 3 slots) for 1 and 3 tokens, the
    residual added in place, vs ops.cpu on the canonical stacks."""
    rng = np.random.default_rng(0)
    fmt = groupwise(4, 64)
    e, hid, inter, k = 5, 64, 64, 3
    gu = quantize(rnd(rng, e, 2 * inter, hid) * 0.2, fmt)
    dn = quantize(rnd(rng, e, hid, inter) * 0.2, fmt)
    for t in (1, 3):
        x = rnd(rng, t, hid)
        ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
        w = rng.random((t, k), dtype=np.float32)
        r = rnd(rng, t, hid)
        want = cpu.moe_experts(x, ids, w, dequantize(gu), dequantize(dn), r.copy())
        got = ops.moe_experts(x, ids, w, tile(gu), tile(dn), r.copy())
        close(np.asarray(got) - r, want - r)


@pytest.mark.parametrize("fmt", [groupwise(4, 32, True), groupwise(8, 128), FP8_BLOCK], ids=lambda f: f.name)
def test_embedding_rows_of_a_tiled_table(ops, fmt):
    """CudaOps.embedding on a tiled quantized table: the dequantized rows, exactly."""
    rng = np.random.default_rng(fmt.group_size + fmt.bits)
    q = quantize(rnd(rng, 40, 256), fmt)
    ids = np.array([0, 39, 17, 8, 17], np.int32)
    got = ops.embedding(tile(q), ids)
    assert np.array_equal(np.asarray(got), dequantize(q)[ids])
