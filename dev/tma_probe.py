"""How fast the bulk-copy (TMA) engine streams DRAM into shared memory on this GPU (GPU, not a
test). Each block streams its slice of a 1 GiB bf16 matrix [M, 2048] through S shared-memory
stages; one thread issues the copies on the stages' mbarriers and waits for them (nothing is
computed). Variants: 1-D bulk copies of C bytes (cp.async.bulk) at 1, 2 and 4 blocks per SM, and
2-D tiles through a tensor map (cp.async.bulk.tensor, box 256 columns x R rows). A kernel that
streams the same bytes with 16-byte loads (8 in flight per lane, as the decode GEMVs) is the
reference (it keeps fewer loads in flight than the GEMVs: a floor, not the copy bandwidth).
Prints GB/s for each. Usage: python3 dev/tma_probe.py [--ptx: lower the kernels for sm_90a into
/tmp, no GPU needed]"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
from numba import cuda, int32, int64, uint16, uint32, void

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llvmlite import ir  # noqa: E402
from numba.cuda import types  # noqa: E402
from numba.cuda.extending import intrinsic  # noqa: E402

from ninfer_nb.kernels.common.ptx import (  # noqa: E402
    _asm,
    _u32,
    fence_mbarrier_init,
    gptr,
    ldg_stream_v4_u32,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_try_wait,
    smem_u32,
)

COLS = 2048
ROWS = 1 << 18                       # 2048 x 262144 bf16 = 1 GiB
MAX_SMEM = 200 * 1024


@intrinsic
def bulk_g2s(typingctx, saddr, gaddr, nbytes, mbar):
    """cp.async.bulk global -> shared of nbytes on mbarrier mbar."""
    def codegen(context, builder, sig, args):
        _asm(builder, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
             "r,l,r,r,~{memory}", ir.VoidType(),
             [_u32(context, builder, args[0], sig.args[0]), context.cast(builder, args[1], sig.args[1], types.int64),
              _u32(context, builder, args[2], sig.args[2]), _u32(context, builder, args[3], sig.args[3])])
        return context.get_dummy_value()

    return types.void(saddr, gaddr, nbytes, mbar), codegen


@intrinsic
def tensor_g2s(typingctx, saddr, tmap, x, y, mbar):
    """cp.async.bulk.tensor.2d global -> shared: the box at (column x, row y) of the tensor map at
    global address tmap, on mbarrier mbar."""
    def codegen(context, builder, sig, args):
        _asm(builder, "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                      "[$0], [$1, {$2, $3}], [$4];", "r,l,r,r,r,~{memory}", ir.VoidType(),
             [_u32(context, builder, args[0], sig.args[0]), context.cast(builder, args[1], sig.args[1], types.int64),
              _u32(context, builder, args[2], sig.args[2]), _u32(context, builder, args[3], sig.args[3]),
              _u32(context, builder, args[4], sig.args[4])])
        return context.get_dummy_value()

    return types.void(saddr, tmap, x, y, mbar), codegen


BULK_SIG = void(uint16[::1], int64, int32, int32)
TENSOR_SIG = void(uint16[::1], int32, int32, int32)
LOAD_SIG = void(uint16[::1], int64, uint32[::1])


def bulk_kernel(src, per_block, chunk, stages):
    """Block b streams bytes [b * per_block, (b + 1) * per_block) of src in chunks."""
    smem = cuda.shared.array(0, uint32)
    bars = cuda.shared.array(8, int64)
    if cuda.threadIdx.x != 0:
        return
    base = (smem_u32(smem) + 127) & ~uint32(127)
    bar0 = smem_u32(bars)
    for s in range(stages):
        mbarrier_init(bar0 + 8 * s, 1)
    fence_mbarrier_init()
    g0 = gptr(src) + cuda.blockIdx.x * per_block
    n = per_block // chunk
    for i in range(min(stages, n)):
        mbarrier_arrive_expect_tx(bar0 + 8 * i, chunk)
        bulk_g2s(base + i * chunk, g0 + i * chunk, chunk, bar0 + 8 * i)
    for i in range(n):
        s = i % stages
        while mbarrier_try_wait(bar0 + 8 * s, (i // stages) & 1) == 0:
            pass
        j = i + stages
        if j < n:
            mbarrier_arrive_expect_tx(bar0 + 8 * s, chunk)
            bulk_g2s(base + s * chunk, g0 + j * chunk, chunk, bar0 + 8 * s)


def tensor_kernel(tmap_buf, rows_per_block, box_rows, stages):
    """Block b streams rows [b * rows_per_block, ...) of the [ROWS, COLS] matrix, all columns, as
    boxes of 256 columns x box_rows rows through the tensor map in tmap_buf."""
    smem = cuda.shared.array(0, uint32)
    bars = cuda.shared.array(8, int64)
    if cuda.threadIdx.x != 0:
        return
    base = (smem_u32(smem) + 127) & ~uint32(127)
    bar0 = smem_u32(bars)
    tmap = gptr(tmap_buf)
    box = 256 * box_rows * 2
    for s in range(stages):
        mbarrier_init(bar0 + 8 * s, 1)
    fence_mbarrier_init()
    r0 = cuda.blockIdx.x * rows_per_block
    per_row_band = COLS // 256
    n = rows_per_block // box_rows * per_row_band
    for i in range(min(stages, n)):
        mbarrier_arrive_expect_tx(bar0 + 8 * i, box)
        tensor_g2s(base + i * box, tmap, (i % per_row_band) * 256, r0 + (i // per_row_band) * box_rows, bar0 + 8 * i)
    for i in range(n):
        s = i % stages
        while mbarrier_try_wait(bar0 + 8 * s, (i // stages) & 1) == 0:
            pass
        j = i + stages
        if j < n:
            mbarrier_arrive_expect_tx(bar0 + 8 * s, box)
            tensor_g2s(base + s * box, tmap, (j % per_row_band) * 256, r0 + (j // per_row_band) * box_rows,
                       bar0 + 8 * s)


def load_kernel(src, per_block, out):
    """Block b streams its slice with 16-byte loads, 8 in flight per lane; XOR so nothing is dead."""
    g0 = cuda.blockIdx.x * per_block // 2            # elements
    acc = uint32(0)
    k = cuda.threadIdx.x * 8
    step = cuda.blockDim.x * 8
    end = per_block // 2
    while k + 7 * step < end:
        for u in range(8):
            a = ldg_stream_v4_u32(src, g0 + k + u * step)
            acc ^= a[0] ^ a[1] ^ a[2] ^ a[3]
        k += 8 * step
    if acc == uint32(0x12345678):
        out[0] = acc


def tensor_map(ptr: int, box_rows: int) -> np.ndarray:
    """The 128-byte CUtensorMap of the [ROWS, COLS] bf16 matrix at ptr, box 256 x box_rows."""
    from cuda.bindings import driver as drv

    err, tm = drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, ptr,
        [drv.cuuint64_t(COLS), drv.cuuint64_t(ROWS)], [drv.cuuint64_t(COLS * 2)],
        [drv.cuuint32_t(256), drv.cuuint32_t(box_rows)], [drv.cuuint32_t(1), drv.cuuint32_t(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    assert err == drv.CUresult.CUDA_SUCCESS, err
    return np.frombuffer(ctypes.string_at(tm.getPtr(), 128), np.uint16).copy()


def main() -> None:
    if "--ptx" in sys.argv:                          # no GPU: check that the kernels lower for sm_90a
        for fn, sig in ((bulk_kernel, BULK_SIG), (tensor_kernel, TENSOR_SIG), (load_kernel, LOAD_SIG)):
            ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
            Path(f"/tmp/{fn.__name__}.ptx").write_text(ptx)
            print(fn.__name__, len(ptx.splitlines()), "lines of PTX")
        return
    from ninfer_nb.kernels.common.registry import _allow_dynamic_smem
    from ninfer_nb.runtime.events import Timer
    from tests.kernels.gpu_util import GpuEnv

    env = GpuEnv(arena_bytes=(1 << 30) + (512 << 20), scratch_bytes=64 << 20)
    ops = env.fresh()
    src = env.arena.empty((ROWS * COLS,), np.uint16)
    nbytes = ROWS * COLS * 2
    sms = ops.sm_count
    bulk, tensor, load = (cuda.jit(sig)(fn) for fn, sig in ((bulk_kernel, BULK_SIG), (tensor_kernel, TENSOR_SIG),
                                                             (load_kernel, LOAD_SIG)))
    for k in (bulk, tensor):
        _allow_dynamic_smem(k, MAX_SMEM + 128)
    out = env.arena.empty((1,), np.uint32)
    stream = env.stream.numba

    def timed(launch) -> float:
        launch()
        env.stream.synchronize()
        with Timer(env.stream) as t:
            launch()
        return nbytes / (t.ms * 1e-3) / 1e9

    blocks = 4 * sms
    per = nbytes // blocks // 4096 * 4096
    print(f"{sms} SMs; GB/s streaming {nbytes / 2**30:.0f} GiB (over the blocks' slices)")
    print(f"16-byte loads, {blocks} blocks x 256 threads: "
          f"{timed(lambda: load[blocks, 256, stream](src, per, out)):7.0f}")
    for per_sm, stages, chunk in ((1, 4, 32768), (1, 6, 32768), (1, 3, 65536), (2, 4, 16384), (2, 3, 32768),
                                  (4, 4, 8192), (4, 3, 16384), (8, 3, 8192)):
        g = per_sm * sms
        pb = nbytes // g // chunk * chunk
        smem = stages * chunk + 128
        gbs = timed(lambda: bulk[g, 32, stream, smem](src, pb, chunk, stages)) * (pb * g / nbytes)
        print(f"1-D bulk copies: {per_sm} block(s)/SM, {stages} stages x {chunk // 1024} KB: {gbs:7.0f}")
    for per_sm, stages, box_rows in ((1, 4, 64), (1, 6, 32), (2, 4, 32), (4, 4, 16)):
        g = per_sm * sms
        tm = env.up(tensor_map(src.ptr, box_rows)).reshape(-1)
        rpb = ROWS // g // box_rows * box_rows
        smem = stages * 256 * box_rows * 2 + 128
        gbs = timed(lambda: tensor[g, 32, stream, smem](tm, rpb, box_rows, stages)) * (rpb * g / ROWS)
        print(f"tensor-map tiles: {per_sm} block(s)/SM, {stages} stages x 256x{box_rows}: {gbs:7.0f}")


if __name__ == "__main__":
    main()
