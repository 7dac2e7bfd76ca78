"""Aggregate decode throughput of B-row decode rounds (CudaBackend.pick_rows: one CUDA graph per
batch size, greedy pick in the graph) against the one-sequence decode graph, on a random preset.

    python dev/rows_bench.py qwen3.6-27b 1,8,16 [context]

Every row sits at `context` (default 512) in its own KV pages and GDN slot; the caches hold
whatever the warm-up rounds left (the timing does not depend on their values). Prints device
time per round (the captured graph replayed back to back) and B / time as tok/s, and the
single-sequence graph (the engine's max_concurrency=1 path) at the same context.
NINFER_GDN_DECODE=head|cluster picks the fused GDN decode kernel (ops/cuda/gdn.py GDN_DECODE_KERNEL);
a list (cluster,head) times the rounds with each in turn (new graphs; the one-sequence graph with
the first only).
"""
from __future__ import annotations

import os
import sys

import numpy as np

from ninfer_nb.engine.batch import ForwardBatch
from ninfer_nb.engine.cuda_backend import CudaBackend
from ninfer_nb.engine.pick import ARGMAX
from ninfer_nb.models.decoder import Decoder
from ninfer_nb.models.presets import preset_config
from ninfer_nb.models.state import PAGE_SIZE, new_state


def main() -> None:
    from ninfer_nb.ops.cuda import gdn as cuda_gdn

    kernels = os.environ.get("NINFER_GDN_DECODE", cuda_gdn.GDN_DECODE_KERNEL).split(",")
    cuda_gdn.GDN_DECODE_KERNEL = kernels[0]
    preset = sys.argv[1]
    batches = [int(x) for x in sys.argv[2].split(",")]
    ctx = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    be = CudaBackend()
    cfg = preset_config(preset)
    dec = Decoder(cfg, be.random_weights(cfg))
    be.enable_token_pick(cfg.vocab_size)
    pages = -(-(ctx + 64) // PAGE_SIZE)

    one = new_state(cfg, pages * PAGE_SIZE, be.zeros, "bf16")

    def forward_one(ids, pos):
        return dec.forward(be.ops, ForwardBatch.single(ids, pos), one)

    for _ in range(3):
        be.launch_token_step(forward_one, 1, ctx)
        be.collect_token()
    single = be.time_decode_steps(ctx)
    print(f"{preset} context {ctx} (GDN decode: {cuda_gdn.GDN_DECODE_KERNEL}): one-sequence decode graph {single:.1f} us = {1e6 / single:.1f} tok/s", flush=True)

    top = max(batches)
    state = new_state(cfg, pages * PAGE_SIZE, be.zeros, "bf16", gdn_slots=top, num_pages=top * pages)

    def forward_rows(ids, pos, slots, table):
        return dec.forward(be.ops, ForwardBatch.rows(ids, pos, slots, table), state)

    for kernel in kernels:
        if kernel != cuda_gdn.GDN_DECODE_KERNEL:
            cuda_gdn.GDN_DECODE_KERNEL = kernel
            be._rows = None                                  # new round graphs, captured with this kernel
        for b in batches:
            table = np.random.default_rng(b).permutation(top * pages)[: b * pages].reshape(b, pages).astype(np.int32)
            for _ in range(3):                               # eager (compiles), capture, replay
                be.pick_rows(forward_rows, [1] * b, [ctx] * b, list(range(b)), table, [ARGMAX] * b)
            us = be.time_decode_rounds(b)
            assert us is not None
            rate = b * 1e6 / us
            print(f"{preset} GDN {kernel} B={b:2d}: round {us:.1f} us, {rate:.1f} tok/s aggregate, "
                  f"{rate / (1e6 / single):.2f}x the one-sequence graph", flush=True)

if __name__ == "__main__":
    main()
