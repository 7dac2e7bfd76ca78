"""quant/random.py: which weights of a preset a quantized random model stores in the format."""
from __future__ import annotations

from types import SimpleNamespace

from ninfer_nb.models.presets import preset_config, random_weights
from ninfer_nb.quant.formats import quant_format
from ninfer_nb.quant.random import quantized_calls


def _calls(preset: str) -> tuple[list[SimpleNamespace], object]:
    calls: list[SimpleNamespace] = []

    def make(shape: tuple[int, ...], kind: str) -> SimpleNamespace:
        calls.append(SimpleNamespace(shape=tuple(shape), kind=kind, index=len(calls)))
        return calls[-1]

    return calls, random_weights(preset_config(preset), make)


def test_groupwise_formats_skip_weights_whose_k_does_not_split_into_groups() -> None:
    """tiny-qwen3.5-moe's expert down stacks have K = 64: int8-g128 leaves them dense (a converter
    would), int4-g64 and fp8 (128 x 128 blocks, partial ones allowed) take them."""
    calls, w = _calls("tiny-qwen3.5-moe")
    down = {layer.ffn.down.index for layer in w.layers}
    gate_up = {layer.ffn.gate_up.index for layer in w.layers}
    assert {calls[i].shape[-1] for i in down} == {64}
    g128 = quantized_calls(preset_config("tiny-qwen3.5-moe"), quant_format("int8-g128"))
    assert not down & g128 and gate_up <= g128 and w.lm_head.index in g128
    assert all(calls[i].shape[-1] % 128 == 0 for i in g128)
    for name in ("int4-g64", "fp8"):
        picked = quantized_calls(preset_config("tiny-qwen3.5-moe"), quant_format(name))
        assert down | gate_up <= picked, name
    assert quantized_calls(preset_config("tiny-qwen3.5-moe")) >= g128     # without a format: by shape only
