"""How fast each decode GEMV build runs at the models' weight shapes (GPU, not a test): for every
shape, a graph of L launches over L distinct weights (no L2 reuse, as in the model; PDL on),
each kernel build and K-split timed as us per launch and GB/s, against the device copy
bandwidth. The builds: what ops/cuda.py launches by default, and kernels/linear.py
gemv_one_token with 1-8 K slices per row pair, blocks of 8 warps (2-4 per SM) or 4 warps (4-6
per SM). A shape's GEMV repeated is not the model's sequence of different GEMVs: for that, see
dev/chain_probe.py.
Usage: python3 dev/gemv_probe.py [--min-mb 600] [--reps 2]
--mma: the multi-token GEMVs (T = 2..16) instead: per 27B shape and T, the one-token GEMV, the
default path before gemv_mma3 ("old": SIMT / gemv_mma v1, + the separate add / SwiGLU
launch), what ops picks with GEMV_MMA3 on ("plan") and the best gemv_mma3 build x grid size of
a sweep, with a check of each build against NumPy. `--precompile BUILD` (mode,warps,tiles,unroll,
min_blocks) compiles one gemv_mma3 build into numba's disk cache (run several at once first).
Usage: python3 dev/gemv_probe.py --mma [--tokens 2,4,8,16] [--full FILE]"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import ml_dtypes
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


MMA_SHAPES = [("17408x5120", 17408, 5120, "plain"), ("GDN in", 16480, 5120, "plain"),
              ("down +res", 5120, 17408, "add"), ("out_proj +res", 5120, 6144, "add"),
              ("gate_up swiglu", 34816, 5120, "swiglu"), ("lm_head", 248320, 5120, "plain"),
              ("35B GDN in", 12352, 2048, "plain"), ("35B out +res", 2048, 4096, "add")]
# v3 builds (warps, tiles, unroll, blocks per SM, pipe, ring stages): the defaults (ops/cuda/linear.py
# mma3_plan); v4 builds ("v4", warps, tiles, kb, stages, blocks per SM): gemv_mma4 (cp.async rings of
# 32 kb-column stages)
MMA_BUILDS: list[tuple[Any, ...]] = [("v4", 8, 1, 4, 3, 2, 1, 1), ("v4", 4, 1, 4, 3, 3, 1, 1), ("v4", 4, 2, 4, 3, 2, 1, 1),
                                     ("v4", 4, 2, 2, 4, 3, 1, 1), ("v4", 8, 1, 2, 4, 2, 1, 1), ("v4", 4, 1, 8, 3, 2)]
CHECK_SHAPE = (2 * 1000 + 8, 2048)        # the NumPy check's weight: a ragged last row group
SWIGLU_BUILDS: list[tuple[Any, ...]] = [("v4", 4, 2, 4, 3, 2, 1, 1), ("v4", 4, 2, 2, 4, 3, 1, 1), ("v4", 4, 2, 4, 3, 2)]


def is_v4(build: Any) -> bool:
    return build[0] == "v4"


def mma_grids(build: Any, n: int, k: int, sm_count: int) -> list[int]:
    """Block counts to try: one block per resident slot (the work split evenly, stream-K)."""
    from ninfer_nb.kernels.linear import gemv_mma as K_gm

    if is_v4(build):
        mode, warps, tiles, kb, _, per_sm = build[1:7]
        units = K_gm.v3_groups(mode, warps, tiles, n) * (k // (32 * kb))
        return [min(units, per_sm * sm_count)]
    groups = K_gm.v3_groups(build[0], build[1], build[2], n)
    slots = build[4] * sm_count
    units = groups * (k // K_gm.K_ALIGN)
    return [min(units, slots)]


def mma_builds(mode: str) -> list[tuple[Any, ...]]:
    m = "swiglu" if mode == "swiglu" else "plain"
    return [("v4", m, *b[1:]) if is_v4(b) else (m, *b) for b in (SWIGLU_BUILDS if mode == "swiglu" else MMA_BUILDS)]


def build_label(build: Any) -> str:
    if is_v4(build):
        return "v4 x%d r%d k%d s%d b%d" % build[2:7] + "".join(f" {f}" for f, on in zip(("lm", "xs"), build[7:]) if on)
    return "x%d r%d u%d b%d%s%s" % (build[1], build[2], build[3], build[4], " p" if build[5] else "",
                                     f" s{build[6]}" if build[6] else "")


def carve(spec: Any, percent: int) -> None:
    """Set a build's preferred shared-memory carveout (-1: the driver's choice) on every overload."""
    from numba.cuda.cudadrv.driver import binding, driver

    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    for overload in spec.get().overloads.values():
        f = overload._codelibrary.get_cufunc()
        driver.cuKernelSetAttribute(attr, percent, f.handle, f.device.id)


def occupancy(spec: Any, threads: int, smem: int) -> int:
    """Resident blocks per SM the driver grants (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
    from numba.cuda.cudadrv.driver import binding

    try:
        f = next(iter(spec.get().overloads.values()))._codelibrary.get_cufunc()
        h = f.handle
        if isinstance(h, binding.CUkernel):
            h = binding.cuKernelGetFunction(h)[1]
        err, n = binding.cuOccupancyMaxActiveBlocksPerMultiprocessor(h, threads, smem)
        return int(n)
    except Exception as exc:                # a diagnostic only
        print(f"occupancy: {type(exc).__name__}: {exc}")
        return -1


def mma_main(args: Any) -> None:
    from ninfer_nb.kernels.linear import gemv_mma as K_gm
    from ninfer_nb.ops.cuda import linear as L
    from tests.kernels.gpu_util import close

    if args.builds:
        MMA_BUILDS[:] = [MMA_BUILDS[int(i)] for i in args.builds.split(",")]
    if args.swiglu_builds:
        SWIGLU_BUILDS[:] = [SWIGLU_BUILDS[int(i)] for i in args.swiglu_builds.split(",")]
    env = GpuEnv(arena_bytes=8 << 30, scratch_bytes=512 << 20)
    ops = env.fresh()
    counter = ops.zeros((K_gm.MAX_GROUPS,), np.int32, persistent=True)
    bw = copy_bandwidth("cuda")
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    pool = env.arena.empty((2700 << 20) // 2, bfloat16)
    fill_uniform_bf16_kernel[4096, 256, env.stream.numba](pool, np.int64(7), np.float32(0.05), np.float32(0.0))
    rng = np.random.default_rng(0)
    full = open(args.full, "w") if args.full else None
    tokens = [int(v) for v in args.tokens.split(",")]

    def v3(build: Any, blocks: int, x: Any, out: Any, acc: int) -> Callable[[Any], None]:
        if is_v4(build):
            mode, warps, tiles, kb, stages, per_sm = build[1:7]
            spec = K_gm.gemv_mma4(*build[1:])
            smem = K_gm.v4_smem(warps, tiles, kb, stages, *build[8:9])

            def launch4(w: Any) -> None:
                n, k = w.shape
                groups = K_gm.v3_groups(mode, warps, tiles, n)
                p = min(blocks, groups * (k // (32 * kb)))
                ws = ops.empty((K_gm.v3_segments(groups, k, p, 32 * kb), x.shape[0], n))
                K_gm.prefer_shared(spec, force=True)
                ops._go(spec, p, 32 * warps, x, w, out.reshape(-1), out, np.int32(0), np.int32(acc), ws, counter,
                        smem=smem)
            return launch4

        def launch(w: Any) -> None:
            n, k = w.shape
            groups = K_gm.v3_groups(build[0], build[1], build[2], n)
            p = min(blocks, groups * (k // K_gm.K_ALIGN))
            ws = ops.empty((K_gm.v3_segments(groups, k, p), x.shape[0], n))
            K_gm.prefer_shared(K_gm.gemv_mma3(*build))
            ops._go(K_gm.gemv_mma3(*build), p, 32 * build[1], x, w, out.reshape(-1), out, np.int32(0),
                    np.int32(acc), ws, counter)
        return launch

    # correctness of every build against NumPy: T = 16 and 3, shared and whole row groups, a ragged last group
    for mode in ("plain", "swiglu"):
        for build in mma_builds(mode):
            n, k = CHECK_SHAPE
            w = rnd(rng, n, k).astype(ml_dtypes.bfloat16)
            W = env.up(w.view(np.uint16))
            errs = []
            for t, blocks, acc in ((16, 37, 1), (3, 5, 0)):
                x = rnd(rng, t, k)
                y = x @ w.astype(np.float32).T
                o0 = rnd(rng, t, n // 2 if mode == "swiglu" else n)
                want = (y[:, :n // 2] / (1 + np.exp(-y[:, :n // 2])) * y[:, n // 2:] if mode == "swiglu"
                        else y + o0 * acc)
                out = env.up(o0)
                v3(build, blocks, env.up(x), out, acc)(W)
                got = env.host(out)
                errs.append(float(np.abs(got - want).max() / np.abs(want).max()))
                try:
                    close(got, want, 2e-5)
                except AssertionError:
                    errs.append(float("inf"))
            if is_v4(build):
                occ = occupancy(K_gm.gemv_mma4(*build[1:]), 32 * build[2], K_gm.v4_smem(*build[2:6], *build[8:9]))
                name = f"{K_gm.v4_name(*build[1:])} ({occ} blocks/SM)"
            else:
                name = K_gm.v3_name(*build)
            print(f"check {name}: {'ok' if max(errs) < 1 else 'FAIL'} (max rel err {max(errs):.1e})", flush=True)
            if any(env.host(counter)):
                raise AssertionError("counters not reset")

    print("us per launch: 1tok = the one-token GEMV, old = GEMV_MMA3 off (v1 / SIMT + separate add, SwiGLU),\n"
          "mma3 = KernelChoices(multi_token_gemv='mma3') (mma3_plan), def = ops' default (auto: mma4_plan), nc = def without\n"
          "the full shared-memory carveout, then each build of MMA_BUILDS / SWIGLU_BUILDS at one wave; "
          "x1 = best / 1tok")
    for m in ("plain", "swiglu"):
        print(f"{m} builds: " + ", ".join(f"{i}={build_label(b)}" for i, b in enumerate(mma_builds(m))))
    for label, n, k, mode in MMA_SHAPES:
        if args.only and not any(o in label for o in args.only.split(",")):
            continue
        per = n * k
        layers = max(2, int(np.ceil(args.min_mb * 1e6 / (2 * per))))
        stride = (per + 4095) // 4096 * 4096
        layers = max(1, min(layers, pool.shape[0] // stride))
        ws_ = [pool[i * stride:i * stride + per].reshape(n, k).view(np.uint16) for i in range(layers)]
        wb = [pool[i * stride:i * stride + per].reshape(n, k) for i in range(layers)]

        def timed(launch: Callable[[Any], None], weights: list[Any]) -> float:
            def body() -> None:
                for _ in range(args.reps):
                    for w in weights:
                        launch(w)
            return env.graph_us(body, layers * args.reps)

        nw = env.up(rnd(rng, k))
        x1 = env.up(rnd(rng, 1, k))
        if mode == "swiglu":
            one = timed(lambda w: ops.linear_swiglu(ops.normed(x1, nw, 1e-6), w), wb)
        else:
            res1 = env.up(rnd(rng, 1, n))
            one = timed(lambda w: ops.linear_add(x1, w, res1), wb)
        for t in tokens:
            x = env.up(rnd(rng, t, k))
            res = env.up(rnd(rng, t, n))

            def default(w: Any) -> None:
                if mode == "swiglu":
                    ops.linear_swiglu(x, w)
                elif mode == "add":
                    ops.linear_add(x, w, res)
                else:
                    ops.linear(x, w)
            L.GEMV_MMA3 = False
            old = timed(default, wb) if not args.no_old else float("nan")
            L.GEMV_MMA3 = True
            choices = ops.choices
            plan3 = float("nan")
            if not args.no_mma3:
                ops.choices = replace(choices, multi_token_gemv="mma3")
                plan3 = timed(default, wb)
                ops.choices = choices
            plan = timed(default, wb)
            p4 = L.mma4_plan("swiglu" if mode == "swiglu" else "plain", t, n, k, ops.sm_count)
            plan_nc = float("nan")
            if p4 is not None:                 # the same without the full shared-memory carveout
                spec4 = K_gm.gemv_mma4(*p4[0])
                carve(spec4, -1)
                plan_nc = timed(default, wb)
                carve(spec4, 100)
            best = (float("inf"), "")
            times = []
            out = env.up(rnd(rng, t, n // 2 if mode == "swiglu" else n))
            for build in mma_builds(mode):
                for blocks in mma_grids(build, n, k, ops.sm_count):
                    us = timed(v3(build, blocks, x, out, int(mode == "add")), ws_)
                    name = f"{build_label(build)} P{blocks}"
                    if full:
                        full.write(f"{label} T={t} {name} {us:.2f} us {2 * per / us / 1e3:.0f} GB/s\n")
                    best = min(best, (us, name))
                    times.append(us)
            olds = "" if args.no_old else f"old {old:6.1f} "
            print(f"{label:14s} T={t:<2d} 1tok {one:6.1f} {olds}mma3 {plan3:6.1f} def {plan:6.1f} nc {plan_nc:6.1f} | "
                  + " ".join(f"{v:6.1f}" for v in times) + f" | x1 {best[0] / one:.2f}", flush=True)
    if full:
        full.close()


def rows_ab(preset: str, batches: list[int], ctx: int = 512, picks: tuple[str, ...] = ("mma3", "mma4")) -> None:
    """dev/rows_bench.py's B-row decode rounds with each multi-token GEMV of `picks`
    (KernelChoices.multi_token_gemv; graphs re-captured): device time per round and the ratio
    to the one-sequence graph."""
    from ninfer_nb.engine.batch import ForwardBatch
    from ninfer_nb.engine.cuda_backend import CudaBackend
    from ninfer_nb.engine.pick import ARGMAX
    from ninfer_nb.models.decoder import Decoder
    from ninfer_nb.models.presets import preset_config
    from ninfer_nb.models.state import PAGE_SIZE, new_state

    be = CudaBackend()
    cfg = preset_config(preset)
    dec = Decoder(cfg, be.random_weights(cfg))
    be.enable_token_pick(cfg.vocab_size)
    pages = -(-(ctx + 64) // PAGE_SIZE)
    one = new_state(cfg, pages * PAGE_SIZE, be.zeros, "bf16")
    for _ in range(3):
        be.launch_token_step(lambda ids, pos: dec.forward(be.ops, ForwardBatch.single(ids, pos), one), 1, ctx)
        be.collect_token()
    single = be.time_decode_steps(ctx)
    print(f"{preset} ctx {ctx}: one-sequence graph {single:.1f} us", flush=True)
    top = max(batches)
    state = new_state(cfg, pages * PAGE_SIZE, be.zeros, "bf16", gdn_slots=top, num_pages=top * pages)

    def forward_rows(ids: Any, pos: Any, slots: Any, table: Any) -> Any:
        return dec.forward(be.ops, ForwardBatch.rows(ids, pos, slots, table), state)

    base = be.ops.choices
    for b in batches:
        table = np.random.default_rng(b).permutation(top * pages)[: b * pages].reshape(b, pages).astype(np.int32)
        res = []
        for pick in picks:
            be.ops.choices = replace(base, multi_token_gemv=pick)
            be._rows = None                                   # new graphs for this setting
            for _ in range(3):
                be.pick_rows(forward_rows, [1] * b, [ctx] * b, list(range(b)), table, [ARGMAX] * b)
            us = be.time_decode_rounds(b)
            assert us is not None
            res.append(us)
        print(f"{preset} B={b:2d}: round " + ", ".join(f"{p} {us:.1f} us = {us / single:.2f}x one step, "
                                                       f"aggregate {b * single / us:.2f}x" for p, us in zip(picks, res)),
              flush=True)
    be.ops.choices = base


def precompile(names: str) -> None:
    """Compile kernels into numba's disk cache: gemv_mma3 builds as mode,warps,tiles,unroll,blocks,
    gemv_mma4 builds as v4,mode,warps,tiles,kb,stages,blocks, or registered kernel names, separated
    by ';'."""
    from ninfer_nb.kernels.common.registry import all_specs
    from ninfer_nb.kernels.linear import gemv_mma as K_gm
    from ninfer_nb.runtime import device

    device.select("cuda:0")
    specs = all_specs()
    for name in names.split(";"):
        if name.startswith("v4,"):
            _, mode, *rest = name.split(",")
            K_gm.gemv_mma4(mode, *(int(v) for v in rest)).get()
        elif "," in name:
            mode, *rest = name.split(",")
            K_gm.gemv_mma3(mode, *(int(v) for v in rest)).get()
        else:
            specs[name].get()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mma", action="store_true", help="the multi-token GEMVs (see the module doc)")
    ap.add_argument("--tokens", default="4,8,16")
    ap.add_argument("--rows", default="", help="PRESET:B1,B2: decode rounds with gemv_mma3, then gemv_mma4")
    ap.add_argument("--full", default="", help="--mma: every build's time into this file")
    ap.add_argument("--precompile", default="", help="compile one gemv_mma3 build (mode,warps,tiles,unroll,blocks)")
    ap.add_argument("--min-mb", type=float, default=600.0, help="weight bytes per graph, at least")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated substrings of the shape labels to run")
    ap.add_argument("--no-old", action="store_true", help="--mma: skip the path before gemv_mma3")
    ap.add_argument("--no-mma3", action="store_true", help="--mma: skip gemv_mma3 (KernelChoices mma3)")
    ap.add_argument("--builds", default="", help="--mma: comma-separated indices of MMA_BUILDS to time (default all)")
    ap.add_argument("--swiglu-builds", default="", help="--mma: indices of SWIGLU_BUILDS (default all)")
    args = ap.parse_args()
    if args.precompile:
        precompile(args.precompile)
        return
    if args.mma:
        mma_main(args)
        return
    if args.rows:
        preset, bs = args.rows.split(":")
        rows_ab(preset, [int(b) for b in bs.split(",")])
        return
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
