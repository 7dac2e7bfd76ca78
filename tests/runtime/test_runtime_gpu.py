"""Runtime on a real GPU: transfers, pinned upload, events, and CUDA graph capture/replay of
ops identical to eager execution (with per-step inputs changed in device buffers)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.models.rope import plain_table
from ninfer_nb.ops import cpu
from tests.kernels.gpu_util import GpuEnv, close, rnd, rnd_bf16

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def env() -> GpuEnv:
    return GpuEnv(arena_bytes=4 << 30, scratch_bytes=1 << 30)


def test_device_info(env) -> None:
    from ninfer_nb.runtime import device

    inf = device.info()
    free, total = device.mem_info()
    assert inf.name and inf.compute_capability >= (8, 0) and 0 < free <= total


def test_roundtrip_pinned_and_events(env) -> None:
    from ninfer_nb.runtime.events import Timer
    from ninfer_nb.runtime.pinned import PinnedStaging

    env.fresh()
    rng = np.random.default_rng(101)
    a = rnd(rng, 1000, 333)
    t = env.arena.empty(a.shape, np.float32)
    st = PinnedStaging(1 << 16)                   # forces many chunks
    with Timer(env.stream) as tm:
        st.upload(t, a, env.stream)
    st.close()
    np.testing.assert_array_equal(t.numpy(env.stream), a)
    assert tm.ms >= 0.0
    b = rnd_bf16(rng, 17, 40)
    np.testing.assert_array_equal(env.up(b).numpy().view(np.uint16), b.view(np.uint16))


def test_upload_weights(env) -> None:
    from ninfer_nb.runtime.tensor import bfloat16
    from tests.support.cuda_helpers import upload_weights

    env.fresh()
    rng = np.random.default_rng(102)
    w = {"a.weight": rnd(rng, 64, 32), "a.norm": rnd(rng, 32), "x.conv1d.weight": rnd(rng, 16, 4)}
    seen = []
    out = upload_weights(w, arena=env.arena, stream=env.stream, progress=lambda d, t, n: seen.append(n))
    assert out["a.weight"].dtype == bfloat16 and out["a.norm"].dtype == np.float32
    assert out["x.conv1d.weight"].dtype == np.float32 and seen == list(w)
    np.testing.assert_array_equal(out["a.weight"].numpy(), w["a.weight"].astype(bfloat16))


def test_graph_capture_replay_matches_eager(env) -> None:
    from ninfer_nb.runtime.graph import CudaGraph

    ops = env.fresh()
    rng = np.random.default_rng(103)
    h, hq, hkv, d, s = 2048, 8, 2, 128, 512
    w = rnd_bf16(rng, hq * d, h)
    nw = rnd(rng, h)
    kc, vc = rnd(rng, s, hkv, d), rnd(rng, s, hkv, d)
    W, NW, KC, VC = env.up(w), env.up(nw), env.up(kc), env.up(vc)
    X = env.up(rnd(rng, 1, h))                    # per-step input buffer
    P = env.up(np.array([100], np.int32))         # per-step position buffer
    table = plain_table(64, 1e6)
    TABLE = env.up(table)

    def step():
        env.scratch.reset()
        y = ops.rms_norm(X, NW, 1e-6)
        q = ops.linear(y, W).reshape(1, hq, d)
        q = ops.rope(q, P, TABLE)
        return ops.attention(q, KC, VC, P, d ** -0.5)

    graph = CudaGraph(env.stream)
    step()                                         # warm: compile + load every kernel
    out = graph.capture(step)
    for pos in (100, 7, 400):
        x = rnd(rng, 1, h)
        X.copy_from_numpy(x, env.stream)
        P.copy_from_numpy(np.array([pos], np.int32), env.stream)
        graph.replay()
        got = out.numpy(env.stream)
        eager = step().numpy(env.stream)
        np.testing.assert_array_equal(got, eager)
        q_ref = cpu.rope((cpu.rms_norm(x, nw, 1e-6) @ w.astype(np.float32).T).reshape(1, hq, d),
                         np.array([pos]), table)
        close(got, cpu.attention(q_ref, kc, vc, np.array([pos]), d ** -0.5), 1e-4)
    graph.close()


def test_capture_ends_when_launch_raises(env) -> None:
    from ninfer_nb.runtime.graph import CudaGraph

    env.fresh()
    graph = CudaGraph(env.stream)

    def bad():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        graph.capture(bad)
    env.stream.synchronize()                       # would fail if capture were still open
    assert not graph.ready


def test_direct_launch_matches_numba_dispatch(env) -> None:
    """runtime/launch.py: the same kernels launched through cuLaunchKernel with hand-packed
    parameters and through numba's dispatcher give identical outputs (a 3-signature kernel
    picked by its cache dtype, int32 / float32 scalars, 2-D grids); a dtype or ndim no
    signature takes raises TypeError; prints the host time per launch of both paths (-s)."""
    import time

    from ninfer_nb.kernels import norm as K_norm
    from ninfer_nb.runtime.launch import Launcher
    from ninfer_nb.runtime.tensor import bfloat16

    ops = env.fresh()
    rng = np.random.default_rng(104)
    x, r, w = rnd(rng, 37, 1000), rnd(rng, 37, 1000), rnd(rng, 1000)
    X, Rr, W = env.up(x), env.up(r), env.up(w)
    outs = []
    for direct in (True, False):
        o, s = ops.empty((37, 1000)), ops.empty((37, 1000))
        args = (X, Rr, W, o, s, np.float32(1e-6))
        if direct:
            Launcher(K_norm.add_rms_norm_kernel.get())(37, K_norm.threads_for(1000), env.stream.cu, args)
        else:
            K_norm.add_rms_norm_kernel[37, K_norm.threads_for(1000), env.stream.numba](*args)
        outs.append((env.host(o), env.host(s)))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    ref_n, ref_s = cpu.add_rms_norm(x, r, w, 1e-6)
    close(outs[0][0], ref_n, 1e-5)

    # a 2-signature kernel (fp32 / bf16 caches) on a 2-D grid, picked by the cache dtype
    from ninfer_nb.kernels.attention import attention as K_attn

    launcher = Launcher(K_attn.kv_store_kernel.get())
    assert len(launcher.overloads) == 2
    t, hkv, d = 3, 2, 64
    k, v = env.up(rnd(rng, t, hkv, d)), env.up(rnd(rng, t, hkv, d))
    pos = env.up(np.array([5, 9, 11], np.int32))
    for cdtype in (np.float32, bfloat16):
        caches = {}
        for direct in (True, False):
            kc = env.up(rnd(rng, 16, hkv, d), dtype=cdtype)
            vc = env.up(rnd(rng, 16, hkv, d), dtype=cdtype)
            if direct:
                launcher((hkv, t), 128, env.stream.cu, (kc, vc, k, v, pos))
            else:
                K_attn.kv_store_kernel[(hkv, t), 128, env.stream.numba](kc, vc, k, v, pos)
            caches[direct] = env.host(kc).astype(np.float32)[[5, 9, 11]]
        np.testing.assert_array_equal(caches[True], caches[False])
        close(caches[True], env.host(k), 1e-2 if cdtype == bfloat16 else 0.0)
    with pytest.raises(TypeError, match="no compiled signature"):
        flat = k.reshape(t, hkv * d)                          # ndim 2 where the kernel wants 3
        launcher((hkv, t), 128, env.stream.cu, (flat, flat, k, v, pos))

    # host time per launch (the reason for the direct path)
    n = 2000
    times = {}
    for direct in (True, False):
        o, s = ops.empty((37, 1000)), ops.empty((37, 1000))
        args = (X, Rr, W, o, s, np.float32(1e-6))
        lau = Launcher(K_norm.add_rms_norm_kernel.get())
        env.stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            if direct:
                lau(37, 256, env.stream.cu, args)
            else:
                K_norm.add_rms_norm_kernel[37, 256, env.stream.numba](*args)
        times[direct] = (time.perf_counter() - t0) / n
        env.stream.synchronize()
    print(f"\nhost time per launch, add_rms_norm (5 arrays + 1 scalar): direct {times[True] * 1e6:.1f} us, "
          f"numba dispatcher {times[False] * 1e6:.1f} us")
