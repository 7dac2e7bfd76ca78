"""Calibrated conversion: the recorded input statistics match their definition, and GPTQ
rounding lowers the output error it is built to lower (against the scale search alone)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ninfer_nb.quant.calibrate import activation_importance
from ninfer_nb.quant.dequant import dequantize
from ninfer_nb.quant.formats import quant_format
from ninfer_nb.quant.gptq import quantize_gptq
from ninfer_nb.quant.search import quantize_mse
from tests.support.sharded import write_sharded


def test_statistics_are_per_input_column_and_shared_by_fused_parts(tmp_path: Path) -> None:
    d = tmp_path / "m"
    write_sharded(d, layers_per_shard=2, hidden=64, inter=128, layers=2, vocab=64)
    windows = [[1, 5, 9, 2, 33, 7, 8, 3], [4, 4, 6, 60, 12, 0, 1, 2]]
    diag = activation_importance(str(d), windows, context=8)
    full = activation_importance(str(d), windows, context=8, full=True)
    q, k = diag["model.layers.1.self_attn.q_proj.weight"], diag["model.layers.1.self_attn.k_proj.weight"]
    assert q.shape == (64,) and q is k and np.all(q > 0)
    assert diag["model.layers.0.mlp.down_proj.weight"].shape == (128,)
    assert "lm_head.weight" in diag and "model.embed_tokens.weight" in diag        # tied head
    h = full["model.layers.0.mlp.gate_proj.weight"]
    assert h.shape == (64, 64) and np.allclose(np.diag(h), diag["model.layers.0.mlp.gate_proj.weight"], rtol=1e-5)


def test_gptq_lowers_the_output_error() -> None:
    rng = np.random.default_rng(0)
    n, k = 64, 256
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((2048, k)) @ (rng.standard_normal((k, k)) * 0.3 + np.eye(k)) * (1 + 3 * rng.random(k))
    h = x.T @ x / len(x)
    fmt = quant_format("int4-g64")
    gptq = quantize_gptq(w, fmt, h)
    assert gptq.format is fmt and gptq.arrays["codes"].shape == (n, k // 2)

    def out_err(q) -> float:
        return float(np.sqrt(np.mean((x @ (dequantize(q) - w).T) ** 2)))

    assert out_err(gptq) < 0.8 * out_err(quantize_mse(w, fmt))
