"""Simulator cases of kernels/linear/gemv_quant.py (run by test_gemv_quant.py in a subprocess
with NUMBA_ENABLE_CUDASIM=1): every build kind vs quant/dequant.py + NumPy on fresh random
data. Shapes: N = 11 (a lone last row; swiglu I = 5), so the last block has dead row pairs;
row bytes 2688 = one 4-step pass (2048), one tail step and a last step only 8 lanes reach."""
from __future__ import annotations

import os
from dataclasses import replace

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run through test_gemv_quant.py"

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from ninfer_nb.kernels.linear import gemv_quant as K_q  # noqa: E402
from ninfer_nb.ops import cpu  # noqa: E402
from ninfer_nb.ops.cuda import CudaOps  # noqa: E402
from ninfer_nb.quant.dequant import dequantize, quantize  # noqa: E402
from ninfer_nb.quant.formats import groupwise  # noqa: E402
from tests.support.cuda_helpers import HostArena, SimStream  # noqa: E402

ROW_BYTES = 2688


@pytest.fixture
def ops() -> CudaOps:
    return CudaOps(HostArena(), SimStream(), persistent=HostArena())


def rnd(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def close(a, b, tol):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), "NaN in kernel output (unwritten element?)"
    err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)
    assert err <= tol, f"relative error {err:.3e} > {tol}"


def weight(rng, fmt, n, k):
    """A random [n, k] weight in `fmt` (codes, scales and zero points all non-trivial), its
    kernel arguments and its fp32 dequantization."""
    q = quantize(rnd(rng, n, k), fmt)
    zeros = q.arrays["zeros"] if fmt.zero_points else np.zeros((1, 1), np.uint8)
    args = (q.arrays["codes"], q.arrays["scales"].view(np.uint16), zeros,
            np.int32(fmt.group_size.bit_length() - 1), np.int32(fmt.zero_points))
    return args, dequantize(q)


def run(ops, build, x, nw, wargs, bias, out, has_bias):
    bits, mode, tokens, ways, warps, blocks = build
    n = wargs[0].shape[0]
    pairs = n // 2 if mode == "swiglu" else (n + 1) // 2
    per_block = warps // ways
    ops._go(K_q.gemv_quant(*build), -(-pairs // per_block), 32 * warps, x, nw, np.float32(1e-6), *wargs,
            bias, out, np.int32(has_bias))


CASES = [(4, 32, False), (4, 64, True), (8, 128, False), (8, 32, True)]   # both widths, zero points, 3 groups


@pytest.mark.parametrize("bits,group,zp", CASES)
def test_gemv_quant_one_token(ops, bits, group, zp):
    """T = 1: plain with the residual as bias (aliasing out) at 1, 2 and 4 K slices, normed and
    swiglu with the RMSNorm fused in."""
    rng = np.random.default_rng(bits * 1000 + group + zp)
    fmt = groupwise(bits, group, zp)
    k = ROW_BYTES * 8 // bits
    wargs, wf = weight(rng, fmt, 11, k)
    x, nw, r = rnd(rng, 1, k), rnd(rng, k), rnd(rng, 1, 11)
    for ways in (1, 2, 4):
        out = r.copy()
        run(ops, (bits, "plain", 1, ways, 4, K_q.one_token_blocks(bits, "plain")), x, nw, wargs, out.reshape(-1), out, True)
        close(out, r + cpu.linear(x, wf), 1e-5)
    xn = cpu.rms_norm(x, nw, 1e-6)
    out = np.full((1, 11), np.nan, np.float32)
    run(ops, (bits, "normed", 1, 1, 4, K_q.one_token_blocks(bits, "normed")), x, nw, wargs, out.reshape(-1), out, False)
    close(out, cpu.linear(xn, wf), 1e-5)
    gargs, gf = weight(rng, fmt, 10, k)
    h = np.full((1, 5), np.nan, np.float32)
    nw = nw * np.float32(0.05)         # gate values of a few units: silu does not amplify fp32 rounding
    run(ops, (bits, "swiglu", 1, 1, 4, K_q.one_token_blocks(bits, "swiglu")), x, nw, gargs, h.reshape(-1), h, False)
    close(h, cpu.linear_swiglu(cpu.rms_norm(x, nw, 1e-6), gf), 1e-5)


@pytest.mark.parametrize("bits,group,zp", [CASES[1], CASES[3]])
def test_gemv_quant_tokens(ops, bits, group, zp):
    """T = 5 (a full 4-token pass and a one-token one): plain with a bias at 1 and 4 K slices,
    and swiglu."""
    rng = np.random.default_rng(bits * 77 + group)
    fmt = groupwise(bits, group, zp)
    k = ROW_BYTES * 8 // bits
    wargs, wf = weight(rng, fmt, 11, k)
    x, b = rnd(rng, 5, k), rnd(rng, 11)
    for ways in (1, 4):
        out = np.full((5, 11), np.nan, np.float32)
        run(ops, (bits, "plain", 4, ways, 4, 3), x, b, wargs, b, out, True)
        close(out, cpu.linear(x, wf, b), 1e-5)
    gargs, gf = weight(rng, fmt, 10, k)
    h = np.full((5, 5), np.nan, np.float32)
    x = x * np.float32(0.05)           # gate values of a few units, as in the one-token case
    run(ops, (bits, "swiglu", 4, 1, 4, 3), x, b, gargs, b, h, False)
    close(h, cpu.linear_swiglu(x, gf), 1e-5)


@pytest.mark.parametrize("bits,group,zp", [CASES[1], CASES[2]])
def test_dequant_bf16(ops, bits, group, zp):
    """dequant_bf16_kernel: the bf16 rounding of the NumPy dequantization, bit for bit."""
    rng = np.random.default_rng(bits + group)
    fmt = groupwise(bits, group, zp)
    wargs, wf = weight(rng, fmt, 3, 256)
    out = np.zeros((3, 256), np.uint16)
    ops._go(K_q.dequant_bf16_kernel, 2, K_q.DEQUANT_THREADS, *wargs, np.int32(bits), out)
    assert np.array_equal(out, wf.astype(ml_dtypes.bfloat16).view(np.uint16))


@pytest.mark.parametrize("name", ["int4-g64", "int8-g32-zp"])
def test_cuda_ops_route_quantized_records(ops, name):
    """CudaOps.linear / linear_add / linear_swiglu / linear_split on a QuantizedWeight record
    vs ops.cpu on the same record (dequantized by the NumPy reference): one token (plain and
    Normed), 3 tokens (the 4-token builds) and a 20-token prefill chunk (dequantized to bf16,
    then the dense GEMM; tolerance: the bf16 rounding of the weight)."""
    from ninfer_nb.ops.cuda.norm import Normed
    from ninfer_nb.quant.formats import quant_format

    rng = np.random.default_rng(len(name))
    fmt = quant_format(name)
    k = 256
    q = quantize(rnd(rng, 11, k), fmt)
    gu = quantize(rnd(rng, 10, k) * np.float32(0.05), fmt)
    nw, b = rnd(rng, k), rnd(rng, 11)
    for t in (1, 3, 20):
        tol = 1e-5 if t <= K_q.MAX_TOKENS else 1e-2
        x = rnd(rng, t, k)
        close(ops.linear(x, q, b), cpu.linear(x, q, b), tol)
        r = rnd(rng, t, 11)
        close(ops.linear_add(x, q, r.copy()), r + cpu.linear(x, q), tol)
        close(ops.linear_swiglu(x, gu), cpu.linear_swiglu(x, gu), tol)
        for got, want in zip(ops.linear_split(x, q, b, (4, 7)), cpu.split(cpu.linear(x, q, b), (4, 7))):
            close(got, want, tol)
    x = rnd(rng, 1, k)
    xn = cpu.rms_norm(x, nw, 1e-6)
    close(ops.linear(Normed(x, nw, 1e-6), q), cpu.linear(xn, q), 1e-5)
    close(ops.linear_swiglu(Normed(x, nw, 1e-6), gu), cpu.linear_swiglu(xn, gu), 1e-5)


@pytest.mark.skipif(not os.environ.get("NINFER_SLOW_SIM"),
                    reason="minutes in the simulator; NINFER_SLOW_SIM=1 runs it (CI keeps the per-op cases)")
def test_tiny_hybrid_model_decodes_on_quantized_weights(ops):
    """A tiny Qwen3.5 hybrid (GDN and attention layers) whose projections and LM head are int4
    (bench --random --weights: quant/random.py): 3 tokens (the 4-token GEMVs) and then 1 token
    (the one-token GEMVs, the residual adds as bias) through CudaOps give ops.cpu's logits."""
    from ninfer_nb.config import ModelConfig
    from ninfer_nb.engine.backend import CpuBackend
    from ninfer_nb.engine.batch import ForwardBatch
    from ninfer_nb.models.decoder import Decoder
    from ninfer_nb.models.presets import PRESETS
    from ninfer_nb.models.state import new_state
    from ninfer_nb.models.weights import QuantizedWeight

    cfg = ModelConfig.from_hf(dict(
        PRESETS["tiny-qwen3.5"], vocab_size=96, hidden_size=64, intermediate_size=64,
        num_hidden_layers=2, full_attention_interval=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32))
    w = CpuBackend().random_weights(cfg, seed=3, weights="int4-g32")
    assert isinstance(w.lm_head, QuantizedWeight) and isinstance(w.layers[1].mixer.o, QuantizedWeight)
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
    for a, b in ((4, 7), (7, 8)):
        want = Decoder(cfg, w).forward(cpu, ForwardBatch.single(ids[a:b], pos[a:b], all_logits=True), cpu_state)
        got = Decoder(cfg, w).forward(ops, ForwardBatch.single(ids[a:b].astype(np.int32),
                                                               pos[a:b].astype(np.int32), all_logits=True),
                                      sim_state)
        close(got, want, 1e-4)
