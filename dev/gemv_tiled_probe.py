"""How fast the tensor-core quantized decode GEMVs (kernels/linear/gemv_tiled.py) stream their
bytes at the models' weight shapes (GPU, not a test). First a correctness check of every
format and mode against the NumPy reference (quant/dequant.py through quant/tiled.py), then for
every shape and format a graph of L launches over L distinct random weights (no L2 reuse, PDL
on), each build (K slices, warps per block, blocks per SM) timed as us per launch and GB/s of
codes + scales, against the device copy bandwidth; "pick" = what ops/cuda/linear_quant.py
chooses.
Usage: python3 dev/gemv_tiled_probe.py [--min-mb 600] [--only 27B] [--kinds i4,i8,fp8] [--sweep]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_nb.bench import copy_bandwidth  # noqa: E402
from ninfer_nb.kernels.linear import gemv_tiled as K_t  # noqa: E402
from ninfer_nb.kernels.random_fill import fill_random_u32_kernel  # noqa: E402
from ninfer_nb.ops import cpu  # noqa: E402
from ninfer_nb.ops.cuda import linear_quant as LQ  # noqa: E402
from ninfer_nb.quant.dequant import dequantize, quantize  # noqa: E402
from ninfer_nb.quant.formats import quant_format  # noqa: E402
from ninfer_nb.quant.tiled import tile  # noqa: E402
from tests.kernels.gpu_util import GpuEnv, rnd  # noqa: E402

SHAPES = [("27B down", 5120, 17408, "plain"), ("27B out_proj", 5120, 6144, "plain"),
          ("27B attn qkv", 14336, 5120, "normed"), ("27B GDN in", 16480, 5120, "normed"),
          ("27B gate_up", 34816, 5120, "normed_swiglu"), ("27B lm_head", 248320, 5120, "plain"),
          ("35B out_proj", 2048, 4096, "plain"), ("35B GDN in", 12352, 2048, "normed"),
          ("35B attn qkv", 9216, 2048, "normed"), ("35B lm_head", 248320, 2048, "plain")]
FMT = {"i4": "int4-g64", "i8": "int8-g128", "fp8": "fp8"}


def launch(ops: Any, build: tuple, x: Any, nw: Any, w: dict, n: int, k: int, out: Any, bias: Any) -> None:
    kind, zp, split, mode, ntg, ways, warps, blocks = build
    nt = -(-n // 16)
    pairs = nt // 2 if "swiglu" in mode else (nt + 1) // 2
    ops._go(K_t.gemv_tiled(*build, group=1 << w["gshift"]), (-(-pairs // (warps // ways)), 1), 32 * warps, x, nw, np.float32(1e-6),
            w["codes"], w["scales"], w["zeros"], np.int32(w["gshift"]), np.int32(n), np.int32(k),
            bias if bias is not None else out.reshape(-1), out, np.int32(bias is not None), w["ids"], w["ew"])


def launch_t1(ops: Any, build: tuple, x: Any, nw: Any, w: dict, n: int, k: int, out: Any, bias: Any) -> None:
    kind, zp, split, mode, ways, warps, stages, blocks = build
    nt = -(-n // 16)
    pairs = nt // 2 if "swiglu" in mode else (nt + 1) // 2
    ops._go(K_t.gemv_t1(*build, group=1 << w["gshift"]), -(-pairs // (warps // ways)), 32 * warps, x, nw,
            np.float32(1e-6), w["codes"], w["scales"], w["zeros"], np.int32(w["gshift"]), np.int32(n), np.int32(k),
            bias if bias is not None else out.reshape(-1), out, np.int32(bias is not None), w["ids"], w["ew"],
            smem=K_t.t1_smem(kind, zp, split, warps, stages, k))


def check(env: GpuEnv, ops: Any, t1: bool = False, kinds: str = "i4,i8,fp8") -> None:
    rng = np.random.default_rng(1)
    n, k = 544, 1024
    for kind, name in FMT.items():
        if kind not in kinds.split(","):
            continue
        fmt = quant_format(name)
        q = quantize(rnd(rng, n, k) * 0.1, fmt)
        t = tile(q)
        wf = dequantize(q)
        w = {"codes": env.up(t.arrays["codes"].reshape(-1).view(np.uint32)),
             "scales": env.up(t.arrays["scales"].reshape(-1).view(np.uint32)),
             "zeros": env.up(np.zeros(4, np.uint32)), "gshift": fmt.group_size.bit_length() - 1,
             "ids": env.up(np.zeros((1, 1), np.int32)), "ew": env.up(np.zeros((1, 1), np.float32))}
        for mode, tok in (("plain", 1), ("plain", 5), ("plain", 13), ("normed", 1), ("normed_swiglu", 1),
                          ("swiglu", 3)):
            x = rnd(rng, tok, k)
            nw = rnd(rng, k)
            ref_in = cpu.rms_norm(x, nw, 1e-6) if mode.startswith("normed") else x
            ref = cpu.linear(ref_in, wf)
            if "swiglu" in mode:
                ref = cpu.swiglu(ref)
            out = env.up(np.zeros_like(ref))
            xd = env.up(x)
            if t1:
                if tok != 1:
                    continue
                shape = {"plain": (5120, 6144), "normed": (16480, 5120), "normed_swiglu": (34816, 5120)}[mode]
                t1b = LQ.t1_build(mode, *shape, kind)               # the builds the 27B shapes take
                launch_t1(ops, (kind, False, False, mode, *t1b), xd, env.up(nw), w, n, k, out, None)
            else:
                launch(ops, (kind, False, False, mode, 1 if tok <= 8 else 2, 2, 4, 3 if tok <= 8 else 2), xd,
                       env.up(nw), w, n, k, out, None)
            got = env.host(out)
            err = np.abs(got - ref).max() / np.abs(ref).max()
            print(f"check{' t1' if t1 else ''} {name:10s} {mode:14s} T={tok:2d}: rel err {err:.2e} {'ok' if err < 2e-2 else 'FAIL'}",
                  flush=True)


def sass_counts(spec_args: str) -> None:
    """CPU only: compile gemv_t1 builds for sm_90a (numba + ptxas + nvdisasm of the pip CUDA
    wheels) and print registers, spills and the streaming loop's instructions per K-tile (the
    loop with the cp.async copies and the mmas), by opcode. spec_args: 'kind,mode,ways,warps,
    stages,blocks[,group];...'."""
    import collections
    import re
    import subprocess
    import tempfile
    import types

    import numba.cuda.dispatcher as disp
    from numba import cuda

    disp.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    from ninfer_nb.kernels.common.registry import all_specs
    from tests.kernels.test_ptxas import PTXAS

    nvdisasm = str(Path(PTXAS).with_name("nvdisasm")) if PTXAS else "nvdisasm"
    for spec in [b for b in spec_args.split(";") if b]:
        f = spec.split(",")
        kind, mode, nums = f[0], f[1], [int(v) for v in f[2:]]
        group = nums[4] if len(nums) > 4 else (128 if kind != "i4" else 64)
        name = K_t.gemv_t1(kind, False, False, mode, *nums[:4], group=group).name
        ks = all_specs()[name]
        ptx, _ = cuda.compile_ptx(ks.entry(), ks.sigs[0], cc=(9, 0, "a"), **ks.options)
        with tempfile.TemporaryDirectory() as d:
            Path(d, "k.ptx").write_text(ptx)
            r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"], capture_output=True,
                               text=True)
            info = re.search(r"Used (\d+) registers.*", r.stderr)
            sass = subprocess.run([nvdisasm, "-c", f"{d}/k.cubin"], capture_output=True, text=True).stdout
        ins, labels, pending = [], {}, None
        for line in sass.splitlines():
            m = re.match(r"\s*\.(L_x_\d+):", line)
            if m:
                pending = m.group(1)
                continue
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
            if m:
                a = int(m.group(1), 16)
                if pending:
                    labels[pending], pending = a, None
                ins.append((a, m.group(2)))
        for a, t in ins:                                 # the backward branch around the cp.async + mma loop
            m = re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", t)
            if not (m and labels.get(m.group(1), a + 1) <= a):
                continue
            body = [x for b_, x in ins if labels[m.group(1)] <= b_ <= a]
            if any("HMMA" in x for x in body) and any("LDGSTS" in x for x in body):
                per = sum("DEPBAR.LE" in x for x in body) or 1
                ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for x in body)
                print(f"{spec}: {info.group(0) if info else r.stderr[-200:]}; loop {len(body) / per:.0f} "
                      f"instructions per K-tile ({per} per pass): "
                      + ", ".join(f"{k} {v / per:.0f}" for k, v in ops.most_common(12)))
                break


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-mb", type=float, default=600.0)
    ap.add_argument("--only", default="")
    ap.add_argument("--kinds", default="i4,i8,fp8")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--sweep", action="store_true", help="every build, not only the picked one")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--builds", default="", help="extra builds 'ways,warps,blocks;...'")
    ap.add_argument("--t1", action="store_true", help="one token: gemv_t1 (ops/cuda/linear_quant.py t1_build)")
    ap.add_argument("--old", action="store_true", help="with --t1: the gemv_tiled pick too")
    ap.add_argument("--t1-builds", default="", help="extra gemv_t1 builds '[mode:]ways,warps,stages,blocks;...' (mode: only shapes of that mode)")
    ap.add_argument("--sass", default="", help="CPU only: 'kind,mode,ways,warps,stages,blocks[,group];...' "
                                                 "gemv_t1 builds' registers and loop instructions (sass_counts)")
    args = ap.parse_args()
    if args.sass:
        sass_counts(args.sass)
        return
    env = GpuEnv(arena_bytes=8 << 30, scratch_bytes=256 << 20)
    ops = env.fresh()
    if not args.no_check:
        check(env, ops, args.t1, args.kinds)
    bw = copy_bandwidth("cuda")
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    pool_words = 1600 << 18                                          # 1.6 GiB of random code bytes
    pool = env.arena.empty((pool_words,), np.uint32)
    fill_random_u32_kernel[4096, 256, env.stream.numba](pool, np.int64(3))
    rng = np.random.default_rng(0)
    only = [o for o in args.only.split(",") if o]
    print(f"{'shape':14s} {'fmt':9s} {'N x K':>12s} {'build':16s} {'us':>7s} {'GB/s':>6s} {'of copy':>8s}")
    for label, n, k, mode in SHAPES:
        if only and not any(o in label for o in only):
            continue
        for kind in args.kinds.split(","):
            fmt = quant_format(FMT[kind])
            nt = -(-n // 16)
            code_words = nt * k * fmt.bits // 8 * 16 // 4
            if kind == "fp8":
                scale_words = nt * k // 128
                scales_host = np.full(scale_words, np.float32(0.01)).view(np.uint32)
            else:
                scale_words = nt * (k // fmt.group_size) * 8
                scales_host = np.full(scale_words, np.uint32(0x211F211F))          # fp16 0.01 pairs
            scales = env.up(scales_host)
            per_bytes = 4 * (code_words + scale_words)
            layers = max(2, min(int(np.ceil(args.min_mb * 1e6 / per_bytes)), pool_words // code_words))
            ws = [{"codes": pool[i * code_words:(i + 1) * code_words], "scales": scales, "zeros": scales,
                   "gshift": fmt.group_size.bit_length() - 1, "ids": env.up(np.zeros((1, 1), np.int32)),
                   "ew": env.up(np.zeros((1, 1), np.float32))} for i in range(layers)]
            t = args.tokens if mode.startswith("plain") or mode == "swiglu" else 1
            x = env.up(rnd(rng, t, k))
            nw = env.up(rnd(rng, k))
            out = env.up(rnd(rng, t, n // 2 if "swiglu" in mode else n))
            ntg = 1 if t <= 8 else 2
            pick = LQ.tiled_build(mode, t, n, k, kind, env.ops.sm_count if hasattr(env.ops, "sm_count") else 132)
            builds = [("pick", pick)] if not args.t1 or args.old else []
            if args.t1 and t == 1:
                zp_, split_ = False, False
                t1b = LQ.t1_build(mode, n, k, kind, zp_, split_)
                if t1b is not None:
                    builds.append(("t1", t1b))
                for spec in [b for b in args.t1_builds.split(";") if b]:
                    only_mode, _, spec = spec.rpartition(":")
                    if not only_mode or only_mode == mode:
                        builds.append(("t1 " + spec, tuple(int(v) for v in spec.split(","))))
            if args.sweep:
                for warps, blocks_l in ((4, (3,) if ntg == 1 else (2,)), (8, (1,))):
                    for ways in (1, 2, 4, 8):
                        if ways > warps:
                            continue
                        for blocks in blocks_l:
                            builds.append((f"w{ways} b{blocks} x{warps}", (ways, warps, blocks)))
            for spec in [b for b in args.builds.split(";") if b]:
                ways, warps, blocks = (int(v) for v in spec.split(","))
                builds.append((f"w{ways} b{blocks} x{warps}", (ways, warps, blocks)))
            for bname, bspec in builds:
                if bname.startswith("t1"):
                    ways, warps, stages, blocks = bspec
                    build = (kind, False, False, mode, ways, warps, stages, blocks)
                    bname = f"t1 w{ways} x{warps} s{stages} b{blocks}"
                    go = launch_t1
                else:
                    ways, warps, blocks = bspec
                    build = (kind, False, False, mode, ntg, ways, warps, blocks)
                    go = launch
                if bname == "pick":
                    bname = f"pick w{ways} b{blocks} x{warps}"

                def body() -> None:
                    for w in ws:
                        go(ops, build, x, nw, w, n, k, out, out.reshape(-1) if mode == "plain" and t == 1
                           else None)
                try:
                    us = env.graph_us(body, layers)
                except Exception as e:                                  # a build that does not fit
                    print(f"{label:14s} {FMT[kind]:9s} {bname}: {type(e).__name__} {e}"[:200], flush=True)
                    continue
                gbs = per_bytes / us / 1e3
                print(f"{label:14s} {FMT[kind]:9s} {f'{n}x{k}':>12s} {bname:16s} {us:7.2f} {gbs:6.0f} "
                      f"{gbs * 1e9 / bw:7.0%}", flush=True)


if __name__ == "__main__":
    main()
