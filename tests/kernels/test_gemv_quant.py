"""kernels/linear/gemv_quant.py: the quantized decode GEMVs and the prefill dequantization.

- the simulator cases (tests/kernels/gemv_quant_sim.py, run by the session's simulator pool,
  tests/support/sim_runner.py) against quant/dequant.py + NumPy on fresh random data;
- with NINFER_SLOW_SIM=1, every build compiles to PTX without float64 instructions and
  assembles for sm_90a with ptxas without register spills (these SIMT builds are the fallback of
  the tiled GEMVs; test_compile_sm90 compiles them in every run);
- on the GPU (`-m gpu`): CudaOps' quantized linear ops vs the NumPy reference at the 27B and
  35B-A3B shapes, printing GB/s of the quantized bytes from a CUDA graph of the GEMV.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ninfer_nb.kernels.linear import gemv_quant as K_q

ROOT = Path(__file__).resolve().parents[2]
BUILD_NAMES = sorted({K_q.gemv_quant(*b).name for b in K_q.BUILDS} | {K_q.dequant_bf16_kernel.name})


def _spec(name: str):
    from ninfer_nb.kernels.common.registry import all_specs
    return all_specs()[name]


@pytest.mark.usefixtures("pretend_cc90_device")
@pytest.mark.skipif(os.environ.get("NINFER_SLOW_SIM") != "1",
                    reason="the SIMT fallback's builds (test_compile_sm90 compiles them); ptxas with NINFER_SLOW_SIM=1")
@pytest.mark.parametrize("name", BUILD_NAMES)
def test_ptx_has_no_float64_and_assembles_without_spills(name: str, tmp_path: Path) -> None:
    from numba import cuda

    from tests.kernels.test_ptxas import PTXAS

    spec = _spec(name)
    ptx, _ = cuda.compile_ptx(spec.entry(), spec.sigs[0], cc=(9, 0, "a"), **spec.options)
    ops = set(re.findall(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)", ptx, re.M))
    assert not sorted(op for op in ops if ".f64" in op), f"{name}: float64 instructions"
    if PTXAS is None:
        pytest.skip("ptxas not installed (pip install nvidia-cuda-nvcc)")
    src = tmp_path / f"{name}.ptx"
    src.write_text(ptx)
    r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / f"{name}.cubin")],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "Unsupported .version" in r.stderr:
        pytest.skip(f"ptxas older than NVVM: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    assert regs and spills, r.stderr
    print(f"\n{name}: {regs.group(1)} registers, spills {spills.group(1)}/{spills.group(2)} B")
    assert spills.group(1) == "0" and spills.group(2) == "0", r.stderr


def test_builds_reject_unknown_modes() -> None:
    with pytest.raises(ValueError):
        K_q.gemv_quant(4, "normed", 4, 1, 8, 2)          # normed input: one token only
    with pytest.raises(ValueError):
        K_q.gemv_quant(3, "plain", 1, 1, 4, 4)


# ---------------------------------------------------------------- GPU (pytest -m gpu)
L2_BYTES = 64 << 20          # timing: enough distinct copies of a weight that L2 cannot hold them


def _matrix_shapes(preset: str) -> list[tuple[int, int]]:
    """The preset's 2-D linear weight shapes (projections, LM head; not the small gate rows)."""
    from types import SimpleNamespace

    from ninfer_nb.models.presets import preset_config, random_weights

    shapes: set[tuple[int, int]] = set()

    def make(shape: tuple[int, ...], kind: str) -> SimpleNamespace:
        if kind == "matrix" and min(shape) > 8:
            shapes.add((int(shape[0]), int(shape[1])))
        return SimpleNamespace(shape=shape)

    random_weights(preset_config(preset), make)
    return sorted(shapes)


def _random_quantized(rng, fmt, n: int, k: int):
    """A QuantizedWeight [n, k] of fresh random codes, scales (and zero points) on the host."""
    from ninfer_nb.models.weights import QuantizedWeight

    groups = k // fmt.group_size
    arrays = {"codes": rng.integers(0, 256, (n, k * fmt.bits // 8), dtype=np.uint8),
              "scales": ((rng.random((n, groups), dtype=np.float32) + 0.5) / (fmt.midpoint * np.sqrt(k)))
              .astype(np.float16)}
    if fmt.zero_points:
        arrays["zeros"] = rng.integers(0, fmt.max_code + 1, (n, groups), dtype=np.uint8)
    return QuantizedWeight(fmt, (n, k), arrays)


@pytest.fixture(scope="module")
def env():
    from tests.kernels.gpu_util import GpuEnv
    return GpuEnv()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int4-g64", "int8-g128", "int4-g128-zp"])
@pytest.mark.parametrize("preset", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_gpu_linear_matches_numpy_at_model_shapes(env, preset: str, name: str) -> None:
    """CudaOps.linear on every matrix shape of the preset in `name` vs the NumPy dequantization
    (all rows, or 512 random rows of the LM head), for 1 and 4 tokens, then the one-token GEMV
    timed from a CUDA graph over enough copies of the weight to miss L2 (GB/s of its bytes:
    codes, scales, zero points)."""
    from ninfer_nb.quant.dequant import dequantize_rows
    from ninfer_nb.quant.formats import quant_format
    from tests.kernels.gpu_util import close, rnd, stable_seed

    fmt = quant_format(name)
    rng = np.random.default_rng(stable_seed(preset, name))
    for n, k in _matrix_shapes(preset):
        ops = env.fresh()
        q = _random_quantized(rng, fmt, n, k)
        rows = np.arange(n) if n * k <= 1 << 27 else np.sort(rng.choice(n, 512, replace=False))
        w_rows = dequantize_rows(q, rows)                                          # [R, K] fp32
        qd = q.map_arrays(env.up)
        for t in (1, 4):
            x = rnd(rng, t, k)
            got = env.host(ops.linear(env.up(x), qd))[:, rows]
            close(got, x.astype(np.float64) @ w_rows.T.astype(np.float64), 1e-4)
        copies = [qd] + [q.map_arrays(env.up) for _ in range(min(7, L2_BYTES // q.nbytes))]
        xd = env.up(rnd(rng, 1, k))

        def run() -> None:
            for c in copies:
                ops.linear(xd, c)

        us = env.graph_us(run, len(copies))
        print(f"\n{preset} {name} {n}x{k}: {us:.1f} us, {q.nbytes / us / 1e3:.0f} GB/s")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["int4-g64", "int8-g128"])
def test_gpu_fused_modes_match_numpy(env, name: str) -> None:
    """The decode step's fused GEMVs on the 27B's shapes: the normed input (RMSNorm on load),
    SwiGLU (one normed token, and 5 plain tokens) and the residual add (linear_add)."""
    from ninfer_nb.ops import cpu
    from ninfer_nb.ops.cuda.norm import Normed
    from ninfer_nb.quant.dequant import dequantize
    from ninfer_nb.quant.formats import quant_format
    from tests.kernels.gpu_util import close, rnd

    fmt = quant_format(name)
    rng = np.random.default_rng(7 + fmt.bits)
    ops = env.fresh()
    h, inter = 5120, 17408
    for n, k in ((12288, h), (2 * inter, h), (h, inter)):
        q = _random_quantized(rng, fmt, n, k)
        wf = dequantize(q)
        qd = q.map_arrays(env.up)
        x, nw = rnd(rng, 1, k), rnd(rng, k)
        xn = cpu.rms_norm(x, nw, 1e-6)
        got = env.host(ops.linear(Normed(env.up(x), env.up(nw), 1e-6), qd))
        close(got, cpu.linear(xn, wf), 1e-4)
        if n == 2 * inter:
            got = env.host(ops.linear_swiglu(Normed(env.up(x), env.up(nw * np.float32(0.05)), 1e-6), qd))
            close(got, cpu.linear_swiglu(cpu.rms_norm(x, nw * np.float32(0.05), 1e-6), wf), 1e-4)
            x5 = rnd(rng, 5, k, scale=0.05)
            close(env.host(ops.linear_swiglu(env.up(x5), qd)), cpu.linear_swiglu(x5, wf), 1e-4)
        r = rnd(rng, 1, n)
        got = env.host(ops.linear_add(env.up(x), qd, env.up(r)))
        close(got, r + cpu.linear(x, wf), 1e-4)


def test_random_quantized_weights_name_the_projections_and_run_on_the_cpu() -> None:
    """`bench --random PRESET --weights FMT`: the preset's projections, LM head and expert
    stacks take the format, the embedding and the MoE routers stay dense; a tiny random model
    in int4 generates on the CPU backend (ops.cpu dequantizes)."""
    from types import SimpleNamespace

    from ninfer_nb.config import EngineConfig
    from ninfer_nb.llm import LLM
    from ninfer_nb.models.presets import preset_config, random_weights
    from ninfer_nb.models.weights import DenseWeight, QuantizedWeight
    from ninfer_nb.params import SamplingParams
    from ninfer_nb.quant.random import quantized_calls

    for preset in ("qwen3.6-27b", "qwen3.6-35b-a3b"):
        calls: list[SimpleNamespace] = []

        def make(shape: tuple[int, ...], kind: str) -> SimpleNamespace:
            calls.append(SimpleNamespace(shape=tuple(shape), kind=kind, index=len(calls)))
            return calls[-1]

        w = random_weights(preset_config(preset), make)
        picked = quantized_calls(preset_config(preset))
        kinds = {calls[i].kind for i in picked}
        assert kinds == ({"matrix", "experts"} if preset.endswith("a3b") else {"matrix"})
        assert w.embed.index not in picked and w.lm_head.index in picked
        routers = [layer.ffn.router.index for layer in w.layers if hasattr(layer.ffn, "router")]
        assert routers and not set(routers) & picked if preset.endswith("a3b") else not routers
    llm = LLM(config=EngineConfig(model="random:tiny-qwen3.5", device="cpu", weights="int4-g32",
                                  show_progress=False, max_context=32))
    w = llm.engine.generator.decoder.weights
    assert isinstance(w.embed, DenseWeight) and isinstance(w.lm_head, QuantizedWeight)
    assert all(isinstance(layer.ffn.gate_up, QuantizedWeight) for layer in w.layers)
    out = llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 2
