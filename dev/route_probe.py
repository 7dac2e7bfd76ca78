"""Where moe_route's time goes (GPU, not a test), on the 35B shape (E = 256, k = 8, shared):
a copy of the first kernels/moe.py _route_row (scalar shared loads, int64 counts) with %clock64
stamps after each stage (thread 0), then the current _route_row, stamped around, three times
in one launch (the first cold)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import cuda, float32, int32
from numba.cuda import types
from numba.cuda.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ninfer_nb.kernels.moe.moe import (
    MAX_TOPK,
    ROUTE_BLOCK,
    ROUTE_MAX_CAND,
    ROUTE_MAX_E,
    _route_row,
)


@intrinsic
def clk(typingctx):
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        return builder.call(ir.InlineAsm(fnty, "mov.u64 $0, %clock64;", "=l", side_effect=True), [])
    return types.int64(), codegen


@cuda.jit(fastmath=True)
def route_timed(logits, top_k, ids, weights, stamps):
    row = cuda.shared.array(ROUTE_MAX_E, float32)
    top_p = cuda.shared.array(MAX_TOPK, float32)
    cand_v = cuda.shared.array(ROUTE_MAX_CAND, float32)
    cand_e = cuda.shared.array(ROUTE_MAX_CAND, int32)
    tid = cuda.threadIdx.x
    nthr = cuda.blockDim.x
    lane = tid & 31
    t0 = clk()
    n_exp = logits.shape[1] - 1
    for e in range(tid, n_exp, nthr):
        row[e] = logits[0, e]
    gate = logits[0, n_exp]
    n_tiles = (n_exp + 31) >> 5
    for e in range(n_exp + tid, n_tiles * 32, nthr):
        row[e] = -math.inf
    if tid < top_k:
        ids[0, tid] = 0
        top_p[tid] = float32(0.0)
    cuda.syncthreads()
    t1 = clk()
    for tile in range(tid >> 5, n_tiles, nthr >> 5):
        base = tile * 32
        v = row[base + lane]
        rank = 0
        for j in range(0, 32, 4):
            u0, u1, u2, u3 = row[base + j], row[base + j + 1], row[base + j + 2], row[base + j + 3]
            rank += (int32(u0 > v) + int32(u1 > v) + int32(u2 > v) + int32(u3 > v)
                     + int32((u0 == v) & (j < lane)) + int32((u1 == v) & (j + 1 < lane))
                     + int32((u2 == v) & (j + 2 < lane)) + int32((u3 == v) & (j + 3 < lane)))
        if rank < top_k:
            cand_v[tile * top_k + rank] = v
            cand_e[tile * top_k + rank] = base + lane
    cuda.syncthreads()
    t2 = clk()
    n_cand = n_tiles * top_k
    for i in range(tid, n_cand, nthr):
        v = cand_v[i]
        rank = 0
        j = 0
        while j + 4 <= n_cand:
            u0, u1, u2, u3 = cand_v[j], cand_v[j + 1], cand_v[j + 2], cand_v[j + 3]
            rank += (int32(u0 > v) + int32(u1 > v) + int32(u2 > v) + int32(u3 > v)
                     + int32((u0 == v) & (j < i)) + int32((u1 == v) & (j + 1 < i))
                     + int32((u2 == v) & (j + 2 < i)) + int32((u3 == v) & (j + 3 < i)))
            j += 4
        while j < n_cand:
            u0 = cand_v[j]
            rank += int32(u0 > v) + int32((u0 == v) & (j < i))
            j += 1
        e = cand_e[i]
        if rank < top_k and 0 <= e < n_exp:
            ids[0, rank] = e
            top_p[rank] = v
    cuda.syncthreads()
    t3 = clk()
    mx = top_p[0]
    total = float32(0.0)
    for r in range(top_k):
        total += math.exp(top_p[r] - mx)
    if tid < top_k:
        weights[0, tid] = math.exp(top_p[tid] - mx) / total
    if tid == 0:
        ids[0, top_k] = n_exp
        weights[0, top_k] = float32(1.0) / (float32(1.0) + math.exp(-gate))
    t4 = clk()
    if tid == 0:
        stamps[0] = t0
        stamps[1] = t1
        stamps[2] = t2
        stamps[3] = t3
        stamps[4] = t4
    if tid == 64:
        stamps[5] = t3 - t2


@cuda.jit(fastmath=True)
def route_now(logits, top_k, ids, weights, stamps):
    """The current kernels/moe.py _route_row, stamped before and after."""
    row = cuda.shared.array(ROUTE_MAX_E, float32)
    tid = cuda.threadIdx.x
    n_exp = logits.shape[1] - 1
    for e in range(tid, n_exp, cuda.blockDim.x):
        row[e] = logits[0, e]
    for rep in range(3):                         # the same code 3 times: cold, then warm caches
        cuda.syncthreads()
        t0 = clk()
        _route_row(row, n_exp, logits[0, n_exp], top_k, 1, 1, ids, weights, 0)
        t1 = clk()
        if tid == 0:
            stamps[rep] = t1 - t0


def main() -> None:
    rng = np.random.default_rng(0)
    lg = cuda.to_device(rng.standard_normal((1, 257)).astype(np.float32))
    ids = cuda.device_array((1, 9), np.int32)
    w = cuda.device_array((1, 9), np.float32)
    st = cuda.device_array(12, np.int64)
    for i in range(5):
        route_timed[1, ROUTE_BLOCK](lg, np.int32(8), ids, w, st)
        cuda.synchronize()
        s = st.copy_to_host()
        d = np.diff(s[:5])
        print(f"run {i}: load+pad {d[0]}, stage 1 {d[1]}, stage 2 {d[2]}, weights {d[3]} cycles; "
              f"total {s[4] - s[0]} (thread 64 stage 2: {s[5]})")
    for i in range(3):
        route_now[1, ROUTE_BLOCK](lg, np.int32(8), ids, w, st)
        cuda.synchronize()
        print(f"current _route_row, 3 times in one launch: {st.copy_to_host()[:3]} cycles")
    ref = np.argsort(-lg.copy_to_host()[0, :256], kind="stable")[:8]
    print("ids", ids.copy_to_host()[0], "ref", ref)


if __name__ == "__main__":
    main()
