"""Per-kernel device time of one decode round on a random preset (CudaBackend, captured graphs),
from the CUDA profiler's kernel records (torch.profiler over CUPTI: it sees every kernel of the
process, numba's and those inside graph replays).

    python dev/round_profile.py qwen3.6-27b 1,8 [verify T] [context] [top]

For each B: the B-row decode round graph (CudaBackend.pick_rows, as dev/rows_bench.py); then,
if T > 0, the one-sequence verify graph of T tokens (CudaBackend.verify_step, argmax rows).
The profiler runs from before the first capture (CUPTI may miss graphs instantiated before it
starts); each graph's REPLAYS replays sit between two marker kernels. Per kernel name, per
round: exclusive device us (the part of its span no earlier kernel covers: with programmatic
dependent launch a kernel starts, and waits, while the previous one runs, so raw durations
overlap), raw duration, launches. Names are the kernels' Python names (mangling stripped).
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

REPLAYS = 5
MARKER = "fill_uniform_f32_kernel"          # never in a decode round: brackets each replay window


def short_name(name: str) -> str:
    """`gdn_decode_slots_kernel` from numba's mangled or demangled kernel name; others as given."""
    if name.startswith("_ZN"):                         # Itanium: length-prefixed parts up to B / E
        parts, i = [], 3
        while i < len(name) and name[i].isdigit():
            j = i
            while name[j].isdigit():
                j += 1
            n = int(name[i:j])
            parts.append(name[j : j + n])
            i = j + n
        if parts:
            return parts[-1]
    base = re.sub(r"\[abi:[^\]]*\]", "", name.split("(")[0])
    return base.split("::")[-1][:60] or name[:60]


def window_tables(trace_path: str) -> list[tuple[dict[str, list[float]], float, float]]:
    """Per window between successive pairs of MARKER kernels: ({name: [sum of durations,
    exclusive us, count]}, window span us, sum of idle gaps us)."""
    with open(trace_path) as f:
        events = json.load(f).get("traceEvents", [])
    recs = []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        if cat in ("kernel", "gpu_memcpy", "gpu_memset") and "ts" in e:
            name = short_name(str(e.get("name", "?"))) if cat == "kernel" else cat
            recs.append((float(e["ts"]), float(e.get("dur", 0.0)), name))
    recs.sort()
    marks = [r for r in recs if r[2] == MARKER]
    out = []
    for m0, m1 in zip(marks[0::2], marks[1::2]):
        lo, hi = m0[0] + m0[1], m1[0]
        table: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
        cursor, gaps = lo, 0.0
        for ts, dur, name in recs:
            if ts < lo or ts >= hi:
                continue
            gaps += max(0.0, ts - cursor)
            t = table[name]
            t[0] += dur
            t[1] += max(0.0, ts + dur - max(ts, cursor))
            t[2] += 1
            cursor = max(cursor, ts + dur)
        out.append((table, hi - lo, gaps))
    return out


def report(label: str, wall: float | None, table: dict[str, list[float]], span: float, gaps: float,
           top: int) -> None:
    excl = sum(v[1] for v in table.values())
    n_launch = sum(v[2] for v in table.values()) / REPLAYS
    print(f"== {label}: graph {wall or 0:.1f} us/round (events, no profiler); profiled "
          f"{span / REPLAYS:.1f} us/round, gaps {gaps / REPLAYS:.1f}, {n_launch:.0f} launches", flush=True)
    print("   excl us     %   dur us  n/round  kernel", flush=True)
    rows = sorted(table.items(), key=lambda kv: -kv[1][1])
    for name, (dur, ex, count) in rows[:top]:
        print(f"  {ex / REPLAYS:8.1f} {100 * ex / max(excl, 1e-9):5.1f} {dur / REPLAYS:8.1f} "
              f"{count / REPLAYS:6.0f}  {name}", flush=True)
    rest = sum(v[1] for _, v in rows[top:])
    if rest:
        print(f"  {rest / REPLAYS:8.1f} {100 * rest / max(excl, 1e-9):5.1f}  ({len(rows) - top} other kernels)",
              flush=True)


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity

    from ninfer_nb.engine.batch import ForwardBatch
    from ninfer_nb.engine.cuda_backend import CudaBackend
    from ninfer_nb.engine.pick import ARGMAX
    from ninfer_nb.kernels.random_fill import fill_uniform_f32_kernel
    from ninfer_nb.models.decoder import Decoder
    from ninfer_nb.models.presets import preset_config
    from ninfer_nb.models.state import PAGE_SIZE, new_state
    from ninfer_nb.ops.cuda import gdn as cuda_gdn

    t_start = time.time()
    kernels = os.environ.get("NINFER_GDN_DECODE", cuda_gdn.GDN_DECODE_KERNEL).split(",")
    cuda_gdn.GDN_DECODE_KERNEL = kernels[0]
    preset = sys.argv[1]
    batches = [int(x) for x in sys.argv[2].split(",")]
    verify_t = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    ctx = int(sys.argv[4]) if len(sys.argv) > 4 else 512
    top = int(sys.argv[5]) if len(sys.argv) > 5 else 14
    be = CudaBackend()
    cfg = preset_config(preset)
    dec = Decoder(cfg, be.random_weights(cfg))
    be.enable_token_pick(cfg.vocab_size)
    print(f"# {preset} built at {time.time() - t_start:.0f} s (GDN decode: {cuda_gdn.GDN_DECODE_KERNEL})", flush=True)
    pages = -(-(ctx + 64) // PAGE_SIZE)
    mark_buf = be.zeros((32,))

    def mark() -> None:
        fill_uniform_f32_kernel[1, 32, be.stream.numba](mark_buf, np.int64(0), np.float32(0), np.float32(0))

    top_b = max(batches)
    state = new_state(cfg, pages * PAGE_SIZE, be.zeros, "bf16", gdn_slots=top_b, num_pages=top_b * pages)

    def forward_rows(ids: Any, pos: Any, slots: Any, table: Any) -> Any:
        return dec.forward(be.ops, ForwardBatch.rows(ids, pos, slots, table), state)

    one = new_state(cfg, pages * PAGE_SIZE, be.zeros, "bf16")

    def forward_one(ids: Any, pos: Any) -> Any:
        return dec.forward(be.ops, ForwardBatch.single(ids, pos, all_logits=True), one)

    tables = {b: np.random.default_rng(b).permutation(top_b * pages)[: b * pages].reshape(b, pages).astype(np.int32)
              for b in batches}

    def rows_call(b: int) -> None:
        be.pick_rows(forward_rows, [1] * b, [ctx] * b, list(range(b)), tables[b], [ARGMAX] * b)

    def verify_call() -> None:
        be.verify_step(forward_one, [1] * verify_t, ctx, cfg.vocab_size)

    for b in batches:                                    # eager rounds: every kernel compiles here
        rows_call(b)
        print(f"# B={b} eager round done at {time.time() - t_start:.0f} s", flush=True)
    if verify_t > 0:
        verify_call()
        print(f"# verify T={verify_t} eager done at {time.time() - t_start:.0f} s", flush=True)
    mark()
    be.stream.synchronize()
    runs: list[tuple[str, Callable[[int], float | None]]] = []
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for b in batches:                                # capture, replay (CUPTI on before capture)
            rows_call(b)
            rows_call(b)
            runs.append((f"{preset} decode round B={b} ctx {ctx}", lambda r, b=b: be.time_decode_rounds(b, replays=r)))
        if verify_t > 0:
            verify_call()
            verify_call()
            runs.append((f"{preset} verify T={verify_t} (B=1) ctx {ctx}",
                         lambda r: be.time_verify_steps(verify_t, cfg.vocab_size, replays=r)))
        walls = []
        for _, replay in runs:
            replay(2)
            be.stream.synchronize()
            mark()
            replay(REPLAYS - 1)                          # its own warm replay + REPLAYS - 1
            mark()
            be.stream.synchronize()
        for _, replay in runs:                           # plain timing (CUPTI adds little)
            walls.append(replay(16))
    print(f"# profiled at {time.time() - t_start:.0f} s", flush=True)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    prof.export_chrome_trace(path)
    windows = window_tables(path)
    os.unlink(path)
    if len(windows) != len(runs):
        print(f"round_profile: {len(windows)} marked windows in the trace for {len(runs)} runs", flush=True)
    for (label, _), wall, (table, span, gaps) in zip(runs, walls, windows):
        report(label, wall, table, span, gaps, top)
    for kernel in kernels[1:]:                           # the same graphs with another GDN decode kernel
        cuda_gdn.GDN_DECODE_KERNEL = kernel
        be._rows, be._multi = None, {}                   # new graphs, captured with it
        line = []
        for b in batches:
            for _ in range(3):
                rows_call(b)
            line.append(f"B={b} {be.time_decode_rounds(b):.1f}")
        if verify_t > 0:
            for _ in range(3):
                verify_call()
            line.append(f"verify T={verify_t} {be.time_verify_steps(verify_t, cfg.vocab_size):.1f}")
        print(f"== GDN {kernel}: us/round (graph, events): " + ", ".join(line), flush=True)


if __name__ == "__main__":
    main()
