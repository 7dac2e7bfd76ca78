"""Inline-PTX intrinsics (llvmlite InlineAsm inside numba @intrinsic). GPU only.

All of the engine's llvmlite-based extensions live here, because they will not port to the
MLIR backend. The loads take an array plus a flat element index (C-contiguous arrays), so
kernels keep array arguments. In the CUDA simulator only `mma_bf16`, `mma_tf32`, `tf32`,
`pack_bf16x2`, `as_f32`, `ex2`, `shfl_xor`, `ldg_f32`, `ldg_v4_f32`, `lds_v4_f32`, `st_v4_f32`, `smem_u32`,
`gptr`, `cp_async16` (+ commit / wait), `ldsm_x4`, `ldg_stream_v4_u32`, `ldg_stream_u32`, `fma_bf16x2`, `f16x2_to_f32` and
`grid_dependency_sync`
exist (emulated, ptx_sim.py): kernels that use them and plain indexing
run there.
"""
from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import config, cuda
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
def ldg_f32(typingctx, arr, idx):
    """Read-only fp32 load of arr.flat[idx] (C-contiguous; no numba index arithmetic)."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        addr = _element_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        return builder.call(ir.InlineAsm(ir.FunctionType(_F32, [_I64]), "ld.global.nc.f32 $0, [$1];", "=f,l",
                                         side_effect=False), [addr])

    return types.float32(arr, idx), codegen


@intrinsic
def ldg_stream_u32(typingctx, arr, idx):
    """4-byte streaming load of read-only data (weights' scales) at arr.flat[idx]: no L1
    allocation, like ldg_stream_v4_u32 (the only loads a self_sync kernel issues before its
    grid_dependency_sync)."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        addr = _element_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        return builder.call(ir.InlineAsm(ir.FunctionType(_I32, [_I64]), "ld.global.nc.L1::no_allocate.u32 $0, [$1];",
                                         "=r,l", side_effect=False), [addr])

    return types.uint32(arr, idx), codegen


@intrinsic
def fma_bf16x2(typingctx, a, b, c):
    """a * b + c on two bf16 lanes (fma.rn.bf16x2; each operand a uint32 of two bf16, element 0
    in the low half); subnormals kept. Exact when the result fits bf16 (code - offset)."""
    if not all(isinstance(v, types.Integer) for v in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        vals = [_u32(context, builder, v, t) for v, t in zip(args, sig.args)]
        return _asm(builder, "fma.rn.bf16x2 $0, $1, $2, $3;", "=r,r,r,r", _I32, vals, side_effect=False)

    return types.uint32(a, b, c), codegen


@intrinsic
def f16x2_to_f32(typingctx, u):
    """The two float16 halves of a 32-bit word as float32 (low half first), exact (cvt.f32.f16:
    subnormals too)."""
    if not isinstance(u, types.Integer):
        return None
    ret = types.UniTuple(types.float32, 2)

    def codegen(context, builder, sig, args):
        v = _u32(context, builder, args[0], sig.args[0])
        r = _asm(builder, "{.reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h;}",
                 "=f,=f,r", ir.LiteralStructType([_F32, _F32]), [v], side_effect=False)
        return context.make_tuple(builder, ret, [builder.extract_value(r, j) for j in range(2)])

    return ret(u), codegen


@intrinsic
def as_f32(typingctx, u):
    """Bit-cast a 32-bit integer to float32 (mov.b32)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.uint32)
        return builder.bitcast(v, _F32)

    return types.float32(u), codegen


@cuda.jit(device=True, inline=True)
def shfl_xor(v, lane_mask):
    """cuda.shfl_xor_sync over the full warp (a name the simulator can emulate)."""
    return cuda.shfl_xor_sync(0xFFFFFFFF, v, lane_mask)


@cuda.jit(device=True, inline=True)
def shfl_idx(v, src_lane):
    """cuda.shfl_sync over the full warp: lane src_lane's v (a name the simulator can emulate)."""
    return cuda.shfl_sync(0xFFFFFFFF, v, src_lane)


# ---------------------------------------------------------------- tensor-core GEMM building blocks
def _asm(builder, asm, cons, ret, args, side_effect=True):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(ir.InlineAsm(fnty, asm, cons, side_effect=side_effect), args)


def _u32(context, builder, v, ty):
    return context.cast(builder, v, ty, types.uint32)


@intrinsic
def smem_u32(typingctx, arr):
    """32-bit shared-window address of element 0 of a cuda.shared.array."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        p = builder.ptrtoint(ary.data, _I64)
        s = _asm(builder, "cvta.to.shared.u64 $0, $1;", "=l,l", _I64, [p], side_effect=False)
        return builder.trunc(s, _I32)

    return types.uint32(arr), codegen


@intrinsic
def gptr(typingctx, arr):
    """Device address of element 0 of an array, as int64 (int64 + int64 stays integer)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        return builder.ptrtoint(ary.data, _I64)

    return types.int64(arr), codegen


def _make_cp_async(name: str, asm: str, doc: str) -> Any:
    """An intrinsic (shared u32 address, global address) that emits the cp.async `asm`."""
    def impl(typingctx, saddr, gaddr):
        if not isinstance(saddr, types.Integer) or not isinstance(gaddr, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            s = _u32(context, builder, args[0], sig.args[0])
            g = context.cast(builder, args[1], sig.args[1], types.int64)
            _asm(builder, asm, "r,l,~{memory}", ir.VoidType(), [s, g])
            return context.get_dummy_value()

        return types.void(saddr, gaddr), codegen

    impl.__name__, impl.__doc__ = name, doc
    return intrinsic(impl)


cp_async16 = _make_cp_async("cp_async16", "cp.async.cg.shared.global [$0], [$1], 16;",
                            "cp.async.cg 16 bytes global -> shared (L2 only, bypasses L1).")
# With an L2 prefetch size: the compile tests let these weight copies start before the grid wait.
cp_async16_l2 = _make_cp_async("cp_async16_l2", "cp.async.cg.shared.global.L2::256B [$0], [$1], 16;",
                               "cp.async.cg 16 bytes of weights global -> shared, 256-byte L2 prefetch.")
cp_async4_l2 = _make_cp_async("cp_async4_l2", "cp.async.ca.shared.global.L2::128B [$0], [$1], 4;",
                              "cp.async.ca 4 bytes (scale words) global -> shared, 128-byte L2 prefetch.")


def _make_noarg(name: str, asm: str, sm90: bool = False) -> Any:
    """An intrinsic of no arguments that emits `asm`; sm90: only when lowering for cc >= 9.0
    (nothing below, see `_sm90`)."""
    def typer(typingctx):
        def codegen(context, builder, sig, args):
            code = _sm90(asm) if sm90 else asm
            if code:
                _asm(builder, code, "~{memory}", ir.VoidType(), [])
            return context.get_dummy_value()

        return types.void(), codegen

    typer.__name__ = name
    return intrinsic(typer)


cp_async_commit = _make_noarg("cp_async_commit", "cp.async.commit_group;")
# Release/acquire fence at GPU scope: with a relaxed atomic after (writer) or before (reader) it
# orders global memory as the last-block-reduces pattern needs. numba's cuda.threadfence() is
# membar.gl = fence.sc.gpu (MEMBAR.SC.GPU), a sequentially consistent and much slower fence.
fence_acq_rel_gpu = _make_noarg("fence_acq_rel_gpu", "fence.acq_rel.gpu;")
cp_async_wait1 = _make_noarg("cp_async_wait1", "cp.async.wait_group 1;")
cp_async_wait0 = _make_noarg("cp_async_wait0", "cp.async.wait_group 0;")


@intrinsic
def grid_dependency_sync(typingctx):
    """Programmatic dependent launch (cc >= 9.0), at a kernel's start: `griddepcontrol.wait`
    (block until the grids this one depends on have completed and their memory is visible;
    returns at once when the kernel was launched without the PDL attribute), then
    `griddepcontrol.launch_dependents` (the next kernel in the stream may start its blocks).
    Emits nothing below cc 9.0, where the instructions do not exist (the compile target is
    read from numba's config stack at lowering time, as numba's own tanh does)."""
    def codegen(context, builder, sig, args):
        from numba.cuda.core import targetconfig

        cc = targetconfig.ConfigStack().top().compute_capability
        if cc is not None and tuple(cc[:2]) >= (9, 0):
            _asm(builder, "griddepcontrol.wait;", "~{memory}", ir.VoidType(), [])
            _asm(builder, "griddepcontrol.launch_dependents;", "~{memory}", ir.VoidType(), [])
        return context.get_dummy_value()

    return types.void(), codegen


def _make_special_reg(name: str, reg: str, bits: int, doc: str) -> Any:
    """An intrinsic of no arguments that reads special register `reg` (u32 or u64)."""
    ity, nty = (_I64, types.uint64) if bits == 64 else (_I32, types.uint32)

    def typer(typingctx):
        def codegen(context, builder, sig, args):
            return _asm(builder, f"mov.u{bits} $0, {reg};", "=l" if bits == 64 else "=r", ity, [])

        return nty(), codegen

    typer.__name__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


# Instrumentation (scripts/chain_probe.py traces when each block of a kernel ran, and where).
globaltimer = _make_special_reg("globaltimer", "%globaltimer", 64,
                                "The GPU's global nanosecond clock (`%globaltimer`, same on every SM).")
smid = _make_special_reg("smid", "%smid", 32, "The SM this thread runs on (`%smid`).")


def _sm90(asm: str) -> str:
    """`asm` when lowering for cc >= 9.0, else nothing (the compile target as in
    grid_dependency_sync)."""
    from numba.cuda.core import targetconfig

    cc = targetconfig.ConfigStack().top().compute_capability
    return asm if cc is not None and tuple(cc[:2]) >= (9, 0) else ""


# Thread-block clusters (cc >= 9.0; nothing is emitted below, where no kernel is launched as a
# cluster). Every thread of every block of the cluster makes each call, arrive and wait in turn.
# cluster_arrive_relaxed at a kernel's start and cluster_wait before the first access to another
# block's shared memory: every block of the cluster has started (its shared memory exists).
cluster_arrive_relaxed = _make_noarg("cluster_arrive_relaxed", "barrier.cluster.arrive.relaxed.aligned;", sm90=True)
cluster_wait = _make_noarg("cluster_wait", "barrier.cluster.wait.aligned;", sm90=True)
# The cluster-wide barrier with release / acquire: stores to any block's shared memory before it
# are visible to every thread of the cluster after it.
cluster_sync = _make_noarg("cluster_sync", "barrier.cluster.arrive.release.aligned; "
                                           "barrier.cluster.wait.acquire.aligned;", sm90=True)


@intrinsic
def st_cluster_f32(typingctx, saddr, rank, v):
    """Store the float32 v at shared-window address saddr (smem_u32 arithmetic) of the cluster's
    block `rank` (mapa.shared::cluster + st.shared::cluster). Nothing below cc 9.0."""
    if not isinstance(saddr, types.Integer) or not isinstance(rank, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        code = _sm90("{ .reg .u32 ra; mapa.shared::cluster.u32 ra, $0, $1; st.shared::cluster.f32 [ra], $2; }")
        if code:
            a = _u32(context, builder, args[0], sig.args[0])
            r = _u32(context, builder, args[1], sig.args[1])
            f = context.cast(builder, args[2], sig.args[2], types.float32)
            _asm(builder, code, "r,r,f,~{memory}", ir.VoidType(), [a, r, f])
        return context.get_dummy_value()

    return types.void(saddr, rank, types.float32), codegen


# mbarriers (cc >= 9.0; nothing is emitted below): a 64-bit phase / arrival / transaction counter
# in shared memory. One block initialises its own (`mbarrier_init`, then
# `fence_mbarrier_init` and a cluster arrive / wait before any other block signals it), other
# blocks' `st_async_cluster_f32` stores complete transaction bytes on it, and its threads wait
# for the phase (`mbarrier_try_wait`) after one of them declared the bytes
# (`mbarrier_arrive_expect_tx`). No release fence anywhere: barrier.cluster.arrive.release
# compiles to MEMBAR.ALL.GPU (+ ERRBAR, CGAERRBAR) on sm_90a, a GPU-scope wait for every
# outstanding memory operation of the thread.
fence_mbarrier_init = _make_noarg("fence_mbarrier_init", "fence.mbarrier_init.release.cluster;", sm90=True)


def _make_mbarrier_op(name: str, asm: str) -> Any:
    """An intrinsic (mbar, n) of two 32-bit integers that emits `asm` ($0 = mbar, $1 = n) when
    lowering for cc >= 9.0 (nothing below)."""
    def typer(typingctx, mbar, n):
        if not isinstance(mbar, types.Integer) or not isinstance(n, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            code = _sm90(asm)
            if code:
                _asm(builder, code, "r,r,~{memory}", ir.VoidType(),
                     [_u32(context, builder, args[0], sig.args[0]), _u32(context, builder, args[1], sig.args[1])])
            return context.get_dummy_value()

        return types.void(mbar, n), codegen

    typer.__name__ = name
    return intrinsic(typer)


# mbarrier_init(mbar, count): the mbarrier at shared-window address mbar (8-byte aligned),
# `count` arrivals per phase.
mbarrier_init = _make_mbarrier_op("mbarrier_init", "mbarrier.init.shared::cta.b64 [$0], $1;")
# mbarrier_arrive_expect_tx(mbar, nbytes): one arrival on this block's mbarrier, whose phase
# then also waits for `nbytes` of transactions.
mbarrier_arrive_expect_tx = _make_mbarrier_op(
    "mbarrier_arrive_expect_tx", "{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1; }")


@intrinsic
def mbarrier_try_wait(typingctx, mbar, parity):
    """1 when the phase of this block's mbarrier with the given parity has completed (its
    transactions' stores are then visible to the thread), else 0 after a bounded wait."""
    if not isinstance(mbar, types.Integer) or not isinstance(parity, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        code = _sm90("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.u32 $0, 1, 0, p; }")
        if not code:
            return context.get_constant(types.int32, 1)
        r = _asm(builder, code, "=r,r,r,~{memory}", _I32,
                 [_u32(context, builder, args[0], sig.args[0]), _u32(context, builder, args[1], sig.args[1])])
        return r

    return types.int32(mbar, parity), codegen


@intrinsic
def st_async_cluster_f32(typingctx, saddr, rank, v, mbar):
    """Store the float32 v at shared-window address saddr of the cluster's block `rank`, completing
    4 transaction bytes on that block's mbarrier at (its) address mbar (st.async; no fence)."""
    if not all(isinstance(a, types.Integer) for a in (saddr, rank, mbar)):
        return None

    def codegen(context, builder, sig, args):
        code = _sm90("{ .reg .u32 ra, rb; mapa.shared::cluster.u32 ra, $0, $1; mapa.shared::cluster.u32 rb, $3, $1; "
                     "st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [ra], $2, [rb]; }")
        if code:
            a = _u32(context, builder, args[0], sig.args[0])
            r = _u32(context, builder, args[1], sig.args[1])
            f = context.cast(builder, args[2], sig.args[2], types.float32)
            m = _u32(context, builder, args[3], sig.args[3])
            _asm(builder, code, "r,r,f,r,~{memory}", ir.VoidType(), [a, r, f, m])
        return context.get_dummy_value()

    return types.void(saddr, rank, types.float32, mbar), codegen


@intrinsic
def ldsm_x4(typingctx, saddr):
    """ldmatrix.x4 (non-transposed): four 8x8 b16 matrices, lanes 8i..8i+7 address matrix i's rows."""
    if not isinstance(saddr, types.Integer):
        return None
    ret = types.UniTuple(types.uint32, 4)

    def codegen(context, builder, sig, args):
        s = _u32(context, builder, args[0], sig.args[0])
        r = _asm(builder, "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0,$1,$2,$3}, [$4];",
                 "=r,=r,=r,=r,r,~{memory}", ir.LiteralStructType([_I32] * 4), [s])
        return context.make_tuple(builder, ret, [builder.extract_value(r, j) for j in range(4)])

    return ret(saddr), codegen


def _b32(context, builder, v, ty):
    """An fp32 or integer value as a 32-bit register (floats bit-cast, not converted)."""
    if isinstance(ty, types.Float):
        return builder.bitcast(context.cast(builder, v, ty, types.float32), _I32)
    return _u32(context, builder, v, ty)


def _make_mma(name: str, shape_types: str, operand_ok: Any, doc: str):
    """A warp-level `mma.sync.aligned.<shape_types>` intrinsic: (a 4-tuple, b0, b1, c 4-tuple of
    fp32) -> the new c. `operand_ok(type)` accepts the a / b register types (integers holding
    packed bf16, or fp32 holding tf32 bits); either is passed as a 32-bit register."""
    def typer(typingctx, a, b0, b1, c):
        ok = (isinstance(a, types.UniTuple) and a.count == 4 and operand_ok(a.dtype)
              and operand_ok(b0) and operand_ok(b1)
              and isinstance(c, types.UniTuple) and c.count == 4 and c.dtype == types.float32)
        if not ok:
            return None
        ret = types.UniTuple(types.float32, 4)

        def codegen(context, builder, sig, args):
            av = [_b32(context, builder, builder.extract_value(args[0], j), sig.args[0].dtype) for j in range(4)]
            bv = [_b32(context, builder, args[1], sig.args[1]), _b32(context, builder, args[2], sig.args[2])]
            cv = [builder.extract_value(args[3], j) for j in range(4)]
            r = _asm(builder, f"mma.sync.aligned.{shape_types} "
                              "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                     "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", ir.LiteralStructType([_F32] * 4), av + bv + cv,
                     side_effect=False)
            return context.make_tuple(builder, ret, [builder.extract_value(r, j) for j in range(4)])

        return ret(a, b0, b1, c), codegen

    typer.__name__ = name
    typer.__doc__ = doc
    return intrinsic(typer)


mma_bf16 = _make_mma(
    "mma_bf16", "m16n8k16.row.col.f32.bf16.bf16.f32", lambda t: isinstance(t, types.Integer),
    "c += A(16x16 bf16, 4 regs) . B(16x8 bf16, 2 regs), fp32 accumulators (4-tuple).")
mma_tf32 = _make_mma(
    "mma_tf32", "m16n8k8.row.col.f32.tf32.tf32.f32", lambda t: t == types.float32,
    """c += A(16x8 tf32, 4 regs) . B(8x8 tf32, 2 regs), fp32 accumulators (4-tuple). Lane
    l = 4g + t holds A (g, t), (g+8, t), (g, t+4), (g+8, t+4); B rows t, t+4 of column g;
    C rows g / g+8, columns 2t, 2t+1. Operands are fp32 values already rounded by `tf32` (the
    tensor cores read the top 19 bits of each register).""")


@intrinsic
def tf32(typingctx, x):
    """fp32 rounded to tf32 (cvt.rna.tf32.f32: nearest, ties away; the low 13 bits zero), as fp32."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        r = _asm(builder, "cvt.rna.tf32.f32 $0, $1;", "=r,f", _I32, [v], side_effect=False)
        return builder.bitcast(r, _F32)

    return types.float32(x), codegen


@intrinsic
def ex2(typingctx, x):
    """2^x, ex2.approx.ftz.f32 (one MUFU op, ~2 ulp; ex2(-inf) = 0). math.exp2 compiles to a
    multi-instruction libdevice routine."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return _asm(builder, "ex2.approx.ftz.f32 $0, $1;", "=f,f", _F32, [v], side_effect=False)

    return types.float32(x), codegen


def _make_pack_x2(name: str, cvt: str) -> Any:
    """An intrinsic packing two fp32 into a 16-bit pair with `cvt` (round to nearest even):
    `hi` in bits 31:16, `lo` in bits 15:0."""
    def impl(typingctx, hi, lo):
        if not isinstance(hi, types.Float) or not isinstance(lo, types.Float):
            return None

        def codegen(context, builder, sig, args):
            h = context.cast(builder, args[0], sig.args[0], types.float32)
            lo_ = context.cast(builder, args[1], sig.args[1], types.float32)
            return _asm(builder, f"{cvt} $0, $1, $2;", "=r,f,f", _I32, [h, lo_], side_effect=False)

        return types.uint32(hi, lo), codegen

    impl.__name__ = name
    return intrinsic(impl)


pack_bf16x2 = _make_pack_x2("pack_bf16x2", "cvt.rn.bf16x2.f32")
pack_f16x2 = _make_pack_x2("pack_f16x2", "cvt.rn.f16x2.f32")


@intrinsic
def lds_v4_f32(typingctx, arr, idx):
    """16-byte load of arr.flat[idx .. idx + 3] from a cuda.shared.array (16-byte aligned)."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None
    ret = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        addr = _element_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        r = _asm(builder, "{ .reg .u64 sa; cvta.to.shared.u64 sa, $4; ld.shared.v4.f32 {$0,$1,$2,$3}, [sa]; }",
                 "=f,=f,=f,=f,l,~{memory}", ir.LiteralStructType([_F32] * 4), [addr])
        return context.make_tuple(builder, ret, [builder.extract_value(r, j) for j in range(4)])

    return ret(arr, idx), codegen


@intrinsic
def st_v2_f32(typingctx, arr, idx, v0, v1):
    """8-byte store of (v0, v1) to arr.flat[idx], arr.flat[idx + 1] (8-byte aligned)."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        addr = _element_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        a = context.cast(builder, args[2], sig.args[2], types.float32)
        b = context.cast(builder, args[3], sig.args[3], types.float32)
        _asm(builder, "st.global.v2.f32 [$0], {$1,$2};", "l,f,f,~{memory}", ir.VoidType(), [addr, a, b])
        return context.get_dummy_value()

    return types.void(arr, idx, v0, v1), codegen


@intrinsic
def st_v4_f32(typingctx, arr, idx, v0, v1, v2, v3):
    """16-byte store of (v0..v3) to arr.flat[idx .. idx + 3] (16-byte aligned)."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        addr = _element_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        vs = [context.cast(builder, args[2 + j], sig.args[2 + j], types.float32) for j in range(4)]
        _asm(builder, "st.global.v4.f32 [$0], {$1,$2,$3,$4};", "l,f,f,f,f,~{memory}", ir.VoidType(), [addr] + vs)
        return context.get_dummy_value()

    return types.void(arr, idx, v0, v1, v2, v3), codegen


@intrinsic
def st_v4_u32(typingctx, arr, idx, v0, v1, v2, v3):
    """16-byte store of four 32-bit words at the byte address of arr.flat[idx] (16-byte aligned)."""
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        addr = _element_address(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        vs = [_u32(context, builder, args[2 + j], sig.args[2 + j]) for j in range(4)]
        _asm(builder, "st.global.v4.u32 [$0], {$1,$2,$3,$4};", "l,r,r,r,r,~{memory}", ir.VoidType(), [addr] + vs)
        return context.get_dummy_value()

    return types.void(arr, idx, v0, v1, v2, v3), codegen


# ---------------------------------------------------------------- Hopper wgmma (sm_90a)
# numba-cuda compiles for sm_90a on a cc 9.0 device (CUDACodeLibrary appends "a"), so these
# assemble there; on other targets the PTX still generates (inline asm is opaque to NVVM) but
# ptxas would reject it, so kernels using them are only launched on cc 9.0.
fence_proxy_async = _make_noarg("fence_proxy_async", "fence.proxy.async.shared::cta;")
wgmma_fence = _make_noarg("wgmma_fence", "wgmma.fence.sync.aligned;")
wgmma_commit = _make_noarg("wgmma_commit", "wgmma.commit_group.sync.aligned;")
wgmma_wait0 = _make_noarg("wgmma_wait0", "wgmma.wait_group.sync.aligned 0;")
wgmma_wait1 = _make_noarg("wgmma_wait1", "wgmma.wait_group.sync.aligned 1;")


def _make_wgmma_bf16(n: int):
    """acc = wgmma.mma_async m64n{n}k16 (f32 += bf16 x bf16) with A and B read by the tensor
    cores from K-major shared-memory tiles given by 64-bit descriptors. acc: n/2 fp32 per
    thread, passed and returned as one UniTuple (tied asm operands, so it stays in registers).
    Fragment layout (per warp q of the warpgroup, lane = 4g + t): acc[4j + e] is row
    16q + g + 8 (e >= 2), column 8j + 2t + (e & 1)."""
    nacc = n // 2
    regs = ",".join(f"${i}" for i in range(nacc))
    asm = ("{\n.reg .pred p;\n"
           f"setp.ne.b32 p, ${nacc + 2}, 0;\n"
           f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{regs}}}, ${nacc}, ${nacc + 1}, "
           "p, 1, 1, 0, 0;\n}")
    cons = ",".join(["=f"] * nacc + ["l", "l", "r"] + [str(i) for i in range(nacc)])
    ret = types.UniTuple(types.float32, nacc)
    fnty = ir.FunctionType(ir.LiteralStructType([_F32] * nacc), [_I64, _I64, _I32] + [_F32] * nacc)

    def typer(typingctx, desc_a, desc_b, acc):
        if not (isinstance(desc_a, types.Integer) and isinstance(desc_b, types.Integer)
                and isinstance(acc, types.UniTuple) and acc.count == nacc
                and acc.dtype == types.float32):
            return None

        def codegen(context, builder, sig, args):
            da = context.cast(builder, args[0], sig.args[0], types.int64)
            db = context.cast(builder, args[1], sig.args[1], types.int64)
            cv = [builder.extract_value(args[2], j) for j in range(nacc)]
            r = builder.call(ir.InlineAsm(fnty, asm, cons, side_effect=True),
                             [da, db, ir.Constant(_I32, 1)] + cv)
            return context.make_tuple(builder, ret, [builder.extract_value(r, j) for j in range(nacc)])

        return ret(desc_a, desc_b, acc), codegen

    typer.__name__ = f"wgmma_m64n{n}k16"
    return intrinsic(typer)


wgmma_m64n128k16 = _make_wgmma_bf16(128)


def _make_f32_zeros(n: int):
    """An intrinsic returning a UniTuple of n fp32 zeros (a 64-element tuple literal in Python
    source trips numba's bytecode peephole on CPython 3.11)."""
    ret = types.UniTuple(types.float32, n)

    def typer(typingctx):
        def codegen(context, builder, sig, args):
            return context.make_tuple(builder, ret, [ir.Constant(_F32, 0.0)] * n)

        return ret(), codegen

    typer.__name__ = f"f32_zeros_{n}"
    return intrinsic(typer)


f32_zeros_64 = _make_f32_zeros(64)


if config.ENABLE_CUDASIM:      # warp-level tensor-core ops emulated in the simulator (ptx_sim.py)
    from ninfer_nb.kernels.common import ptx_sim as _sim

    mma_bf16 = _sim.mma_bf16                    # noqa: F811
    pack_bf16x2 = _sim.pack_bf16x2              # noqa: F811
    as_f32 = _sim.as_f32                        # noqa: F811
    mma_tf32 = _sim.mma_tf32                    # noqa: F811
    tf32 = _sim.tf32                            # noqa: F811
    lds_v4_f32 = _sim.load_v4                   # noqa: F811
    ldg_v4_f32 = _sim.load_v4                   # noqa: F811
    ldg_f32 = _sim.load                         # noqa: F811
    st_v4_f32 = _sim.store_v4                   # noqa: F811
    ex2 = _sim.ex2                              # noqa: F811
    shfl_xor = _sim.shfl_xor                    # noqa: F811
    shfl_idx = _sim.shfl_idx                    # noqa: F811
    ldg_stream_v4_u32 = _sim.load_v4_u32        # noqa: F811
    ldg_stream_u32 = _sim.load_u32              # noqa: F811
    fma_bf16x2 = _sim.fma_bf16x2                # noqa: F811
    f16x2_to_f32 = _sim.f16x2_to_f32            # noqa: F811
    st_v4_u32 = _sim.store_v4_u32               # noqa: F811
    smem_u32 = _sim.smem_u32                    # noqa: F811
    gptr = _sim.gptr                            # noqa: F811
    cp_async16 = _sim.cp_async16                # noqa: F811
    cp_async_commit = _sim.cp_async_noop        # noqa: F811
    cp_async_wait0 = _sim.cp_async_noop         # noqa: F811
    cp_async_wait1 = _sim.cp_async_noop         # noqa: F811
    ldsm_x4 = _sim.ldsm_x4                      # noqa: F811
    grid_dependency_sync = _sim.grid_dependency_sync  # noqa: F811
