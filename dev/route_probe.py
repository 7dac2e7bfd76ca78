"""How many cycles moe_route's row routine takes (GPU, not a test), on the 35B shape (E = 256,
k = 8, shared expert): kernels/moe's _route_row, imported, stamped with %clock64 before and after,
three times in one launch (the first cold), then its ids checked against NumPy's top-k.
Usage: python3 dev/route_probe.py"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import cuda, float32
from numba.cuda import types
from numba.cuda.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ninfer_nb.kernels.moe.moe import (
    ROUTE_BLOCK,
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
    """kernels/moe's _route_row on one row, stamped before and after (thread 0), three times."""
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
    for _ in range(3):
        route_timed[1, ROUTE_BLOCK](lg, np.int32(8), ids, w, st)
        cuda.synchronize()
        print(f"_route_row, 3 times in one launch: {st.copy_to_host()[:3]} cycles")
    ref = np.argsort(-lg.copy_to_host()[0, :256], kind="stable")[:8]
    print("ids", ids.copy_to_host()[0], "ref", ref)


if __name__ == "__main__":
    main()
