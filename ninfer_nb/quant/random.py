"""Random weights in a quantized format for benchmarks (`bench --random PRESET --weights FMT`):
which of a preset's weights take the format, and the per-group scale that keeps a random
weight's spread what the dense random weights have.

A preset's weights are laid out by models/presets.py random_weights(cfg, make), one `make`
call per array in a fixed order; `quantized_calls` names the calls whose weight is stored in
the format: the linear matrices, but not the embedding (looked up by row), the MoE routers and
the shared-expert gate (kept as stored, as the checkpoint formats keep them) nor matrices with
a side of at most 8. Expert stacks take the format too where the tiled layout holds it (the
MoE kernels read tiled stacks). `random_tiled` builds such a weight straight in the device
layout (quant/tiled.py) through the backend's allocation and fill callbacks. Knows nothing
about devices beyond those callbacks.
"""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from ..models.presets import random_weights
from ..models.weights import MoEWeights, QuantizedWeight
from .formats import QuantFormat
from .tiled import TILE_BYTES, TILE_ROWS, TILED, tile_cols, tileable

SMALL_SIDE = 8


def quantized_calls(cfg: Any, fmt: QuantFormat | None = None) -> frozenset[int]:
    """Indices (in call order) of the `make` calls of random_weights(cfg, make) whose weight a
    quantized random model stores in the format; with `fmt`, a groupwise format's weights only
    where K splits into its groups (the others stay dense, as a converter leaves them)."""
    calls: list[SimpleNamespace] = []

    def make(shape: tuple[int, ...], kind: str) -> SimpleNamespace:
        calls.append(SimpleNamespace(shape=tuple(shape), kind=kind, index=len(calls)))
        return calls[-1]

    w = random_weights(cfg, make)
    kept = {id(w.embed)}
    for layer in w.layers + ([w.mtp.layer] if w.mtp is not None else []):
        if isinstance(layer.ffn, MoEWeights):
            kept |= {id(layer.ffn.router), id(layer.ffn.shared_gate)}
    fmt_free = {"matrix"}
    if experts_quantized(cfg):
        fmt_free.add("experts")
    grouped = fmt is not None and fmt.layout != "fp8-block"
    return frozenset(c.index for c in calls
                     if c.kind in fmt_free and min(c.shape[-2:]) > SMALL_SIDE and id(c) not in kept
                     and not (grouped and c.shape[-1] % fmt.group_size))


def experts_quantized(cfg: Any) -> bool:
    """Whether a random MoE model's expert stacks take the format (the CUDA MoE decode reads
    tiled int4 / int8 / fp8 stacks)."""
    return True


def group_scale(fmt: QuantFormat, half_width: float) -> float:
    """The scale of a group whose codes are uniform over 0 .. 2^bits - 1 (symmetric zero point)
    so the weights spread over about U(-half_width, half_width), as the dense random ones;
    fp8-block: random e4m3 codes below 2 in magnitude (random_tiled's fill) times half_width / 2."""
    if fmt.layout == "fp8-block":
        return half_width / 2
    return half_width / fmt.midpoint


def random_tiled(shape: tuple[int, ...], fmt: QuantFormat, scale: float,
                 empty: Callable[[tuple[int, ...], Any], Any], fill: Callable[[Any], None],
                 put: Callable[[np.ndarray], Any]) -> QuantizedWeight:
    """A random weight [N, K] or [E, N, K] in the tiled device layout of `fmt` (tileable
    formats and shapes): codes from `fill` (uniform random bytes; fp8: finite ones below 2)
    into `empty(shape, uint8)`, every group's scale `scale`, zero points the midpoint; the
    small scale / zero arrays built on the host and `put` on the device."""
    lead, (n, k) = tuple(shape[:-2]), shape[-2:]
    if not tileable(fmt, shape):                 # the canonical layout (quant/formats.py)
        codes = empty(lead + (n, k * fmt.bits // 8), np.uint8)
        fill(codes)
        if fmt.layout == "fp8-block":
            return QuantizedWeight(fmt, tuple(shape), {"codes": codes, "scales": put(
                np.full(lead + (-(-n // 128), -(-k // 128)), scale, np.float32))})
        groups = lead + (n, k // fmt.group_size)
        arrays = {"codes": codes, "scales": put(np.full(groups, scale, np.float16))}
        if fmt.zero_points:
            arrays["zeros"] = put(np.full(groups, fmt.midpoint, np.uint8))
        return QuantizedWeight(fmt, tuple(shape), arrays)
    nt = -(-n // TILE_ROWS)
    codes = empty(lead + (nt, k // tile_cols(fmt.bits), TILE_BYTES), np.uint8)   # [.., NT, KT, 512]
    fill(codes)
    if fmt.layout == "fp8-block":
        arrays = {"codes": codes, "scales": put(np.full(lead + (nt, k // 128), scale, np.float32))}
    else:
        h = np.uint32(np.float16(scale).view(np.uint16))
        groups = lead + (nt, k // fmt.group_size, 8)
        arrays = {"codes": codes, "scales": put(np.full(groups, h | (h << np.uint32(16)), np.uint32))}
        if fmt.zero_points:
            mid = np.uint32(fmt.midpoint)
            z = (np.uint32(np.float32(-(128 + fmt.midpoint)).view(np.uint32) >> 16) if fmt.bits == 4 else mid)
            arrays["zeros"] = put(np.full(groups, z | (z << np.uint32(16)), np.uint32))
    return QuantizedWeight(replace(fmt, layout=TILED[fmt.layout]), tuple(shape), arrays)
