"""Where the 35B decode MoE block's time goes (GPU, not a test): graph-timed sequences of its
kernels over L layers with distinct weights (no L2 reuse between layers, as in the model), each
sequence with and without programmatic dependent launch. Differences between sequences give
the exposed cost of each stage. Usage: python3 dev/moe_probe.py [--layers 8] [--reps 4]"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_nb.kernels.moe import moe as K_moe  # noqa: E402
from ninfer_nb.kernels.random_fill import fill_uniform_bf16_kernel  # noqa: E402
from ninfer_nb.runtime.tensor import bfloat16  # noqa: E402
from tests.kernels.gpu_util import GpuEnv, rnd  # noqa: E402

E, K, I, H = 256, 8, 512, 2048


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--eager", action="store_true", help="run each layer's MoE block once, no graph (for ncu)")
    args = ap.parse_args()
    env = GpuEnv(arena_bytes=(1600 << 20) * args.layers + (4 << 30), scratch_bytes=1 << 30)
    ops = env.fresh()
    rng = np.random.default_rng(0)
    seed = [1]

    def weight(*shape: int) -> Any:
        t = env.arena.empty(shape, bfloat16)
        seed[0] += 1
        fill_uniform_bf16_kernel[1024, 256, env.stream.numba](t.reshape(-1), np.int64(seed[0]),
                                                              np.float32(0.05), np.float32(0.0))
        return t

    layers = [{"gu": weight(E + 1, 2 * I, H), "dn": weight(E + 1, H, I), "r": weight(E + 1, H),
               "w": weight(14080, H)} for _ in range(args.layers)]
    X = env.up(rnd(rng, 1, H))
    NW = env.up(rnd(rng, H))
    env.stream.synchronize()
    # fixed routing per layer (what the router picks), for the expert-only sequences
    fixed = []
    for ly in layers:
        h = ops.empty((K + 1, I))
        ids, w, xn = ops._moe_router_fused(ops.normed(X, NW, 1e-6), ly["r"], K, True, True, ly["gu"], h)
        fixed.append((env.up(env.host(ids)), env.up(env.host(w)), env.up(env.host(xn)), env.up(env.host(h))))
        env.scratch.reset()
    n = args.layers * args.reps
    if args.eager:
        for ly in layers:
            ops.moe(ops.normed(X, NW, 1e-6), ly["r"], K, True, True, ly["gu"], ly["dn"], residual=X)
            ops.linear(ops.normed(X, NW, 1e-6), ly["w"])
        env.stream.synchronize()
        return
    w8 = K_moe.MOE_WARPS

    def each(step: Callable[[dict, tuple], None]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(args.reps):
                for ly, fx in zip(layers, fixed):
                    step(ly, fx)
        return run

    def router(ly: dict, fx: tuple) -> Any:
        h = ops.empty((K + 1, I))
        ids, w, xn = ops._moe_router_fused(ops.normed(X, NW, 1e-6), ly["r"], K, True, True, ly["gu"], h)
        return h, ids, w, xn

    def router_only(ly: dict, fx: tuple) -> None:
        ops._moe_router_fused(ops.normed(X, NW, 1e-6), ly["r"], K, True, True)

    def router_gate_up(ly: dict, fx: tuple) -> None:
        h, ids, _, xn = router(ly, fx)
        ops._go(K_moe.moe_gate_up_wide_kernel, (I // w8, K), 32 * w8, xn, ids, ly["gu"], h)

    def full(ly: dict, fx: tuple) -> None:
        ops.moe(ops.normed(X, NW, 1e-6), ly["r"], K, True, True, ly["gu"], ly["dn"], residual=X)

    def gate_up(ly: dict, fx: tuple) -> None:
        ids, _, xn, h = fx
        ops._go(K_moe.moe_gate_up_wide_kernel, (I // w8, K), 32 * w8, xn, ids, ly["gu"], h)

    def down(ly: dict, fx: tuple) -> None:
        ids, w, _, h = fx
        ops._moe_down_wide(h, ids, w, ly["dn"], 1, H, X)

    def experts(ly: dict, fx: tuple) -> None:
        gate_up(ly, fx)
        down(ly, fx)

    def gemv(ly: dict, fx: tuple) -> None:
        ops.linear(ops.normed(X, NW, 1e-6), ly["w"])

    one = env.up(rnd(rng, 1))

    def tiny(ly: dict, fx: tuple) -> None:
        ops.add_into(one, one)

    def gemv257(ly: dict, fx: tuple) -> None:
        ops.linear(ops.normed(X, NW, 1e-6), ly["r"])

    logits = env.up(rnd(rng, 1, E + 1))

    def route_alone(ly: dict, fx: tuple) -> None:
        ops.moe_route(logits, K, True, True)

    def gemv_route(ly: dict, fx: tuple) -> None:
        ops.moe_route(ops.linear(ops.normed(X, NW, 1e-6), ly["r"]), K, True, True)

    cases = [("1-element add (launch floor)", tiny),
             ("moe_route alone (257 logits, 1 block)", route_alone),
             ("normed GEMV 257 + moe_route", gemv_route),
             ("normed GEMV 257x2048 (router rows)", gemv257),
             ("router (GEMV + shared h + route)", router),
             ("router, no shared blocks", router_only),
             ("router + gate_up", router_gate_up),
             ("full MoE block", full),
             ("gate_up alone (fixed ids)", gate_up),
             ("down alone", down),
             ("gate_up + down", experts),
             ("normed GEMV 14080x2048 (57.7 MB)", gemv)]
    mb = {"full MoE block": (E + 1) * H * 2 / 1e6 + 9 * 3 * I * H * 2 / 1e6,
          "gate_up alone (fixed ids)": 8 * 2 * I * H * 2 / 1e6, "down alone": 9 * I * H * 2 / 1e6,
          "gate_up + down": (8 * 2 + 9) * I * H * 2 / 1e6, "normed GEMV 14080x2048 (57.7 MB)": 14080 * H * 2 / 1e6}
    print(f"{'sequence':40s} {'PDL us':>8s} {'plain us':>9s}  GB/s (PDL)")
    for name, step in cases:
        us = {pdl: env.graph_us(each(step), n, pdl) for pdl in (True, False)}
        bw = f"{mb[name] / us[True] * 1e3:7.0f}" if name in mb else ""
        print(f"{name:40s} {us[True]:8.2f} {us[False]:9.2f}  {bw}")


if __name__ == "__main__":
    main()
