"""Where a decode layer's GEMVs lose time to each other (GPU, not a test): the 27B GDN layer's
four GEMVs in the order the model runs them (in_proj normed 16480x5120 -> out_proj 5120x6144
+ residual -> gate_up + SwiGLU 34816x5120 -> down 5120x17408 + residual), over L layers of
distinct weights, captured in one CUDA graph with programmatic dependent launch as the decode
step is, timed per layer for several build choices (K slices, blocks per SM per GEMV), and the
default without PDL. The GDN middle between in_proj and out_proj is left out: this times the
GEMV chain. It launches kernels/linear's gemv_one_token itself (no copy of the kernel).
Usage: python3 dev/chain_probe.py [--layers 4] [--reps 2] [--only default,...]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_nb.bench import copy_bandwidth  # noqa: E402
from ninfer_nb.kernels.linear import linear as K_lin  # noqa: E402
from ninfer_nb.kernels.random_fill import fill_uniform_bf16_kernel  # noqa: E402
from ninfer_nb.ops.cuda import one_token_build  # noqa: E402
from ninfer_nb.runtime.tensor import bfloat16  # noqa: E402
from tests.kernels.gpu_util import GpuEnv, rnd  # noqa: E402

H, INTER, GDN_IN, GDN_V = 5120, 17408, 16480, 6144
# (op, mode, N, K): the chain of one 27B GDN layer
CHAIN = [("in_proj", "normed", GDN_IN, H), ("out_proj", "plain", H, GDN_V),
         ("gate_up", "swiglu", 2 * INTER, H), ("down", "plain", H, INTER)]
# build overrides per variant: op -> (K slices, blocks per SM[, warps per block]); the rest keep
# one_token_build's
VARIANTS: dict[str, dict[str, tuple[int, ...]]] = {
    "default": {},                          # ops/cuda.py one_token_build
    "down b2": {"down": (2, 2)},
    "down w1 b2": {"down": (1, 2)},
    "down w4 b3": {"down": (4, 3)},
    "out b3": {"out_proj": (2, 3)},
    "out w1 b2": {"out_proj": (1, 2)},
    "plain b2": {"down": (2, 2), "out_proj": (2, 2)},
    "down w1 b3": {"down": (1, 3)},
    "out w1 b3": {"out_proj": (1, 3)},
    "plain w1 b3": {"down": (1, 3), "out_proj": (1, 3)},
    "plain w1 b3 in w2": {"down": (1, 3), "out_proj": (1, 3), "in_proj": (2, 2)},
    "normed w2 b2": {"in_proj": (2, 2)},
    "x4": {"in_proj": (1, 4, 4), "out_proj": (2, 4, 4), "gate_up": (1, 4, 4), "down": (2, 6, 4)},
    "x4 plain w1": {"in_proj": (1, 4, 4), "out_proj": (1, 6, 4), "gate_up": (1, 4, 4), "down": (1, 6, 4)},
    "x8": {"in_proj": (1, 2, 8), "out_proj": (2, 2, 8), "gate_up": (1, 2, 8), "down": (2, 3, 8)},
    "gate_up b5": {"gate_up": (1, 5, 4)},
    "in_proj b5": {"in_proj": (1, 5, 4)},
    "normed b5": {"gate_up": (1, 5, 4), "in_proj": (1, 5, 4)},
    "x4 gate_up": {"gate_up": (1, 4, 4)},
    "x4 in_proj": {"in_proj": (1, 4, 4)},
    "x2": {"in_proj": (1, 8, 2), "out_proj": (2, 8, 2), "gate_up": (1, 8, 2), "down": (2, 12, 2)},
    "gate_up w2 b2": {"gate_up": (2, 2)},
}
W = K_lin.GEMV_WARPS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2, help="passes over the layers per graph")
    ap.add_argument("--only", default="", help="comma-separated variant names to time (default: all)")
    args = ap.parse_args()
    env = GpuEnv(arena_bytes=8 << 30, scratch_bytes=256 << 20)
    ops = env.fresh()
    bw = copy_bandwidth("cuda")
    layer_elems = sum(n * k for _, _, n, k in CHAIN)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s; one layer's GEMV weights {2 * layer_elems / 1e6:.1f} MB, "
          f"{args.layers} layers of distinct weights")
    pool = env.arena.empty((args.layers * (layer_elems + 4 * 4096),), bfloat16)   # sliced per layer and op
    fill_uniform_bf16_kernel[4096, 256, env.stream.numba](pool, np.int64(7), np.float32(0.05), np.float32(0.0))
    weights, off = [], 0
    for _ in range(args.layers):
        layer = {}
        for op, _, n, k in CHAIN:
            layer[op] = pool[off:off + n * k].reshape(n, k)
            off += (n * k + 4095) // 4096 * 4096
        weights.append(layer)
    rng = np.random.default_rng(0)
    resid = env.up(rnd(rng, 1, H))                                   # [1, H] the residual stream
    nw = env.up(rnd(rng, H))
    gdn_out = env.up(rnd(rng, 1, GDN_V))                             # stands in for the GDN middle's output
    proj = env.up(rnd(rng, 1, GDN_IN))
    h = env.up(rnd(rng, 1, INTER))
    io = {"in_proj": (resid, proj, None), "out_proj": (gdn_out, resid, resid),
          "gate_up": (resid, h, None), "down": (h, resid, resid)}

    def launch(spec: Any, op: str, mode: str, ways: int, warps: int, w: Any) -> None:
        x, out, bias = io[op]
        n = w.shape[0]
        pairs = n // 2 if mode == "swiglu" else (n + 1) // 2
        ops._go(spec, (pairs + warps // ways - 1) // (warps // ways), 32 * warps, x, nw, np.float32(1e-6), w,
                (bias if bias is not None else out).reshape(-1), out, np.int32(bias is not None))

    def builds(variant: dict[str, tuple[int, ...]]) -> dict[str, tuple[str, int, int, int]]:
        return {op: (mode, *(variant[op] + (W,))[:3]) if op in variant else one_token_build(mode, n, k)
                for op, mode, n, k in CHAIN}

    calls = args.layers * args.reps
    print(f"{'variant':16s} {'us/layer':>9s} {'GB/s':>6s} {'of copy':>8s}  builds (slices, blocks, warps)")
    only = [o for o in args.only.split(",") if o]
    for name, variant in [*VARIANTS.items(), ("default no PDL", {})]:
        if only and name not in only:
            continue
        b = builds(variant)

        def body(b: dict[str, tuple[str, int, int, int]] = b) -> None:
            for _ in range(args.reps):
                for layer in weights:
                    for op, (mode, ways, blocks, warps) in b.items():
                        launch(K_lin.gemv_one_token(mode, ways, blocks, warps), op, mode, ways, warps, layer[op])
        us = env.graph_us(body, calls, pdl=not name.endswith("no PDL"))
        gbs = 2 * layer_elems / us / 1e3
        desc = " ".join(f"{op}:{ways},{blocks},{warps}" for op, (_, ways, blocks, warps) in b.items())
        print(f"{name:16s} {us:9.1f} {gbs:6.0f} {gbs * 1e9 / bw:7.0%}  {desc}", flush=True)


if __name__ == "__main__":
    main()
