"""Weight records (models/weights.py): what the builders produce, and the structure walkers
keep shared records and arrays shared."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb.models.presets import preset_config, random_weights
from ninfer_nb.models.weights import (
    DenseWeight,
    GDNWeights,
    MoEWeights,
    QuantizedWeight,
    as_linear,
    map_arrays,
    map_weights,
    unique_arrays,
)
from ninfer_nb.quant.dequant import quantize
from ninfer_nb.quant.formats import quant_format


def _tiny(preset: str = "tiny-qwen3.5-moe", tied: bool = False):
    cfg = preset_config(preset)
    if tied:
        from dataclasses import replace
        cfg = replace(cfg, tie_word_embeddings=True)
    rng = np.random.default_rng(0)
    return random_weights(cfg, lambda shape, kind: rng.standard_normal(shape).astype(np.float32))


def test_linear_weights_are_records_and_vectors_stay_arrays() -> None:
    w = _tiny()
    assert isinstance(w.embed, DenseWeight) and w.embed.dtype == "f32"
    assert isinstance(w.lm_head, DenseWeight) and w.lm_head is not w.embed
    moe = w.layers[0].ffn
    assert isinstance(moe, MoEWeights)
    assert isinstance(moe.router, DenseWeight) and isinstance(moe.gate_up, DenseWeight)
    assert moe.gate_up.ndim == 3 and moe.gate_up.expert(2).shape == moe.gate_up.shape[1:]
    gdn = w.layers[0].mixer
    assert isinstance(gdn, GDNWeights) and isinstance(gdn.in_proj, DenseWeight)
    assert all(isinstance(a, np.ndarray) for a in (gdn.conv, gdn.a_log, gdn.dt_bias, gdn.norm,
                                                     w.layers[0].input_norm, w.norm))


def test_tied_lm_head_stays_the_embedding_record_through_the_walkers() -> None:
    w = _tiny("tiny-qwen3.5", tied=True)
    assert w.lm_head is w.embed
    doubled = map_arrays(w, lambda a: a * 2)
    assert doubled.lm_head is doubled.embed
    assert np.array_equal(doubled.embed.data, 2 * w.embed.data)
    arrays = unique_arrays(w)
    assert sum(a is w.embed.data for a in arrays) == 1
    fmt = quant_format("int8-g64")
    q = map_weights(w, lambda r: quantize(r.data, fmt), lambda a: a)
    assert isinstance(q.embed, QuantizedWeight) and q.lm_head is q.embed
    assert q.layers[0].input_norm is w.layers[0].input_norm
    assert sum(a.nbytes for a in unique_arrays(q)) < sum(a.nbytes for a in arrays)


def test_records_validate_what_they_hold() -> None:
    with pytest.raises(ValueError, match="dtype"):
        DenseWeight(np.zeros((2, 2), np.float32), "fp32")          # type: ignore[arg-type]
    fmt = quant_format("int4-g32-zp")
    with pytest.raises(ValueError, match="zeros"):
        QuantizedWeight(fmt, (4, 32), {"codes": np.zeros((4, 16), np.uint8),
                                       "scales": np.zeros((4, 1), np.float16)})
    bare = np.zeros((4, 8), np.float16)
    assert as_linear(bare).dtype == "f16" and as_linear(bare).data is bare
    record = DenseWeight(bare, "f16")
    assert as_linear(record) is record
    with pytest.raises(TypeError):
        as_linear(np.zeros((4, 8), np.int32))
