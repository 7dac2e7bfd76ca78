"""Does an L2 prefetch of the next GEMV's weight, issued before a latency-bound kernel, make the
GEMV faster? (GPU, not a test.) Graph-timed sequences over L layers with distinct weights, as in
the model: normed in_proj GEMV -> GDN decode middle -> out_proj GEMV, with the out_proj weight
(or its first --cap MB) prefetched by kernels/prefetch.py at several points.
Usage: python3 scripts/prefetch_probe.py [--model 35b|27b] [--layers 8] [--caps 16,32]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_nb.kernels import prefetch as K_pf  # noqa: E402
from ninfer_nb.kernels.random_fill import fill_uniform_bf16_kernel  # noqa: E402
from ninfer_nb.runtime.events import Timer  # noqa: E402
from ninfer_nb.runtime.graph import CudaGraph  # noqa: E402
from ninfer_nb.runtime.tensor import bfloat16  # noqa: E402
from tests.kernels.gpu_util import GpuEnv, rnd  # noqa: E402
from numba import cuda  # noqa: E402
from ninfer_nb.kernels.nbtypes import i32, i64, u16_2  # noqa: E402
from ninfer_nb.kernels.ptx import gptr, prefetch_l2_bulk, prefetch_l2_line, prefetch_l2_line_last  # noqa: E402
from ninfer_nb.kernels.registry import kernel  # noqa: E402


@kernel((u16_2, i64, i64, i32, i64), sim=False)
def probe_prefetch_kernel(w, byte0, nbytes, mode, piece):
    """mode 0: bulk pieces of `piece` bytes, one per thread (spread over blocks); 1: one
    prefetch.global.L2 per 128 bytes; 2: the same with evict_last."""
    base = gptr(w) + byte0
    g = cuda.gridDim.x
    if mode == 0:
        n_pieces = (nbytes + piece - 1) // piece
        p = cuda.threadIdx.x * g + cuda.blockIdx.x
        while p < n_pieces:
            off = p * piece
            prefetch_l2_bulk(base + off, min(piece, nbytes - off))
            p += g * cuda.blockDim.x
    else:
        i = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * 128
        while i < nbytes:
            if mode == 1:
                prefetch_l2_line(base + i)
            else:
                prefetch_l2_line_last(base + i)
            i += g * cuda.blockDim.x * 128

SHAPES = {"35b": dict(H=2048, hk=16, hv=32, d=128), "27b": dict(H=5120, hk=16, hv=48, d=128)}


def timed(env: GpuEnv, ops: Any, fn: Callable[[], Any], n: int) -> float:
    def body() -> None:
        env.scratch.reset()
        fn()
    with ops.programmatic_launches(True):
        body()
        g = CudaGraph(env.stream)
        g.capture(body)
    g.replay()
    best = 1e9
    for _ in range(7):
        with Timer(env.stream) as t:
            g.replay()
        best = min(best, t.ms)
    g.close()
    return best * 1000.0 / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="35b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--caps", default="8,16,32,64")
    ap.add_argument("--grid", type=int, default=132)
    args = ap.parse_args()
    s = SHAPES[args.model]
    H, hk, hv, d = s["H"], s["hk"], s["hv"], s["d"]
    qk, vd = hk * d, hv * d
    c = 2 * qk + vd
    n_in = c + vd + 2 * hv
    env = GpuEnv(arena_bytes=(n_in + H) * max(H, vd) * 2 * args.layers + (2 << 30), scratch_bytes=1 << 30)
    ops = env.fresh()
    rng = np.random.default_rng(0)
    seed = [1]

    def weight(*shape: int) -> Any:
        t = env.arena.empty(shape, bfloat16)
        seed[0] += 1
        fill_uniform_bf16_kernel[1024, 256, env.stream.numba](t.reshape(-1), np.int64(seed[0]),
                                                              np.float32(0.02), np.float32(0.0))
        return t

    layers = []
    for _ in range(args.layers):
        layers.append(dict(w_in=weight(n_in, H), w_out=weight(H, vd), cs=env.up(rnd(rng, 3, c)),
                           st=env.up(rnd(rng, hv, d, d, scale=0.1))))
    consts = (env.up(rnd(rng, c, 4, scale=0.5)), env.up(rnd(rng, hv, scale=0.5)), env.up(rnd(rng, hv)))
    NWG = env.up(rnd(rng, d))
    X = env.up(rnd(rng, 1, H))
    NW = env.up(rnd(rng, H))
    env.stream.synchronize()
    out_mb = H * vd * 2 / 1e6

    def prefetch(ly: dict, cap_mb: float, early: bool) -> None:
        nbytes = min(H * vd * 2, int(cap_mb * 1e6) // 16 * 16)
        spec = K_pf.l2_prefetch_early_kernel if early else K_pf.l2_prefetch_kernel
        ops._go(spec, args.grid, K_pf.PREFETCH_THREADS, ly["w_out"], np.int64(0), np.int64(nbytes))

    def layer(pf: str, cap: float) -> Callable[[dict], None]:
        def run(ly: dict) -> None:
            proj = ops.linear(ops.normed(X, NW, 1e-6), ly["w_in"])
            parts = ops.split(proj, (c, vd, hv, hv))
            if pf in ("wait", "early"):
                prefetch(ly, cap, pf == "early")
            o = ops.gdn_decode(*parts, ly["cs"], *consts, ly["st"], NWG, 1e-6, hk)
            if pf == "late":
                prefetch(ly, cap, False)
            ops.linear(o, ly["w_out"])
        return run

    def in_gdn(ly: dict) -> None:
        proj = ops.linear(ops.normed(X, NW, 1e-6), ly["w_in"])
        parts = ops.split(proj, (c, vd, hv, hv))
        ops.gdn_decode(*parts, ly["cs"], *consts, ly["st"], NWG, 1e-6, hk)

    o1 = env.up(rnd(rng, 1, vd))

    def out_only(ly: dict) -> None:
        ops.linear(o1, ly["w_out"])

    def each(step: Callable[[dict], None], reps: int = 4) -> Callable[[], None]:
        def run() -> None:
            for _ in range(reps):
                for ly in layers:
                    step(ly)
        return run

    n = 4 * args.layers
    print(f"{args.model}: in_proj {n_in}x{H}, GDN Hv={hv}, out_proj {H}x{vd} ({out_mb:.1f} MB); us per layer")
    print(f"{'in_proj + gdn':40s} {timed(env, ops, each(in_gdn), n):8.2f}")
    print(f"{'out_proj alone':40s} {timed(env, ops, each(out_only), n):8.2f}")
    print(f"{'in + gdn + out (no prefetch)':40s} {timed(env, ops, each(layer('none', 0)), n):8.2f}")
    cap0 = float(args.caps.split(",")[0])
    nb0 = min(H * vd * 2, int(cap0 * 1e6) // 16 * 16)
    variants = [("bulk 64K", 0, 1 << 16, 32), ("bulk 8K", 0, 1 << 13, 32), ("bulk 2K", 0, 1 << 11, 128),
                ("lines", 1, 128, 256), ("lines evict_last", 2, 128, 256)]

    def pf_probe(ly: dict, v: tuple) -> None:
        ops._go(probe_prefetch_kernel, args.grid, v[3], ly["w_out"], np.int64(0), np.int64(nb0), np.int32(v[1]),
                np.int64(v[2]))

    def gdn_only(ly: dict) -> None:
        ops.gdn_decode(*ops.split(ly["proj"], (c, vd, hv, hv)), ly["cs"], *consts, ly["st"], NWG, 1e-6, hk)

    for ly in layers:
        ly["proj"] = env.up(rnd(rng, 1, n_in))
    print(f"{'gdn alone':40s} {timed(env, ops, each(gdn_only), n):8.2f}")
    for v in variants:
        print(f"{'[' + v[0] + f' {nb0 / 1e6:.0f} MB] alone':40s} {timed(env, ops, each(lambda ly: pf_probe(ly, v)), n):8.2f}")
        print(f"{'[' + v[0] + '] -> out_proj':40s} "
              f"{timed(env, ops, each(lambda ly: (pf_probe(ly, v), out_only(ly))), n):8.2f}")
        print(f"{'[' + v[0] + '] -> gdn -> out_proj':40s} "
              f"{timed(env, ops, each(lambda ly: (pf_probe(ly, v), gdn_only(ly), out_only(ly))), n):8.2f}")
    print(f"{'gdn -> out_proj':40s} {timed(env, ops, each(lambda ly: (gdn_only(ly), out_only(ly))), n):8.2f}")
    for cap in [float(x) for x in args.caps.split(",")]:
        for pf in ("wait", "early", "late"):
            name = f"prefetch {min(cap, out_mb):.0f} MB, {pf}"
            print(f"{name:40s} {timed(env, ops, each(layer(pf, cap)), n):8.2f}")


if __name__ == "__main__":
    main()
