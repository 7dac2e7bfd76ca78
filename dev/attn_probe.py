"""Decode attention at a model's heads over a long cache (GPU, not a test): graph-timed split +
combine (runtime.graph.time_in_graph, as the GPU tests time it) per cache dtype, or (--eager)
a few plain launches for Nsight Compute. --mma: the tensor-core kernel on a bf16 cache, else
the SIMT kernel on fp32 and bf16 caches. Usage:
python3 dev/attn_probe.py [--hq 16 --hkv 2 --pos 8191] [--mma] [--eager]"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_nb.runtime.graph import time_in_graph  # noqa: E402
from tests.kernels.gpu_util import BF16, GpuEnv, rnd  # noqa: E402

D = 256


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hq", type=int, default=16)
    ap.add_argument("--hkv", type=int, default=2)
    ap.add_argument("--pos", type=int, default=8191)
    ap.add_argument("--eager", action="store_true", help="three plain launches per dtype (for ncu)")
    ap.add_argument("--mma", action="store_true",
                    help="the tensor-core kernel (bf16 cache only; else the SIMT kernel on fp32 and bf16)")
    args = ap.parse_args()
    env = GpuEnv(arena_bytes=4 << 30, scratch_bytes=1 << 30)
    rng = np.random.default_rng(0)
    s = args.pos + 1
    for dtype in (BF16,) if args.mma else (np.float32, BF16):
        ops = env.fresh()
        ops.choices = replace(ops.choices, decode_attention="auto" if args.mma else "simt")
        q = env.up(rnd(rng, 1, args.hq, D))
        kc = env.up(rnd(rng, s, args.hkv, D).astype(dtype))
        vc = env.up(rnd(rng, s, args.hkv, D).astype(dtype))
        pos = env.up(np.array([args.pos], np.int32))

        def body() -> None:
            ops.attention(q, kc, vc, pos, D ** -0.5)
        for _ in range(3 if args.eager else 1):          # eager: what ncu profiles; else warm-up
            with ops.scope():
                body()
        env.stream.synchronize()
        if args.eager:
            continue
        sec, _ = time_in_graph(env.stream, body, ops.scope, repeat=8, replays=5)
        print(f"decode attention Hq={args.hq} Hkv={args.hkv} at {s} keys ({np.dtype(dtype).name}"
              f"{', mma' if args.mma else ''}): {sec * 1e6:.1f} us")


if __name__ == "__main__":
    main()
