"""Mixture-of-experts kernels (kernels/moe/) through CudaOps vs ops.cpu, one body per case: small
shapes under the CUDA simulator (tests/support/sim_runner.py), model shapes on the GPU (-m gpu).
So far the router's top-k (moe_route); the expert, fused-router and grouped cases are still in
sim_cases.py / test_kernels_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.ops import cpu
from ninfer_nb.runtime.tensor import bfloat16
from tests.kernels.device import DEVICE_MARKS, shapes
from tests.kernels.gpu_util import close, rnd

pytestmark = DEVICE_MARKS
TOL32 = 1e-5


@pytest.mark.parametrize("t,e,k", shapes(sim=[(3, 40, 4), (2, 300, 8)],
                                         gpu=[(5, 256, 8), (1, 128, 8), (3, 60, 4), (2, 700, 8)]))
@pytest.mark.parametrize("shared", [False, True])
def test_moe_route(dev, rng, t, e, k, shared):
    """Softmax top-k over E experts (more experts than threads per block too), a tie -> the
    lower id first, renormalised or not; with `shared`, the shared expert's gate column adds
    slot k (id E, weight sigmoid(logit))."""
    ops = dev.fresh()
    logits = rnd(rng, t, e + int(shared), scale=2.0)
    logits[0, 10] = logits[0, 3] = logits[0, :e].max() + 0.5
    for renorm in (True, False):
        ids, w = ops.moe_route(dev.up(logits), k, renorm, shared)
        ir, wr = cpu.moe_route(logits, k, renorm, shared)
        assert tuple(ids.shape) == (t, k + int(shared))
        np.testing.assert_array_equal(dev.host(ids), ir)
        close(dev.host(w), wr, TOL32)


def test_moe_route_ties(dev):
    """Ties inside and across 32-expert tiles: equal logits rank by id."""
    ops = dev.fresh()
    ties = np.zeros((3, 70), np.float32)
    ties[1, [3, 40, 65]] = 1.0
    ties[2, ::2] = 0.5
    for renorm in (True, False):
        ids, w = ops.moe_route(dev.up(ties), 5, renorm)
        ir, wr = cpu.moe_route(ties, 5, renorm)
        np.testing.assert_array_equal(dev.host(ids), ir)
        close(dev.host(w), wr, TOL32)
    np.testing.assert_array_equal(dev.host(ids)[1], [3, 40, 65, 0, 1])


@pytest.mark.parametrize("t,e,k,h,i,hot", shapes(
    sim=[(9, 4, 3, 64, 128, 1)],
    gpu=[(2, 17, 9, 2048, 512, 0), (8, 33, 9, 2048, 512, 0), (16, 17, 9, 2048, 512, 1),
         (63, 17, 9, 2048, 512, 0)]))
def test_moe_experts_rows(dev, rng, monkeypatch, t, e, k, h, i, hot):
    """kernels/moe/moe_rows.py (experts grouped by expert for a few tokens) vs ops.cpu.moe_experts:
    random routing with distinct experts per token, the last expert in every row (a shared slot,
    > 8 and > 16 rows on the GPU), a dropped id (-1), hot = 1: expert 0 in every row too; once
    plain, once added into a residual (the simulator: the residual case only, called directly;
    the GPU: through moe_experts, which must pick it). x and h enter the MMAs as bf16 hi + lo
    halves (fp32-like)."""
    ops = dev.fresh()
    names: list[str] = []
    if dev.on_gpu:
        go = ops._go
        monkeypatch.setattr(ops, "_go", lambda spec, *a, **kw: (names.append(spec.name), go(spec, *a, **kw)))
    run = ops.moe_experts if dev.on_gpu else ops._moe_experts_rows
    ids = np.stack([np.r_[rng.permutation(e - 1)[:k - 1], e - 1] for _ in range(t)]).astype(np.int32)
    if hot:
        ids[:, 0] = np.where((ids[:, 1:] == 0).any(1), ids[:, 0], 0)
    ids[t // 2, 1] = -1
    w = rng.uniform(0.1, 1.0, (t, k)).astype(np.float32)
    x = rnd(rng, t, h)
    gu = (rnd(rng, e, 2 * i, h) * 0.05).astype(bfloat16)
    dn = (rnd(rng, e, h, i) * 0.05).astype(bfloat16)
    res = rnd(rng, t, h)
    ids_c = np.where(ids < 0, e, ids)             # the reference: the dropped slot's weight 0
    w_c = np.where(ids < 0, 0.0, w).astype(np.float32)
    gu_c = np.concatenate([gu.astype(np.float32), np.zeros((1, 2 * i, h), np.float32)])
    dn_c = np.concatenate([dn.astype(np.float32), np.zeros((1, h, i), np.float32)])
    ref = cpu.moe_experts(x, ids_c, w_c, gu_c, dn_c)
    gu_d, dn_d = dev.up(gu), dev.up(dn)
    if dev.on_gpu:
        got = run(dev.up(x), dev.up(ids), dev.up(w), gu_d, dn_d, None)
        close(dev.host(got), ref, 1e-4)
        assert "moe_rows_gate_up_kernel" in names and "moe_gate_up_kernel" not in names, names
    r = dev.up(res)
    run(dev.up(x), dev.up(ids), dev.up(w), gu_d, dn_d, r)
    close(dev.host(r), res + ref, 1e-4)

