"""Where the 35B decode MoE block's time goes (GPU, not a test): graph-timed sequences of its
kernels over L layers with distinct weights (no L2 reuse between layers, as in the model), each
sequence with and without programmatic dependent launch. Differences between sequences give
the exposed cost of each stage. Usage: python3 dev/moe_probe.py [--layers 8] [--reps 4]

--rows T1,T2,..: the experts alone (moe_experts, fixed random routing per layer: k distinct
experts + the shared slot per token) for T tokens, the per-pair kernels vs kernels/moe/moe_rows.py
(MOE_ROWS), us per layer and GB/s of the distinct experts' bytes, the new path's kernels one by
one, the largest relative difference between the two paths' outputs, and the whole MoE block
with its router (ops.moe, routing from random router weights) old -> new."""
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
    ap.add_argument("--rows", default="", help="token counts for the few-token experts probe, e.g. 1,4,8,16")
    args = ap.parse_args()
    if args.rows:
        rows_probe(args)
        return
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


def rows_probe(args: argparse.Namespace) -> None:
    from ninfer_nb.kernels.moe import moe_rows as R
    from ninfer_nb.ops.cuda import moe as M

    n_l = args.layers
    env = GpuEnv(arena_bytes=(1700 << 20) * n_l + (2 << 30), scratch_bytes=1 << 30)
    ops = env.fresh()
    rng = np.random.default_rng(0)
    seed = [100]

    def weight(*shape: int) -> Any:
        t = env.arena.empty(shape, bfloat16)
        seed[0] += 1
        fill_uniform_bf16_kernel[1024, 256, env.stream.numba](t.reshape(-1), np.int64(seed[0]),
                                                              np.float32(0.05), np.float32(0.0))
        return t

    layers = [(weight(E + 1, 2 * I, H), weight(E + 1, H, I)) for _ in range(n_l)]
    routers = [weight(E + 1, H) for _ in range(n_l)]
    env.stream.synchronize()
    expert_mb = 3 * I * H * 2 / 1e6
    print(f"{'T':>3s} {'experts':>7s} {'old us':>8s} {'new us':>8s} {'x':>5s} {'old GB/s':>8s} {'new GB/s':>8s} "
          f"{'maxdiff':>8s}  new: prep / gate_up w4 w8 / down w4 w8 / combine us", flush=True)
    for t in [int(v) for v in args.rows.split(",")]:
        ids_h = [np.stack([np.r_[rng.permutation(E)[:K], E] for _ in range(t)]).astype(np.int32) for _ in layers]
        ids = [env.up(a) for a in ids_h]
        ws = [env.up(rng.uniform(0.05, 0.3, (t, K + 1)).astype(np.float32)) for _ in layers]
        x = env.up(rnd(rng, t, H))
        res = env.up(rnd(rng, t, H))
        distinct = float(np.mean([len(np.unique(a)) for a in ids_h]))
        us = {}
        outs = {}
        for mode in (False, True):
            if mode and t < 2:
                continue
            M.MOE_ROWS = mode

            def run() -> None:
                for _ in range(args.reps):
                    for (gu, dn), i_, w_ in zip(layers, ids, ws):
                        ops.moe_experts(x, i_, w_, gu, dn, residual=res)
            us[mode] = env.graph_us(run, n_l * args.reps)

            def run_full() -> None:                  # the MoE block with its router (ops.moe)
                for _ in range(args.reps):
                    for (gu, dn), r in zip(layers, routers):
                        ops.moe(x, r, K, True, True, gu, dn, residual=res)
            if t == 8 or t == 1:
                us[("full", mode)] = env.graph_us(run_full, n_l * args.reps)
            env.scratch.reset()
            outs[mode] = env.host(ops.moe_experts(x, ids[0], ws[0], layers[0][0], layers[0][1]))
        M.MOE_ROWS = True
        mb = distinct * expert_mb
        if True not in us:
            print(f"{t:3d} {distinct:7.1f} {us[False]:8.1f} {'-':>8s} {'-':>5s} {mb / us[False] * 1e3:8.0f}"
                  f"  ops.moe {us[('full', False)]:.1f}", flush=True)
            continue
        ref = outs[False]
        diff = float(np.abs(outs[True] - ref).max() / np.abs(ref).max())
        parts = rows_parts(env, ops, R, layers, ids, ws, x, t, args.reps)
        print(f"{t:3d} {distinct:7.1f} {us[False]:8.1f} {us[True]:8.1f} {us[False] / us[True]:5.2f} "
              f"{mb / us[False] * 1e3:8.0f} {mb / us[True] * 1e3:8.0f} {diff:8.1e}  "
              + " / ".join(f"{v:.1f}" for v in parts)
              + (f"  ops.moe {us[('full', False)]:.1f} -> {us[('full', True)]:.1f}" if t == 8 else ""), flush=True)
    one = env.up(rnd(rng, 1))

    def tiny() -> None:
        for _ in range(args.reps * n_l):
            ops.add_into(one, one)
    print(f"launch floor (1-element add in the graph): {env.graph_us(tiny, n_l * args.reps):.1f} us", flush=True)


def rows_parts(env: Any, ops: Any, R: Any, layers: list, ids: list, ws: list, x: Any, t: int, reps: int) -> list[float]:
    """us per layer of each moe_rows kernel alone (the other kernels' outputs precomputed per layer):
    prep, gate_up (4 / 8 warps), down (4 / 8 warps), combine."""
    n_slots = K + 1
    n_pairs = t * n_slots
    n_it = R.max_items(n_pairs, E + 1)
    bufs = []
    for _ in layers:
        b = {"items": env.up(np.zeros((n_it, 3), np.int32)), "order": env.up(np.zeros(n_pairs, np.int32)),
             "n": env.up(np.zeros(1, np.int32)), "xhi": env.up(np.zeros((t, H), np.uint16)),
             "xlo": env.up(np.zeros((t, H), np.uint16)), "hhi": env.up(np.zeros((n_pairs, I), np.uint16)),
             "hlo": env.up(np.zeros((n_pairs, I), np.uint16)), "y": env.up(np.zeros((n_pairs, H), np.float32)),
             "out": env.up(np.zeros((t, H), np.float32))}
        bufs.append(b)
    pt = R.PREP_THREADS

    def prep(b: dict, gu: Any, dn: Any, i_: Any, w_: Any) -> None:
        ops._go(R.moe_rows_prep_kernel, 1 + (t * H // 8 + pt - 1) // pt, pt, i_, x, np.int32(E + 1),
                b["items"], b["order"], b["n"], b["xhi"], b["xlo"])

    def gate_up(w: int) -> Any:
        def f(b: dict, gu: Any, dn: Any, i_: Any, w_: Any) -> None:
            ops._go(R.moe_rows_gate_up_kernel, (I // 16, n_it), 32 * w, b["xhi"], b["xlo"], gu, b["items"],
                    b["order"], b["n"], np.int32(n_slots), b["hhi"], b["hlo"])
        return f

    def down(w: int) -> Any:
        def f(b: dict, gu: Any, dn: Any, i_: Any, w_: Any) -> None:
            ops._go(R.moe_rows_down_kernel, (H // (16 * w), n_it), 32 * w, b["hhi"], b["hlo"], dn, b["items"],
                    b["order"], b["n"], w_.reshape(-1), b["y"])
        return f

    def combine(b: dict, gu: Any, dn: Any, i_: Any, w_: Any) -> None:
        ct = R.COMBINE_THREADS
        ops._go(R.moe_rows_combine_kernel, ((H + ct - 1) // ct, t), ct, b["y"], i_, np.int32(E + 1), b["out"],
                np.int32(1))

    res = []
    for step in (prep, gate_up(4), gate_up(8), down(4), down(8), combine):
        for b, (gu, dn), i_, w_ in zip(bufs, layers, ids, ws):     # the inputs of the later steps
            step(b, gu, dn, i_, w_)

        def run(step: Any = step) -> None:
            for _ in range(reps):
                for b, (gu, dn), i_, w_ in zip(bufs, layers, ids, ws):
                    step(b, gu, dn, i_, w_)
        res.append(env.graph_us(run, len(layers) * reps))
    return res


if __name__ == "__main__":
    main()
