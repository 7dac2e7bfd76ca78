"""Where a decode layer's GEMVs lose time to each other (GPU, not a test): the 27B GDN layer's
four GEMVs in the order the model runs them (in_proj normed 16480x5120 -> out_proj 5120x6144
+ residual -> gate_up + SwiGLU 34816x5120 -> down 5120x17408 + residual), over L layers of
distinct weights, captured in one CUDA graph with programmatic dependent launch as the decode
step is, timed per layer for several build choices (K slices, blocks per SM per GEMV), without
PDL too. The GDN middle between in_proj and out_proj is left out: this times the GEMV chain.

`--trace VARIANT`: the same chain with traced copies of that variant's builds (kernels/linear.py
gemv_one_token's body plus `%globaltimer` stamps by thread 0 of every block: start, first
grid-dependency wait returned, streaming done, end; and `%smid`), one replay, then per kernel
of a middle layer: when its first block started and its wait released relative to the
previous kernel's last block, its span (previous end -> own end) and GB/s over that span, and
how long its last blocks trail (drain). Usage: python3 scripts/chain_probe.py [--layers 4]
[--trace default] [--only default,...]"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda, float32

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_nb.bench import copy_bandwidth  # noqa: E402
from ninfer_nb.kernels.linear import linear as K_lin  # noqa: E402
from ninfer_nb.kernels.common.nbtypes import f32, f32_1, f32_2, i32, i64_1, u16_2  # noqa: E402
from ninfer_nb.kernels.common.ptx import globaltimer, grid_dependency_sync, smid  # noqa: E402
from ninfer_nb.kernels.random_fill import fill_uniform_bf16_kernel  # noqa: E402
from ninfer_nb.kernels.common.registry import kernel  # noqa: E402
from ninfer_nb.kernels.common.warp import warp_sum  # noqa: E402
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
    "gate_up b5": {"gate_up": (1, 5, 4)},   # 96 registers: 188.1 vs 186.6 us (H200)
    "in_proj b5": {"in_proj": (1, 5, 4)},   # 191.3
    "normed b5": {"gate_up": (1, 5, 4), "in_proj": (1, 5, 4)},     # 192.7
    "x4 gate_up": {"gate_up": (1, 4, 4)},
    "x4 in_proj": {"in_proj": (1, 4, 4)},
    "x2": {"in_proj": (1, 8, 2), "out_proj": (2, 8, 2), "gate_up": (1, 8, 2), "down": (2, 12, 2)},
    "gate_up w2 b2": {"gate_up": (2, 2)},
}
W = K_lin.GEMV_WARPS
STAMPS = 5      # per block: start, wait released, streaming done, end, SM


@cuda.jit(device=True)
def _normed_pass(x, nw, k, w0, w1, w2, w3, w4, w5, w6, w7):
    """One pass of 4 chunks of _stream_pair_normed: (dot row 0, dot row 1, sum of x^2)."""
    a0 = float32(0.0)
    a1 = float32(0.0)
    ss = float32(0.0)
    ya, yb, s = K_lin._normed8(x, k, nw, k)
    a0 += K_lin._dot8(w0, ya, yb)
    a1 += K_lin._dot8(w1, ya, yb)
    ss += s
    ya, yb, s = K_lin._normed8(x, k + 256, nw, k + 256)
    a0 += K_lin._dot8(w2, ya, yb)
    a1 += K_lin._dot8(w3, ya, yb)
    ss += s
    ya, yb, s = K_lin._normed8(x, k + 512, nw, k + 512)
    a0 += K_lin._dot8(w4, ya, yb)
    a1 += K_lin._dot8(w5, ya, yb)
    ss += s
    ya, yb, s = K_lin._normed8(x, k + 768, nw, k + 768)
    a0 += K_lin._dot8(w6, ya, yb)
    a1 += K_lin._dot8(w7, ya, yb)
    ss += s
    return a0, a1, ss


_TRACED: dict[tuple[str, int, int, int], Any] = {}


def _traced(mode: str, ways: int, min_blocks: int, warps: int) -> Any:
    """gemv_one_token(mode, ways, min_blocks, warps)'s body with thread 0's time stamps into trace
    [blocks * STAMPS] (its first pass written out here so that the wait's return is seen)."""
    key = (mode, ways, min_blocks, warps)
    if key in _TRACED:
        return _TRACED[key]
    WAYS, WARPS, PAIRS, NORMED, SWIGLU = ways, warps, warps // ways, mode != "plain", mode == "swiglu"

    def traced_gemv(x, nw, eps, w, bias, out, has_bias, trace):
        t_start = globaltimer()
        red = cuda.shared.array((WARPS, 3), float32)
        lane = cuda.threadIdx.x & 31
        warp = cuda.threadIdx.x >> 5
        pair = warp // WAYS
        sl = warp - pair * WAYS
        n_rows = w.shape[0]
        k_dim = w.shape[1]
        n_pairs = out.shape[1] if SWIGLU else (n_rows + 1) // 2
        p = cuda.blockIdx.x * PAIRS + pair
        live = p < n_pairs
        p = p if live else 0
        if SWIGLU:
            r0 = p
            r1 = n_pairs + p
            has1 = True
        else:
            r0 = 2 * p
            has1 = r0 + 1 < n_rows
            r1 = r0 + 1 if has1 else r0
        k_beg, k_end = K_lin.k_slice(sl, WAYS, k_dim)
        k = k_beg + lane * 8
        a0 = float32(0.0)
        a1 = float32(0.0)
        ss = float32(0.0)
        t_rel = t_start
        if live and k + 768 < k_end:                     # the first pass, stamped after its wait
            w0, w1, w2, w3, w4, w5, w6, w7 = K_lin.pass_loads(w, r0 * k_dim, r1 * k_dim, k)
            grid_dependency_sync()
            t_rel = globaltimer()
            if NORMED:
                a0, a1, ss = _normed_pass(x, nw, k, w0, w1, w2, w3, w4, w5, w6, w7)
            else:
                z = float32(0.0)
                acc = (z, z, z, z, z, z, z, z)
                acc = K_lin._chunk(x, k, k_dim, w0, w1, False, False, False, acc)
                acc = K_lin._chunk(x, k + 256, k_dim, w2, w3, False, False, False, acc)
                acc = K_lin._chunk(x, k + 512, k_dim, w4, w5, False, False, False, acc)
                acc = K_lin._chunk(x, k + 768, k_dim, w6, w7, False, False, False, acc)
                a0 = acc[0]
                a1 = acc[1]
            k += 1024
        if live:
            if NORMED:
                b0, b1, s = K_lin._stream_pair_normed(x, 0, nw, w, r0 * k_dim, r1 * k_dim, k, k_end)
                a0 += b0
                a1 += b1
                ss += s
            else:
                z = float32(0.0)
                acc = K_lin._stream_pair(x, w, r0 * k_dim, r1 * k_dim, k, k_end, 0, k_dim, False, False, False,
                                         (z, z, z, z, z, z, z, z))
                a0 += acc[0]
                a1 += acc[1]
        grid_dependency_sync()
        t_done = globaltimer()
        a0 = warp_sum(a0)
        a1 = warp_sum(a1)
        if NORMED:
            ss = warp_sum(ss)
        if WAYS > 1:
            if lane == 0:
                red[warp, 0] = a0
                red[warp, 1] = a1
                red[warp, 2] = ss
            cuda.syncthreads()
            a0 = float32(0.0)
            a1 = float32(0.0)
            ss = float32(0.0)
            for j in range(WAYS):
                a0 += red[warp - sl + j, 0]
                a1 += red[warp - sl + j, 1]
                ss += red[warp - sl + j, 2]
        if live and sl == 0 and lane == 0:
            if NORMED:
                inv = float32(1.0) / math.sqrt(ss / float32(k_dim) + eps)
                a0 *= inv
                a1 *= inv
            if SWIGLU:
                out[0, p] = a0 / (float32(1.0) + math.exp(-a0)) * a1
            else:
                out[0, r0] = a0 + (bias[r0] if has_bias != 0 else float32(0.0))
                if has1:
                    out[0, r1] = a1 + (bias[r1] if has_bias != 0 else float32(0.0))
        if cuda.threadIdx.x == 0:
            base = cuda.blockIdx.x * STAMPS
            trace[base] = t_start
            trace[base + 1] = t_rel
            trace[base + 2] = t_done
            trace[base + 3] = globaltimer()
            trace[base + 4] = smid()

    traced_gemv.__name__ = f"traced_gemv_{mode}_w{ways}_b{min_blocks}_x{warps}_kernel"
    _TRACED[key] = kernel((f32_2, f32_1, f32, u16_2, f32_1, f32_2, i32, i64_1), sim=False, fastmath=True,
                          launch_bounds=(32 * warps, min_blocks), self_sync=True)(traced_gemv)
    return _TRACED[key]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2, help="passes over the layers per graph")
    ap.add_argument("--trace", action="append", default=[], metavar="VARIANT",
                    help="trace the chain with this variant's builds (repeatable)")
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

    def launch(spec: Any, op: str, mode: str, ways: int, warps: int, w: Any, *extra: Any) -> None:
        x, out, bias = io[op]
        n = w.shape[0]
        pairs = n // 2 if mode == "swiglu" else (n + 1) // 2
        ops._go(spec, (pairs + warps // ways - 1) // (warps // ways), 32 * warps, x, nw, np.float32(1e-6), w,
                (bias if bias is not None else out).reshape(-1), out, np.int32(bias is not None), *extra)

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

        def body() -> None:
            for _ in range(args.reps):
                for layer in weights:
                    for op, (mode, ways, blocks, warps) in b.items():
                        launch(K_lin.gemv_one_token(mode, ways, blocks, warps), op, mode, ways, warps, layer[op])
        us = env.graph_us(body, calls, pdl=not name.endswith("no PDL"))
        gbs = 2 * layer_elems / us / 1e3
        desc = " ".join(f"{op}:{ways},{blocks},{warps}" for op, (_, ways, blocks, warps) in b.items())
        print(f"{name:16s} {us:9.1f} {gbs:6.0f} {gbs * 1e9 / bw:7.0%}  {desc}", flush=True)
    for name in args.trace:
        print(f"\n{name}:", " ".join(f"{op}:{ways},{blocks},{warps}"
                                     for op, (_, ways, blocks, warps) in builds(VARIANTS[name]).items()))
        trace_chain(env, ops, weights, builds(VARIANTS[name]), launch, args.layers)


def trace_chain(env: Any, ops: Any, weights: list[dict[str, Any]], b: dict[str, tuple[str, int, int, int]],
                launch: Any, layers: int) -> None:
    """One replay of the chain with traced kernels; per kernel of layer layers // 2, stamps
    relative to the previous kernel's last block's end (us)."""
    from ninfer_nb.runtime.graph import CudaGraph

    specs = {op: _traced(*b[op]) for op in b}
    grids = {op: -(-(w.shape[0] // 2 if b[op][0] == "swiglu" else (w.shape[0] + 1) // 2) // (b[op][3] // b[op][1]))
             for op, w in weights[0].items()}
    per_layer = sum(grids.values())
    trace = env.arena.empty((layers * per_layer * STAMPS,), np.int64)
    views, off = [], 0
    for li in range(layers):
        for op in b:
            views.append((li, op, trace[off:off + grids[op] * STAMPS]))
            off += grids[op] * STAMPS

    def body() -> None:
        env.scratch.reset()
        for li, op, view in views:
            mode, ways, _, warps = b[op]
            launch(specs[op], op, mode, ways, warps, weights[li][op], view)
    with ops.programmatic_launches(True):
        body()
        g = CudaGraph(env.stream)
        g.capture(body)
    g.replay()
    g.replay()
    env.stream.synchronize()
    stamps = env.host(trace).reshape(-1, STAMPS)
    g.close()
    rows, off = [], 0
    for li, op, view in views:
        n = view.shape[0] // STAMPS
        rows.append((li, op, stamps[off:off + n]))
        off += n
    mid = layers // 2
    prev_end = max(int(s[:, 3].max()) for li, op, s in rows if li == mid - 1 and op == "down") if mid else None
    print(f"trace, layer {mid} (us from the previous kernel's last block end; blocks ordered by start):")
    print(f"{'kernel':9s} {'blocks':>6s} {'early':>6s} {'1st start':>9s} {'release':>8s} {'span':>7s} {'GB/s':>6s} "
          f"{'block us':>9s} {'drain':>6s} {'SMs':>4s}")
    for li, op, s in rows:
        if li != mid:
            continue
        start, rel, done, end, sm = (s[:, j].astype(np.int64) for j in range(STAMPS))
        base = prev_end if prev_end is not None else int(start.min())
        n, k = weights[0][op].shape
        span = (int(end.max()) - base) / 1e3
        early = int((start < base).sum())
        dur = np.median((end - start)[start >= base]) / 1e3 if (start >= base).any() else float("nan")
        drain = (int(end.max()) - float(np.percentile(end, 90))) / 1e3
        print(f"{op:9s} {len(s):6d} {early:6d} {(start.min() - base) / 1e3:9.2f} {(rel.min() - base) / 1e3:8.2f} "
              f"{span:7.2f} {2 * n * k / span / 1e3:6.0f} {dur:9.2f} {drain:6.2f} {len(np.unique(sm)):4d}")
        prev_end = int(end.max())


if __name__ == "__main__":
    main()
