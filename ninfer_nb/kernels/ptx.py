"""Inline-PTX intrinsics (llvmlite InlineAsm inside numba @intrinsic). GPU only.

All of the engine's llvmlite-based extensions live here, because they will not port to the
MLIR backend. The loads take an array plus a flat element index (C-contiguous arrays), so
kernels keep array arguments. None of these work in the CUDA simulator.
"""
from __future__ import annotations

from llvmlite import ir
from numba.cuda import types
from numba.cuda.extending import intrinsic

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()


def _element_address(context, builder, arrty, arr, idx, idxty):
    ary = context.make_array(arrty)(context, builder, value=arr)
    i = context.cast(builder, idx, idxty, types.int64)
    return builder.ptrtoint(builder.gep(ary.data, [i]), _I64)


def _make_v4_load(name: str, asm: str, elem: ir.Type, ret_elem: types.Type):
    fnty = ir.FunctionType(ir.LiteralStructType([elem] * 4), [_I64])
    cons = ",".join(["=r" if elem == _I32 else "=f"] * 4) + ",l"
    ret = types.UniTuple(ret_elem, 4)

    def typer(typingctx, arr, idx):
        if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            addr = _element_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            r = builder.call(ir.InlineAsm(fnty, asm, cons, side_effect=False), [addr])
            return context.make_tuple(builder, ret, [builder.extract_value(r, j) for j in range(4)])

        return ret(arr, idx), codegen

    typer.__name__ = name
    return intrinsic(typer)


# 16-byte streaming load of read-only data (weights): no L1 allocation, 256-byte L2 prefetch.
ldg_stream_v4_u32 = _make_v4_load(
    "ldg_stream_v4_u32", "ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {$0,$1,$2,$3}, [$4];", _I32, types.uint32)
# 16-byte read-only load (activations, reused from L1/L2).
ldg_v4_f32 = _make_v4_load("ldg_v4_f32", "ld.global.nc.v4.f32 {$0,$1,$2,$3}, [$4];", _F32, types.float32)


@intrinsic
def as_f32(typingctx, u):
    """Bit-cast a 32-bit integer to float32 (mov.b32)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.uint32)
        return builder.bitcast(v, _F32)

    return types.float32(u), codegen


ALL = ("ldg_stream_v4_u32", "ldg_v4_f32", "as_f32")
