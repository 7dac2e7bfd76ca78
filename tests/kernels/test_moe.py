"""Mixture-of-experts kernels (kernels/moe/) through CudaOps vs ops.cpu, one body per case: small
shapes under the CUDA simulator (tests/support/sim_runner.py), model shapes on the GPU (-m gpu).
So far the router's top-k (moe_route); the expert, fused-router and grouped cases are still in
sim_cases.py / test_kernels_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.ops import cpu
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
