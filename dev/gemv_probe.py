"""How fast each decode GEMV build runs at the models' weight shapes (GPU, not a test): for every
shape, a graph of L launches over L distinct weights (no L2 reuse, as in the model; PDL on),
each kernel build and K-split timed as us per launch and GB/s, against the device copy
bandwidth. The builds: what ops/cuda.py launches by default, and kernels/linear.py
gemv_one_token with 1-8 K slices per row pair, blocks of 8 warps (2-4 per SM) or 4 warps (4-6
per SM). A shape's GEMV repeated is not the model's sequence of different GEMVs: for that, see
dev/chain_probe.py.
Usage: python3 dev/gemv_probe.py [--min-mb 600] [--reps 2]"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_nb.bench import copy_bandwidth  # noqa: E402
from ninfer_nb.kernels.linear import linear as K_lin  # noqa: E402
from ninfer_nb.kernels.random_fill import fill_uniform_bf16_kernel  # noqa: E402
from ninfer_nb.runtime.tensor import bfloat16  # noqa: E402
from tests.kernels.gpu_util import GpuEnv, rnd  # noqa: E402

# (label, N, K, mode): "plain" (x @ W^T into the residual), "normed" (norm fused in), "swiglu"
# (gate_up with norm and SwiGLU; N = 2I)
SHAPES = [("27B down", 5120, 17408, "plain"), ("27B out_proj", 5120, 6144, "plain"),
          ("35B out_proj", 2048, 4096, "plain"), ("27B qkv plain", 14336, 5120, "plain"),
          ("27B attn qkv", 14336, 5120, "normed"), ("27B GDN in", 16480, 5120, "normed"),
          ("35B GDN in", 12352, 2048, "normed"), ("35B attn qkv", 9216, 2048, "normed"),
          ("27B gate_up", 34816, 5120, "swiglu"), ("35B lm_head", 248320, 2048, "plain"),
          ("27B lm_head", 248320, 5120, "plain")]
WAYS = {"plain": (1, 2, 4, 8), "normed": (1, 2, 4, 8), "swiglu": (1, 2)}
BLOCKS = {8: (2, 3, 4), 4: (4, 5, 6)}      # blocks per SM by warps per block


def default_build(ops: Any, mode: str, x: Any, nw: Any, out: Any) -> Callable[[Any], None]:
    """What ops/cuda.py launches today for this mode (its own K-split choice for plain)."""
    if mode == "plain":
        return lambda w: ops._linear_into(x, w, out.reshape(-1), out)
    if mode == "normed":
        return lambda w: ops._linear_into(ops.normed(x, nw, 1e-6), w, None, out)
    return lambda w: ops.linear_swiglu(ops.normed(x, nw, 1e-6), w)


def one_token_launch(ops: Any, mode: str, ways: int, blocks: int, warps: int, x: Any, nw: Any,
                     out: Any) -> Callable[[Any], None]:
    def launch(w: Any) -> None:
        n, k = w.shape
        pairs = n // 2 if mode == "swiglu" else (n + 1) // 2
        per_block = warps // ways
        ops._go(K_lin.gemv_one_token(mode, ways, blocks, warps), (pairs + per_block - 1) // per_block, 32 * warps,
                x, nw, np.float32(1e-6), w, out.reshape(-1), out, np.int32(mode == "plain"))
    return launch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-mb", type=float, default=600.0, help="weight bytes per graph, at least")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated substrings of the shape labels to run")
    args = ap.parse_args()
    env = GpuEnv(arena_bytes=6 << 30, scratch_bytes=256 << 20)
    ops = env.fresh()
    bw = copy_bandwidth("cuda")
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    pool = env.arena.empty((max(int(args.min_mb * 1e6 * 1.6), 2600 << 20) // 2,), bfloat16)   # sliced
    fill_uniform_bf16_kernel[4096, 256, env.stream.numba](pool, np.int64(7), np.float32(0.05), np.float32(0.0))
    rng = np.random.default_rng(0)
    print(f"{'shape':14s} {'N x K':>12s} {'build':12s} {'us':>7s} {'GB/s':>6s} {'of copy':>8s}")
    only = [o for o in args.only.split(",") if o]
    for label, n, k, kind in SHAPES:
        if only and not any(o in label for o in only):
            continue
        per = n * k
        layers = max(4, int(np.ceil(args.min_mb * 1e6 / (2 * per))))
        stride = (per + 4095) // 4096 * 4096
        if stride * layers > pool.shape[0]:
            layers = max(1, pool.shape[0] // stride)
        ws = [pool[i * stride:i * stride + per].reshape(n, k) for i in range(layers)]
        x = env.up(rnd(rng, 1, k))
        nw = env.up(rnd(rng, k))
        out = env.up(rnd(rng, 1, n if kind != "swiglu" else n // 2))
        builds = [("default", default_build(ops, kind, x, nw, out))]
        builds += [(f"w{ways} b{blocks} x{warps}", one_token_launch(ops, kind, ways, blocks, warps, x, nw, out))
                   for warps in (8, 4) for ways in WAYS[kind] if ways <= warps for blocks in BLOCKS[warps]]
        for name, launch in builds:
            def body() -> None:
                for _ in range(args.reps):
                    for w in ws:
                        launch(w)
            us = env.graph_us(body, layers * args.reps)
            gbs = 2 * per / us / 1e3
            print(f"{label:14s} {f'{n}x{k}':>12s} {name:12s} {us:7.2f} {gbs:6.0f} {gbs * 1e9 / bw:7.0%}", flush=True)


if __name__ == "__main__":
    main()
