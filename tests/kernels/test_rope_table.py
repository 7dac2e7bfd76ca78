"""The table-driven RoPE kernels (kernels/attention/rope.py) against ops.cpu, at large positions
and with scaled tables (llama3, yarn: frequencies and the cos / sin amplitude).

- `test_simulated_*`: the kernels under the CUDA simulator; they run in the session's simulator pool
  (tests/support/sim_runner.py; the simulator must be on before numba is imported);
- `test_gpu_*` (marked gpu): the kernels on the device, fresh random inputs, real head dims;
- `test_kernel_angle_accuracy_at_262143`: the kernel's angle arithmetic (float64 angle and
  reduction, float32 cos / sin) replayed in NumPy against float64: within 2.5e-7 everywhere.
"""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

from ninfer_nb.config import ModelConfig
from ninfer_nb.models.rope import inv_freq, rope_table
from ninfer_nb.ops import cpu

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
simulated = pytest.mark.skipif(not SIMULATED, reason="runs in the simulator subprocess")
POSITIONS = np.array([0, 1, 31, 33, 4097, 131071, 262143], dtype=np.int32)


def _table(kind: str, head_dim: int, partial: float) -> np.ndarray:
    rope = {"default": {"rope_type": "default"},
            "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192},
            "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 65536}}[kind]
    cfg = ModelConfig.from_hf(dict(model_type="llama", vocab_size=8, hidden_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, head_dim=head_dim, max_position_embeddings=262144,
                                   rope_parameters=dict(rope, rope_theta=1e7, partial_rotary_factor=partial)))
    return rope_table(cfg)


def _close(a, b, tol):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape and np.isfinite(a).all()
    err = np.abs(a - b).max() / np.abs(b).max()
    assert err <= tol, f"relative error {err:.3e} > {tol}"
    return err


def test_kernel_angle_accuracy_at_262143() -> None:
    """rope_angle's arithmetic in NumPy: cos / sin of every frequency of a 256K Qwen3.6-shaped
    rotary table at positions up to 262143, against float64; fp32 cos / sin are correctly
    rounded here, libdevice's cosf / sinf add at most ~1 ulp (6e-8)."""
    cfg = ModelConfig.from_hf(dict(model_type="llama", vocab_size=8, hidden_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, head_dim=256, max_position_embeddings=262144,
                                   rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25}))
    table = rope_table(cfg)
    freq, _ = inv_freq(cfg)
    pos = np.arange(262144 - 4096, 262144, dtype=np.float64)[:, None]
    ang = pos * (table[0].astype(np.float64) + table[1].astype(np.float64))
    r = (ang - np.floor(ang * (1 / (2 * np.pi)) + 0.5) * (2 * np.pi)).astype(np.float32)
    exact = pos * freq
    assert np.abs(np.cos(r).astype(np.float64) - np.cos(exact)).max() < 2.5e-7
    assert np.abs(np.sin(r).astype(np.float64) - np.sin(exact)).max() < 2.5e-7


# --- simulator ---------------------------------------------------------------------------

def _sim_ops():
    from ninfer_nb.ops.cuda import CudaOps
    from tests.support.cuda_helpers import HostArena, SimStream

    return CudaOps(HostArena(), SimStream(), persistent=HostArena())


@simulated
@pytest.mark.parametrize("kind", ["default", "llama3", "yarn"])
def test_simulated_rope(kind: str) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((len(POSITIONS), 3, 24)).astype(np.float32)
    table = _table(kind, 24, 2 / 3)                                # 16 rotated dims of 24
    _close(_sim_ops().rope(x, POSITIONS, table), cpu.rope(x, POSITIONS, table), 1e-6)


@simulated
@pytest.mark.parametrize("cdtype", [np.float32, ml_dtypes.bfloat16])
def test_simulated_qk_norm_rope_store(cdtype) -> None:
    rng = np.random.default_rng(12)
    t, hq, hkv, d = 3, 4, 2, 32
    pos = np.array([33, 4097, 262143], dtype=np.int32)
    table = _table("yarn", d, 0.5)
    q, k, v = (rng.standard_normal((t, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
    qn, kn = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    kc, vc = np.zeros((262144, hkv, d), cdtype), np.zeros((262144, hkv, d), cdtype)
    kc_ref, vc_ref = np.zeros((262144, hkv, d), np.float32), np.zeros((262144, hkv, d), np.float32)
    got = _sim_ops().qk_norm_rope_store(q, k, v, qn, kn, pos, table, 1e-6, kc, vc)
    ref = cpu.qk_norm_rope_store(q, k, v, qn, kn, pos, table, 1e-6, kc_ref, vc_ref)
    _close(got, ref, 1e-6)
    _close(kc[pos].astype(np.float32), kc_ref[pos].astype(cdtype).astype(np.float32),
           1e-6 if cdtype == np.float32 else 8e-3)


# --- GPU -----------------------------------------------------------------------------------

TOL_GPU = 2e-6      # libdevice cosf / sinf of the reduced angle: ~3e-7 expected


@pytest.fixture(scope="module")
def env():
    from tests.kernels.gpu_util import GpuEnv

    return GpuEnv()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["default", "llama3", "yarn"])
@pytest.mark.parametrize("t,heads,d,partial", [(7, 24, 256, 0.25), (5, 8, 128, 1.0)])
def test_gpu_rope(env, kind: str, t: int, heads: int, d: int, partial: float) -> None:
    rng = np.random.default_rng(21)
    ops = env.fresh()
    x = rng.standard_normal((t, heads, d)).astype(np.float32)
    pos = np.sort(rng.integers(200000, 262144, t)).astype(np.int32)
    pos[-1] = 262143
    table = _table(kind, d, partial)
    err = _close(env.host(ops.rope(env.up(x), env.up(pos), env.up(table))), cpu.rope(x, pos, table), TOL_GPU)
    print(f"\nrope {kind} d={d}: relative error {err:.2e} at positions up to 262143")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["llama3", "yarn"])
@pytest.mark.parametrize("cdtype", [np.float32, ml_dtypes.bfloat16])
def test_gpu_qk_norm_rope_store(env, kind: str, cdtype) -> None:
    rng = np.random.default_rng(22)
    ops = env.fresh()
    t, hq, hkv, d, s = 4, 8, 1, 256, 262144                    # a 256K cache: 256 MiB in fp32
    pos = np.array([0, 65535, 131072, 262143], dtype=np.int32)
    table = _table(kind, d, 0.25)
    q, k, v = (rng.standard_normal((t, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
    qn, kn = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    kc_ref, vc_ref = np.zeros((s, hkv, d), np.float32), np.zeros((s, hkv, d), np.float32)
    KC, VC = env.up(np.zeros((s, hkv, d), cdtype)), env.up(np.zeros((s, hkv, d), cdtype))
    got = ops.qk_norm_rope_store(env.up(q), env.up(k), env.up(v), env.up(qn), env.up(kn), env.up(pos),
                                 env.up(table), 1e-6, KC, VC)
    ref = cpu.qk_norm_rope_store(q, k, v, qn, kn, pos, table, 1e-6, kc_ref, vc_ref)
    _close(env.host(got), ref, TOL_GPU)
    _close(env.host(KC)[pos].astype(np.float32), kc_ref[pos].astype(cdtype).astype(np.float32),
           TOL_GPU if cdtype == np.float32 else 8e-3)
