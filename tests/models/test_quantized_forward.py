"""The CPU backend runs quantized linear weights: a tiny checkpoint whose linear weights are
quantized (groupwise int8 / int4, quant/) gives logits close to its fp32 weights'. The tiny
random models are sensitive: rounding their weights to bf16 moves the logits by ~2 %, 0.5 %
Gaussian weight noise by ~5 %, about what int8-g64 does."""
from __future__ import annotations

import numpy as np
import pytest

import ninfer_nb.llm as llm_module
from ninfer_nb.models import build_weights
from ninfer_nb.models.weights import DenseWeight, QuantizedWeight, map_weights, unique_arrays
from ninfer_nb.quant.dequant import dequantize, quantize
from ninfer_nb.quant.formats import quant_format

IDS = [11, 400, 9120, 77, 31000, 5, 248000, 1234, 60000, 3]


def _logits(path: str, monkeypatch: pytest.MonkeyPatch, fmt_name: str | None = None,
            as_dense: bool = False) -> tuple[np.ndarray, object]:
    """Logits of IDS on the CPU, with every linear weight whose rows split into the format's
    groups quantized to it (the rest stays fp32), or (as_dense) replaced by the fp32 dense
    record of those quantized values; also the weights the model ran."""
    seen = {}

    def build(cfg, weights, source, place=None):
        w = build_weights(cfg, weights, source)
        if fmt_name is not None:
            fmt = quant_format(fmt_name)

            def convert(r):
                if r.shape[-1] % fmt.group_size:
                    return r
                q = quantize(r.data, fmt)
                return DenseWeight(dequantize(q), "f32") if as_dense else q

            w = map_weights(w, convert, lambda a: a)
        seen["weights"] = w
        return w

    monkeypatch.setattr(llm_module, "build_weights", build)
    llm = llm_module.LLM(path, device="cpu", max_context=64)
    return llm.logits(IDS), seen["weights"]


def _records(w) -> list:
    found: list = []
    map_weights(w, lambda r: found.append(r) or r, lambda a: a)
    return found


KINDS = ["tiny_qwen35_dir", "tiny_qwen35_moe_dir", "tiny_llama_dir"]


@pytest.mark.parametrize("fmt", ["int8-g64", "int4-g32-zp"])
@pytest.mark.parametrize("kind", KINDS)
def test_quantized_records_run_as_their_dequantized_values(kind: str, fmt: str, request: pytest.FixtureRequest,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole model (projections, experts, router, embedding, LM head) on QuantizedWeight
    records gives the logits of the same values held dense."""
    path = str(request.getfixturevalue(kind))
    got, w = _logits(path, monkeypatch, fmt)
    want, _ = _logits(path, monkeypatch, fmt, as_dense=True)
    records = _records(w)
    quantized = [r for r in records if isinstance(r, QuantizedWeight)]
    assert len(quantized) >= len(records) // 2, "most linear weights are quantized"
    assert isinstance(w.embed, QuantizedWeight)
    assert np.all(np.isfinite(got))
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["tiny_qwen35_dir", "tiny_llama_dir"])
def test_int8_g64_logits_stay_close_to_fp32(kind: str, request: pytest.FixtureRequest,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Dense models (a MoE's routing flips under any rounding, so it is checked above only)."""
    path = str(request.getfixturevalue(kind))
    ref, dense = _logits(path, monkeypatch)
    got, w = _logits(path, monkeypatch, "int8-g64")
    assert (w.lm_head is w.embed) == (dense.lm_head is dense.embed)
    assert sum(a.nbytes for a in unique_arrays(w)) < 0.4 * sum(a.nbytes for a in unique_arrays(dense))
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < 0.1, rel
    assert np.mean(got.argmax(-1) == ref.argmax(-1)) >= 0.8
