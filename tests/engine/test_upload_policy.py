"""engine/upload_policy.py: the storage each weight gets on the device, with a fake `put`
(no GPU): the rules the CUDA backend's upload and random weights used to hold inline."""
from __future__ import annotations

import numpy as np

from ninfer_nb.engine.upload_policy import STORAGE, dense_storage, random_storage, upload_weights
from ninfer_nb.models.presets import preset_config, random_weights
from ninfer_nb.models.weights import DenseWeight, MoEWeights, QuantizedWeight, map_weights
from ninfer_nb.quant.dequant import quantize
from ninfer_nb.quant.formats import quant_format


def _put(a: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    return a.copy() if dtype is None else a.astype(dtype)


def test_dense_rules() -> None:
    bf16_values = np.random.default_rng(0).standard_normal((16, 32)).astype(STORAGE["bf16"]).astype(np.float32)
    assert dense_storage((16, 32), bf16_values) == "bf16"
    assert dense_storage((16, 32), bf16_values + np.float32(1e-4)) == "f32"    # not bf16-exact
    assert dense_storage((1, 32), bf16_values[:1]) == "f32"                    # a gate row: small
    assert dense_storage((4, 16, 32), np.zeros((4, 16, 32), np.float32) + 0.1) == "bf16"  # experts
    assert dense_storage((16, 32)) == "bf16"                                   # random: bf16
    assert random_storage((16, 32), "matrix") == "bf16"
    assert random_storage((16, 4), "conv") == "f32" and random_storage((32,), "norm") == "f32"


def test_upload_tags_every_record_and_keeps_vectors_fp32() -> None:
    from dataclasses import replace

    from ninfer_nb.quant.tiled import untile

    cfg = preset_config("tiny-qwen3.5-moe")
    rng = np.random.default_rng(1)
    host = random_weights(cfg, lambda s, k: rng.standard_normal(s).astype(STORAGE["bf16"]).astype(np.float32))
    fmt = quant_format("int4-g64")
    host.layers[1].mixer.in_proj = quantize(host.layers[1].mixer.in_proj.data, fmt)
    dev = upload_weights(host, _put)
    assert dev.embed.dtype == "bf16" and dev.embed.data.dtype == STORAGE["bf16"]
    moe = dev.layers[0].ffn
    assert isinstance(moe, MoEWeights) and moe.gate_up.dtype == "bf16" and moe.router.dtype == "bf16"
    q = dev.layers[1].mixer.in_proj
    # quantized records go up in the tiled layout of quant/tiled.py, losslessly
    assert isinstance(q, QuantizedWeight) and q.format == replace(fmt, layout="groupwise-tiled")
    assert q.arrays["codes"].dtype == np.uint8 and q.arrays["scales"].dtype == np.uint32
    back = untile(q)
    assert back.format == fmt and all(np.array_equal(back.arrays[k], host.layers[1].mixer.in_proj.arrays[k])
                                      for k in fmt.arrays)
    assert dev.layers[0].input_norm.dtype == np.float32 and dev.norm.dtype == np.float32
    tags = []
    map_weights(dev, lambda r: tags.append(r.dtype if isinstance(r, DenseWeight) else "q") or r, lambda a: a)
    assert set(tags) == {"bf16", "q"}


def test_upload_keeps_a_tied_head_one_record_and_non_bf16_values_fp32() -> None:
    from dataclasses import replace

    cfg = replace(preset_config("tiny-qwen3.5"), tie_word_embeddings=True)
    rng = np.random.default_rng(2)
    host = random_weights(cfg, lambda s, k: rng.standard_normal(s).astype(np.float32))
    puts: list[int] = []
    dev = upload_weights(host, lambda a, d: puts.append(id(a)) or _put(a, d))
    assert dev.lm_head is dev.embed and dev.embed.dtype == "f32"
    assert dev.embed.data.dtype == np.float32
    assert len(puts) == len(set(puts))                                   # each array goes up once
