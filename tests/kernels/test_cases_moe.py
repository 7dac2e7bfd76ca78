"""Mixture-of-experts kernels (kernels/moe/): the grouped-by-expert prefill path (its sort, its
mma.sync / pipelined / wgmma GEMMs), the per-pair decode experts and the fused router, through
CudaOps vs ops.cpu, one body per case: small shapes under the CUDA simulator
(tests/support/sim_runner.py, which always takes the grouped path), the Qwen3.6-35B-A3B shapes
on the GPU (-m gpu), times printed (-s). (The router's top-k alone: test_moe.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.kernels.moe import moe_grouped as G
from ninfer_nb.ops import cpu
from ninfer_nb.ops.cuda import moe as cuda_moe
from tests.kernels.case_util import GPU_ONLY, SIM_ONLY, TOL_F32, gpu_only, launched, wall_time
from tests.kernels.device import DEVICE_MARKS, SIM, shapes
from tests.kernels.gpu_util import BF16, F32Experts, close, rnd, rnd_bf16

pytestmark = DEVICE_MARKS
# grouped GEMMs vs the bf16-operand reference: the simulator ~1e-7; the H200 6.8e-4 / 8.3e-4, from
# h values whose fp32 sums land on the other side of a bf16 rounding boundary (a wrong row or
# tile is O(1) off)
TOL_GROUPED = 1e-4 if SIM else 2e-3
MOE_PATHS = ("grouped", "pipelined", "wgmma")


def _moe_ref_bf16(x, ids, w, gu, dn):
    """ops.cpu.moe_experts on bf16-rounded x and bf16-rounded SwiGLU rows h (the MMA operands of
    kernels/moe/moe_grouped.py), so the kernel is checked tightly."""
    xb = x.astype(BF16).astype(np.float32)
    out = np.zeros_like(x, dtype=np.float32)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        hb = cpu.swiglu(xb[rows] @ gu[e].astype(np.float32).T).astype(BF16).astype(np.float32)
        out[rows] += (hb @ dn[e].astype(np.float32).T) * w[rows, slots][:, None]
    return out


def _moe_path(ops, path, monkeypatch):
    """Pin CudaOps' prefill MoE GEMMs: moe_grouped's mma.sync, moe_pipelined's, or (cc 9.0)
    moe_wgmma's; shapes a path cannot run fall back to the next simpler one."""
    if path == "wgmma":
        from ninfer_nb.runtime import device

        cc = tuple(device.select("cuda:0").compute_capability)
        if cc != (9, 0):
            pytest.skip(f"wgmma needs a cc 9.0 GPU (this is {cc})")
    monkeypatch.setattr(cuda_moe, "MOE_PIPELINED_MIN_PAIRS", 1 << 30 if path == "grouped" else 0)
    monkeypatch.setattr(ops, "use_wgmma", path == "wgmma")


def _small_blocks(monkeypatch, sort_threads, chunk=None):
    """Smaller bookkeeping / combine blocks (simulator): faster, and E > block exercises the
    strided expert loops and the carried scan (the GEMM blocks stay 256 threads)."""
    monkeypatch.setattr(G, "SORT_THREADS", sort_threads)
    monkeypatch.setattr(G, "COMBINE_THREADS", 32)
    if chunk is not None:
        monkeypatch.setattr(G, "SORT_CHUNK", chunk)


def _routes(rng, t, e, k, unused, hot):
    """Top-k ids per token drawn from the experts not in `unused`, `hot` in every token."""
    pool = [x for x in range(e) if x not in unused and x != hot]
    rows = []
    for _ in range(t):
        r = list(rng.choice(pool, k - (hot is not None), replace=False)) + ([hot] if hot is not None else [])
        rows.append(rng.permutation(r))
    return np.array(rows, dtype=np.int32), (rng.random((t, k)) + 0.1).astype(np.float32)


# (T, E, k, I, H, shared expert, routing: None = ops.moe_route, else (unused experts, hot expert,
# sort block threads, sort chunk))
@pytest.mark.parametrize("t,e,k,i,h,shared,routing", shapes(
    sim=[(4, 6, 4, 20, 66, False, ({1, 4}, None, 4, None)), (65, 4, 2, 66, 20, False, ({3}, 2, 32, 64))],
    gpu=[(2048, 256, 8, 512, 2048, True, None), (512, 256, 8, 512, 2048, False, None),
         (70, 16, 4, 36, 100, False, None), (100, 8, 2, 96, 160, False, None), (100, 8, 2, 128, 192, False, None)]))
@pytest.mark.parametrize("path", shapes(sim=["grouped"], gpu=list(MOE_PATHS)))
def test_moe_grouped_mma(dev, rng, t, e, k, i, h, shared, routing, path, monkeypatch):
    """ops.moe_experts on the grouped path (x and h bf16 MMA operands, fp32 accumulate) vs the
    bf16-operand reference (tight) and the fp32 one (bf16 rounding of x and h: 2e-2).
    Simulator, moe_grouped's mma.sync GEMMs: top-4 with experts 1 and 4 idle, H = 66 (two down
    column tiles, ragged K = 66 in gate_up), I = 20, E > sort block (carried scan); top-2 with
    expert 2 in every token (65 rows: a full and a 1-row tile), expert 3 idle, I = 66 (two
    gate_up column tiles, ragged K in down), 3 sort chunks. GPU, each path (mma.sync, the cp.async
    / ldmatrix GEMM of moe_pipelined.py, the 64-row wgmma tiles of moe_wgmma.py): the 35B-A3B
    prefill chunk (T = 2048, E = 256 + the shared expert as expert 256, k = 8 + 1: 32 full row
    tiles for it), ragged column tiles and half-empty row tiles (fallbacks where a path cannot
    run them), bitwise reproducible; the time of one call (-s)."""
    ops = dev.fresh()
    if dev.on_gpu:
        assert t >= G.GROUPED_MIN_T
        _moe_path(ops, path, monkeypatch)
    n_exp = e + int(shared)
    gu, dn = rnd_bf16(rng, n_exp, 2 * i, h), rnd_bf16(rng, n_exp, h, i)
    x = rnd(rng, t, h)
    if routing is None:
        ids_d, w_d = ops.moe_route(dev.up(rnd(rng, t, n_exp, scale=2.0)), k, True, shared)
        ids, w = dev.host(ids_d), dev.host(w_d)
        if shared:
            assert (ids[:, -1] == e).all()
    else:
        unused, hot, sort_threads, chunk = routing
        _small_blocks(monkeypatch, sort_threads, chunk)
        ids, w = _routes(rng, t, e, k, unused, hot)
        ids_d, w_d = dev.up(ids), dev.up(w)
    X, GU, DN = dev.up(x), dev.up(gu), dev.up(dn)
    names = launched(ops, monkeypatch)
    out = dev.host(ops.moe_experts(X, ids_d, w_d, GU, DN))
    if dev.on_gpu and i % 64 == 0 and h % 64 == 0:             # every path runs these shapes (else: a fallback)
        expect = {"grouped": "moe_grouped_gate_up_kernel", "pipelined": "moe_mma_grouped_kernel",
                  "wgmma": "moe_wgmma_gate_up_kernel"}[path]
        assert expect in names, names
    close(out, _moe_ref_bf16(x, ids, w, gu, dn), TOL_GROUPED)
    close(out, cpu.moe_experts(x, ids, w, F32Experts(gu), F32Experts(dn)), 2e-2)
    if not dev.on_gpu:
        return
    assert np.array_equal(dev.host(ops.moe_experts(X, ids_d, w_d, GU, DN)), out)
    best = wall_time(dev, lambda: ops.moe_experts(X, ids_d, w_d, GU, DN))
    print(f"\ngrouped mma MoE ({path}) T={t} E={n_exp} k={ids.shape[1]} I={i} H={h}: "
          f"{best * 1e3:.2f} ms ({2 * t * ids.shape[1] * 3 * i * h / best / 1e12:.1f} TFLOP/s)")


@SIM_ONLY
def test_moe_grouped_bookkeeping(dev, rng, monkeypatch):
    """hist -> scan -> scatter: per-expert offsets, row-tile offsets and a stable expert sort
    (small sort blocks: E > block, 5 chunks of 64 pairs; the GPU runs them inside every grouped
    case)."""
    ops = dev.fresh()
    _small_blocks(monkeypatch, 16, chunk=64)
    e, p = 40, 300
    ids = rng.choice([x for x in range(e) if x % 7], p).astype(np.int32)   # experts 0, 7, ... unused
    ids[:150:2] = 5                                      # one expert with 75 pairs: two row tiles
    n_chunks = (p + G.SORT_CHUNK - 1) // G.SORT_CHUNK
    hist = np.zeros((n_chunks, e), np.int32)
    offs, tile_off, order = np.zeros(e + 1, np.int32), np.zeros(e + 1, np.int32), np.zeros(p, np.int32)
    ops._go(G.moe_hist_kernel, n_chunks, G.SORT_THREADS, ids, hist)
    ops._go(G.moe_scan_kernel, 1, G.SORT_THREADS, hist, offs, tile_off)
    ops._go(G.moe_scatter_kernel, n_chunks, G.SORT_THREADS, ids, hist, offs, order)
    counts = np.bincount(ids, minlength=e)
    np.testing.assert_array_equal(offs, np.concatenate([[0], np.cumsum(counts)]))
    np.testing.assert_array_equal(tile_off, np.concatenate([[0], np.cumsum((counts + G.BM - 1) // G.BM)]))
    np.testing.assert_array_equal(order, np.argsort(ids, kind="stable"))
    assert tile_off[-1] <= G.max_row_tiles(p, e)


@SIM_ONLY
def test_moe_pipelined_helpers(dev, rng):
    """kernels/moe/moe_pipelined.py's simulator-safe steps: 128-row tile offsets from the row
    offsets, the expert-sorted bf16 gather of x, SwiGLU to bf16 (its GEMM is GPU-only: the
    pipelined path of test_moe_grouped_mma)."""
    from ninfer_nb.kernels.moe import moe_pipelined as M

    ops = dev.fresh()
    counts = np.array([0, 300, 1, 128, 129, 0, 7], np.int32)
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    tile_off = np.zeros(counts.size + 1, np.int32)
    ops._go(M.moe_tile_offsets_kernel, 1, 32, offs, tile_off)
    np.testing.assert_array_equal(tile_off, np.concatenate([[0], np.cumsum((counts + M.BM - 1) // M.BM)]))
    assert tile_off[-1] <= M.max_row_tiles(int(counts.sum()), counts.size)
    t, k, h = 5, 3, 40
    x = rnd(rng, t, h)
    order = rng.permutation(t * k).astype(np.int32)
    xs = np.zeros((t * k, h), np.uint16)
    ops._go(M.moe_gather_bf16_kernel, t * k, 32, x, order, np.int32(k), xs)
    np.testing.assert_array_equal(xs.view(BF16), x[order // k].astype(BF16))
    g = rnd(rng, 6, 2 * 24)
    hb = np.zeros((6, 24), np.uint16)
    ops._go(M.moe_swiglu_bf16_kernel, 2, 32, g, hb)
    close(hb.view(BF16).astype(np.float32), cpu.swiglu(g).astype(BF16).astype(np.float32), 8e-3)


@GPU_ONLY
@pytest.mark.parametrize("path", gpu_only(list(MOE_PATHS)))
def test_moe_grouped_mma_skewed(dev, rng, monkeypatch, path):
    """Skewed routing at the 35B-A3B shape (expert 7 in every token, experts >= 64 unused): vs
    the bf16-operand reference and vs the per-pair (fp32 activation) kernels, which differ from
    it by the bf16 rounding of x and h."""
    t, e, k, i, h = 300, 256, 8, 512, 2048
    ops = dev.fresh()
    _moe_path(ops, path, monkeypatch)
    gu, dn = rnd_bf16(rng, e, 2 * i, h), rnd_bf16(rng, e, h, i)
    x = rnd(rng, t, h)
    logits = rnd(rng, t, e, scale=2.0)
    logits[:, 64:] -= 40.0
    logits[:, 7] = logits[:, :64].max(axis=1) + 0.5
    ids_d, w_d = ops.moe_route(dev.up(logits), k, True)
    ids, w = dev.host(ids_d), dev.host(w_d)
    assert (ids == 7).any(axis=1).all() and ids.max() < 64
    X, GU, DN = dev.up(x), dev.up(gu), dev.up(dn)
    names = launched(ops, monkeypatch)
    out = dev.host(ops.moe_experts(X, ids_d, w_d, GU, DN))
    assert {"grouped": "moe_grouped_gate_up_kernel", "pipelined": "moe_mma_grouped_kernel",
            "wgmma": "moe_wgmma_gate_up_kernel"}[path] in names, names
    close(out, _moe_ref_bf16(x, ids, w, gu, dn), TOL_GROUPED)
    monkeypatch.setattr(G, "GROUPED_MIN_T", 1 << 30)            # the per-pair (decode) kernels
    close(dev.host(ops.moe_experts(X, ids_d, w_d, GU, DN)), out, 2e-2)


@GPU_ONLY
@pytest.mark.parametrize("e,k,h,shared,renorm", gpu_only([(256, 8, 2048, True, True), (128, 8, 2048, False, False),
                                                (60, 4, 104, True, False), (6, 2, 64, False, True)]))
@pytest.mark.parametrize("cluster", gpu_only([True, False]))
def test_moe_router_fused(dev, rng, e, k, h, shared, renorm, cluster, monkeypatch):
    """ops.moe_router's one-launch decode router on a Normed row (RMSNorm, GEMV and the top-k)
    against norm + GEMV + moe_route and NumPy: same ids, same weights; repeated launches (the
    arrival counter must come back to 0, also inside a graph); the normed row it writes for the
    experts. cluster: the thread-block-cluster kernel (E = 256: 16 blocks, a non-portable
    cluster; E = 60: 4; E = 6: 1), else the arrival-counter kernel. Prints the times at the 35B
    shape. E = 6: fewer rows than one block's warps."""
    ops = dev.fresh()
    monkeypatch.setattr(cuda_moe, "ROUTER_CLUSTER", cluster)
    w = rnd_bf16(rng, e + int(shared), h)
    x, nw = rnd(rng, 1, h), rnd(rng, h)
    X, W, NW = dev.up(x), dev.up(w), dev.up(nw)
    xn = cpu.rms_norm(x, nw, 1e-6)
    ir, wr = cpu.moe_router(xn, w.astype(np.float32), k, renorm, shared)
    times = {}
    calls = {False: lambda: ops.moe_route(ops.linear(ops.rms_norm(X, NW, 1e-6), W), k, renorm, shared),
             True: lambda: ops.moe_router(ops.normed(X, NW, 1e-6), W, k, renorm, shared)}
    names = launched(ops, monkeypatch)
    for fused in (False, True):
        for _ in range(3):
            ids, wts = calls[fused]()
            np.testing.assert_array_equal(dev.host(ids), ir)
            close(dev.host(wts), wr, TOL_F32)
        times[fused], (ids, wts) = dev.best_time(calls[fused], reps=5, graph=True)
        np.testing.assert_array_equal(dev.host(ids), ir)
        close(dev.host(wts), wr, TOL_F32)
    assert names[-1] == ("moe_router_cluster_kernel" if cluster else "moe_router_fused_kernel")
    ids, wts, XN = ops._moe_router_fused(ops.normed(X, NW, 1e-6), W, k, renorm, shared)
    close(dev.host(XN), xn, TOL_F32)
    np.testing.assert_array_equal(dev.host(ids), ir)
    if e == 256:
        print(f"\nMoE router E={e}+{int(shared)} k={k} H={h}: norm + GEMV + route {times[False] * 1e6:.1f} us, "
              f"{'cluster' if cluster else 'fused'} {times[True] * 1e6:.1f} us")


@GPU_ONLY
@pytest.mark.parametrize("e,k,i,h", gpu_only([(256, 8, 512, 2048), (16, 4, 36, 100), (32, 3, 768, 4096),
                                     (64, 4, 256, 1024)]))
def test_moe_normed_residual(dev, rng, e, k, i, h, monkeypatch):
    """ops.moe on one Normed token with the shared expert as a slot, adding into the residual
    stream in place (the decoder's MoE block): against cpu.moe; which kernels ran (H % 2048 ==
    0: the fused router with the norm, the wide pair; H = 1024: the unrolled gate_up; H = 100:
    no fused norm); prints its time at the 35B shape."""
    ops = dev.fresh()
    gu, dn = rnd_bf16(rng, e + 1, 2 * i, h), rnd_bf16(rng, e + 1, h, i)
    router = rnd_bf16(rng, e + 1, h)
    x, nw = rnd(rng, 1, h), rnd(rng, h)
    GU, DN, R, NW = dev.up(gu), dev.up(dn), dev.up(router), dev.up(nw)
    ref = cpu.moe(cpu.rms_norm(x, nw, 1e-6), router.astype(np.float32), k, True, True, F32Experts(gu),
                  F32Experts(dn), x.copy())
    names = launched(ops, monkeypatch)
    X = dev.up(x)
    out = ops.moe(ops.normed(X, NW, 1e-6), R, k, True, True, GU, DN, residual=X)
    assert out is X
    close(dev.host(X), ref, TOL_F32)
    if h % 2048 == 0:
        assert names == ["moe_router_cluster_kernel", "moe_gate_up_wide_kernel", "moe_down_wide_kernel"]
    elif h % 8 == 0:
        assert "moe_router_cluster_kernel" in names and "add_kernel" not in names
    else:                                                            # no fused norm: the plain path
        assert "rms_norm_kernel" in names
    if e == 256:
        best, _ = dev.best_time(lambda: ops.moe(ops.normed(X, NW, 1e-6), R, k, True, True, GU, DN, residual=X),
                                reps=5, graph=True)
        print(f"\nMoE decode layer (norm, router, experts, residual add) E={e}+1 k={k}: {best * 1e6:.1f} us")


@GPU_ONLY
@pytest.mark.parametrize("t,e,k,i,h", gpu_only([(1, 256, 9, 512, 2048), (4, 256, 8, 512, 2048), (3, 16, 4, 36, 100),
                                       (2, 64, 5, 256, 1024), (1, 32, 3, 768, 4096)]))
@pytest.mark.parametrize("kind", gpu_only(["plain", "wide"]))
def test_moe_experts(dev, rng, t, e, k, i, h, kind, monkeypatch):
    """Per-pair (decode) expert kernels; "wide": the decode kernels with more loads in flight,
    forced for every T (taken where H % 1024 == 0 and I % 256 == 0; the 36 x 100 case keeps
    the plain kernels; the wide gate_up needs H % 2048 == 0, so H = 1024 runs the unrolled
    gate_up with the wide down). Prints the time of one call at the 35B shape (9 slots: 8
    routed experts and the shared one) (-s)."""
    ops = dev.fresh()
    gu, dn = rnd_bf16(rng, e, 2 * i, h), rnd_bf16(rng, e, h, i)
    x = rnd(rng, t, h)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    w = rng.random((t, k), dtype=np.float32)
    args = (dev.up(x), dev.up(ids), dev.up(w), dev.up(gu), dev.up(dn))
    monkeypatch.setattr(cuda_moe, "MOE_UNROLLED_MAX_T", 4 if kind != "plain" else 0)
    best, o = dev.best_time(lambda: ops.moe_experts(*args), reps=5, graph=True)
    close(dev.host(o), cpu.moe_experts(x, ids, w, F32Experts(gu), F32Experts(dn)), TOL_F32)
    if i == 512:
        print(f"\nMoE decode experts T={t} k={k} I={i} H={h} ({kind}): {best * 1e6:.1f} us")
