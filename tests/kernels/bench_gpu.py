"""Quick GPU timings of the decode-critical kernels (not a test): each op captured 20x into one
CUDA graph, replayed, timed with CUDA events.  Usage: python3 tests/kernels/bench_gpu.py"""
from __future__ import annotations

import numpy as np

from ninfer_nb.runtime.events import Timer
from ninfer_nb.runtime.graph import CudaGraph
from tests.kernels.gpu_util import GpuEnv, rnd, rnd_bf16


def bench(env: GpuEnv, fn, reps: int = 20) -> float:
    fn()
    g = CudaGraph(env.stream)
    g.capture(lambda: [fn() for _ in range(reps)])
    g.replay()
    best = 1e9
    for _ in range(3):
        with Timer(env.stream) as t:
            g.replay()
        best = min(best, t.ms / reps)
    g.close()
    return best * 1000.0


def main() -> None:
    env = GpuEnv(arena_bytes=12 << 30, scratch_bytes=1 << 30)
    ops = env.fresh()
    rng = np.random.default_rng(0)
    rows = []
    for n, k in [(17408, 5120), (5120, 17408), (248320, 5120)]:
        W = env.up(rnd_bf16(rng, n, k))
        for t in (1, 4, 16):
            X = env.up(rnd(rng, t, k))
            us = bench(env, lambda: (env.scratch.reset(), ops.linear(X, W)))
            rows.append(f"linear bf16 N={n} K={k} T={t}: {us:8.1f} us  {n * k * 2 / us / 1e3:7.0f} GB/s")
        X = env.up(rnd(rng, 512, k))
        us = bench(env, lambda: (env.scratch.reset(), ops.linear(X, W)), reps=3) if n < 100000 else 0.0
        if us:
            rows.append(f"linear bf16 N={n} K={k} T=512 (gemm): {us:8.1f} us  {2 * 512 * n * k / us / 1e6:7.1f} TFLOP/s")
        env.arena.offset = env.mark
    for ctx in (1024, 32768):
        KC = env.up(rnd_bf16(rng, ctx, 4, 256))
        VC = env.up(rnd_bf16(rng, ctx, 4, 256))
        Q = env.up(rnd(rng, 1, 24, 256))
        P = env.up(np.array([ctx - 1], np.int32))
        us = bench(env, lambda: (env.scratch.reset(), ops.attention(Q, KC, VC, P, 0.0625)))
        rows.append(f"attention decode 24/4x256 bf16 cache ctx={ctx}: {us:8.1f} us  {2 * ctx * 4 * 256 * 2 / us / 1e3:6.0f} GB/s")
        env.arena.offset = env.mark
    q, k, v = env.up(rnd(rng, 1, 16, 128)), env.up(rnd(rng, 1, 16, 128)), env.up(rnd(rng, 1, 48, 128))
    g, b = env.up(-np.abs(rnd(rng, 1, 48))), env.up(rnd(rng, 1, 48))
    st = env.up(rnd(rng, 48, 128, 128, scale=0.01))
    us = bench(env, lambda: (env.scratch.reset(), ops.gated_delta_rule(q, k, v, g, b, st)))
    rows.append(f"gated_delta_rule decode 16/48x128: {us:8.1f} us  {2 * 48 * 128 * 128 * 4 / us / 1e3:6.0f} GB/s state r+w")
    x = env.up(rnd(rng, 1, 5120))
    nw = env.up(rnd(rng, 5120))
    us = bench(env, lambda: (env.scratch.reset(), ops.rms_norm(x, nw, 1e-6)))
    rows.append(f"rms_norm 1x5120: {us:8.1f} us")
    logits = env.up(rnd(rng, 1, 248320))
    one = lambda a, d: env.up(np.array([a], d))  # noqa: E731
    tp, tk, pp, mp, sd, of = one(0.7, np.float32), one(50, np.int32), one(0.9, np.float32), one(0.0, np.float32), \
        one(1, np.int64), one(0, np.int64)
    us = bench(env, lambda: (env.scratch.reset(), ops.sample(logits, tp, tk, pp, mp, sd, of)), reps=5)
    rows.append(f"sample 1x248320 (top-k 50, top-p 0.9): {us:8.1f} us")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
