"""The one-token decode GEMV builds ops/cuda/linear.py picks for the real model shapes (no GPU).

`one_token_build` picks a kernels/linear/linear.py gemv_one_token build (K slices, blocks per SM,
warps per block) per weight shape. A build that is not registered at import
(`ONE_TOKEN_BUILDS`) is compiled only on first use, on the GPU, so the PTX, ptxas and
no-spill tests never see it: every build the presets' matrices can get must be registered.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ninfer_nb.kernels.linear import linear as K_lin
from ninfer_nb.models.presets import PRESETS, preset_config, random_weights
from ninfer_nb.ops.cuda import one_token_build, one_token_build_x8


def _matrix_shapes(preset: str) -> set[tuple[int, int]]:
    """Every 2-D weight shape of the preset (the GEMV operands), lm_head included."""
    shapes: set[tuple[int, int]] = set()

    def make(shape: tuple[int, ...], kind: str) -> SimpleNamespace:
        if kind == "matrix":
            shapes.add((int(shape[0]), int(shape[1])))
        return SimpleNamespace(shape=shape)

    random_weights(preset_config(preset), make)
    return shapes


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_picked_build_is_registered_and_covers_the_grid(preset: str) -> None:
    registered = {tuple(b) for b in K_lin.ONE_TOKEN_BUILDS}
    shapes = _matrix_shapes(preset)
    assert shapes, preset
    for n, k in sorted(shapes):
        for mode in K_lin.ONE_TOKEN_MODES:
            for build in (one_token_build(mode, n, k), one_token_build_x8(mode, n, k)):
                assert build[0] == mode
                assert build in registered, f"{preset} {mode} {n}x{k}: {build} is not in ONE_TOKEN_BUILDS"
                _, ways, blocks, warps = build
                assert warps % ways == 0 and blocks * warps <= 64      # 2048 threads per SM
                K_lin.gemv_one_token(*build)                          # a valid build


def test_long_rows_take_4_warp_blocks_and_one_wave_rows_fill_the_sms() -> None:
    """The 27B's rows (K > 4096) run in 4-warp blocks; its 5120-row plain weights take whole
    rows when those make one wave of 4-5 blocks per SM (640 blocks on 132 SMs), the 35B's
    (K <= 4096) keep 8-warp blocks."""
    assert one_token_build("plain", 5120, 17408, 132) == ("plain", 1, 5, 4)
    assert one_token_build("plain", 5120, 17408, 66) == ("plain", 2, 6, 4)    # 640 blocks: 2 waves
    assert one_token_build("swiglu", 34816, 5120)[3] == 4
    assert one_token_build("normed", 12352, 2048) == one_token_build_x8("normed", 12352, 2048)
    for sms in (66, 114, 132, 170):                       # whole rows only when they fit one wave
        mode, ways, blocks, warps = one_token_build("plain", 5120, 6144, sms)
        if ways == 1:
            assert -(-2560 // warps) <= blocks * sms
