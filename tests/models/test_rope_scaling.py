"""RoPE scaling is computed as Hugging Face does, or refused at load.

- the rotary table (models/rope.py) against transformers' own frequency functions, per type;
- the table's precision at position 262143 against a float64 reference;
- CPU logits against transformers on tiny checkpoints whose positions run past
  original_max_position_embeddings (llama3, yarn, linear; Qwen3.5's partial rotary and mrope);
- unknown types, dynamic / longrope, malformed rope fields, missing config fields and
  qwen3_next: one-line errors naming the field (CLI exit 2).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_nb.config import ModelConfig
from ninfer_nb.errors import ModelFormatError, NinferError, UnsupportedModelError
from ninfer_nb.models.rope import inv_freq, pack_table, rope_table, table_inv_freq
from ninfer_nb.ops import cpu

torch = pytest.importorskip("torch")

LLAMA: dict[str, Any] = dict(model_type="llama", vocab_size=64, hidden_size=64, num_hidden_layers=1,
                             num_attention_heads=4, rope_theta=10000.0, max_position_embeddings=256)
ORIGINAL = 32                        # pretraining context of the scaled tiny checkpoints
ROPES: dict[str, dict[str, Any]] = {
    "linear": {"rope_type": "linear", "factor": 2.5},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL},
    "yarn-mscale-untruncated": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
                                "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2,
                                "truncate": False},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
                              "attention_factor": 0.8},
}


def _config(rope: dict[str, Any] | None, **over: Any) -> ModelConfig:
    raw = dict(LLAMA, **over)
    if rope is not None:
        raw["rope_scaling"] = rope
    return ModelConfig.from_hf(raw)


# --- the table ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["default", *ROPES])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_frequencies_match_transformers(name: str, partial: float) -> None:
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = dict(ROPES.get(name, {"rope_type": "default"}), rope_theta=10000.0, partial_rotary_factor=partial)
    ours = ModelConfig.from_hf(dict(LLAMA, rope_parameters=rope))
    hf_cfg = tf.LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"}, rope_parameters=dict(rope))
    if name == "default":
        dim = ours.rotary_dim
        ref, ref_scale = 1.0 / (10000.0 ** (torch.arange(0, dim, 2).float() / dim)), 1.0
    else:
        ref, ref_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_cfg, "cpu")
    freq, scale = inv_freq(ours)
    assert freq.shape == (ours.rotary_dim // 2,) == tuple(ref.shape)
    np.testing.assert_allclose(freq, ref.double().numpy(), rtol=2e-7)      # HF's are fp32
    assert scale == pytest.approx(ref_scale, rel=1e-12)
    table = rope_table(ours)
    assert table.shape == (3, ours.rotary_dim // 2) and table.dtype == np.float32
    assert np.all(table[2] == np.float32(scale))


def test_yarn_factor_defaults_to_the_context_ratio() -> None:
    cfg = _config({"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 64})
    assert cfg.rope_scaling.factor == 256 / 64


def test_table_precision_at_position_262143() -> None:
    """hi + lo keeps the float64 frequencies: the angle at the last position of a 256K context
    is within 1e-9 rad of the float64 one, and the CPU op's cos / sin within fp32 rounding.
    An fp32 table alone would be ~1e-2 rad off (why the table has a LO row)."""
    cfg = ModelConfig.from_hf(dict(LLAMA, rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25},
                                   head_dim=256, max_position_embeddings=262144))
    freq, _ = inv_freq(cfg)
    pos = 262143
    exact = pos * freq
    table = rope_table(cfg)
    assert np.abs(pos * table_inv_freq(table) - exact).max() < 1e-9
    assert np.abs(pos * freq.astype(np.float32).astype(np.float64) - exact).max() > 1e-3
    x = np.zeros((1, 1, 256), np.float32)
    x[0, 0, :32] = 1.0                                       # out[:32] = cos, out[32:64] = sin
    out = cpu.rope(x, np.array([pos]), table)[0, 0]
    assert np.abs(out[:32] - np.cos(exact)).max() < 1e-7
    assert np.abs(out[32:64] - np.sin(exact)).max() < 1e-7
    assert np.array_equal(out[64:], x[0, 0, 64:])            # dims past rotary_dim untouched


def test_pack_table_amplitude_scales_only_the_rotated_dims() -> None:
    table = pack_table(np.array([0.5, 0.25]), 1.25)
    x = np.ones((1, 1, 6), np.float32)
    out = cpu.rope(x, np.array([0]), table)[0, 0]            # angle 0: cos 1, sin 0
    np.testing.assert_allclose(out, [1.25, 1.25, 1.25, 1.25, 1.0, 1.0])


# --- logits against transformers -----------------------------------------------------------

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"llama-{name}": ("llama", dict(max_position_embeddings=256,
                                       rope_parameters=dict(rope, rope_theta=10000.0)))
       for name, rope in ROPES.items() if name in ("linear", "llama3", "yarn", "yarn-mscale-untruncated")},
    # partial rotary (1/4 of head_dim 32) with mrope sections: text positions make it 1-D RoPE
    "qwen35-yarn": ("qwen35", dict(max_position_embeddings=256, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e7, "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
        "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 2], "mrope_interleaved": True})),
    "qwen35-mrope-half-rotary": ("qwen35", dict(rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
        "mrope_section": [3, 2, 3], "mrope_interleaved": True})),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, tiny_checkpoints) -> tuple[Any, Any]:
    from ninfer_nb import LLM

    kind, kwargs = VARIANTS[request.param]
    path = tiny_checkpoints.get("rope-" + request.param, kind, **kwargs)
    return LLM(str(path), device="cpu", max_context=256, prefill_chunk=16), tiny_checkpoints.hf_model("rope-" + request.param)


def test_logits_match_transformers_past_the_original_context(variant) -> None:
    """100 positions, past original_max_position_embeddings = 32; chunks of 16 (the tolerance of
    tests/engine/test_models_vs_hf.py). Before the rotary table: llama3 5.5e-2, yarn 7.7e-2."""
    llm, hf = variant
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 248000, 100)]
    ours = llm.logits(ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float().numpy()
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max()


def test_greedy_decode_past_the_original_context_matches_transformers(tiny_checkpoints) -> None:
    """Decode steps (one token each, through the KV cache) from position 30 to 70."""
    from ninfer_nb import LLM, SamplingParams

    kind, kwargs = VARIANTS["llama-llama3"]
    path = tiny_checkpoints.get("rope-llama-llama3", kind, **kwargs)
    hf = tiny_checkpoints.hf_model("rope-llama-llama3")
    ids = [int(t) for t in np.random.default_rng(4).integers(0, 248000, 30)]
    result = LLM(str(path), device="cpu", max_context=256).generate(
        ids, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=40, min_new_tokens=40, do_sample=False,
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    assert result.token_ids == out[0, len(ids):].tolist()


# --- refused, with the field named ---------------------------------------------------------

@pytest.mark.parametrize("rope,error,needles", [
    ({"rope_type": "su"}, UnsupportedModelError, ("rope_scaling.rope_type", "'su'", "llama3")),
    ({"type": "dynamic", "factor": 2.0}, UnsupportedModelError, ("rope_scaling.rope_type = dynamic", "graph-safe")),
    ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}, UnsupportedModelError,
     ("rope_scaling.rope_type = longrope",)),
    ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, ModelFormatError, ("low_freq_factor",)),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}, ModelFormatError,
     ("high_freq_factor",)),
    ({"rope_type": "linear"}, ModelFormatError, ("rope_scaling", "factor")),
    ({"rope_type": "linear", "factor": "2"}, ModelFormatError, ("rope_scaling.factor", "'2'")),
    ({"rope_type": "yarn", "factor": -1.0}, ModelFormatError, ("rope_scaling.factor",)),
    ({"rope_type": "yarn", "factor": 4.0, "beta_fast": "fast"}, ModelFormatError, ("rope_scaling.beta_fast",)),
    ({"rope_type": "yarn", "factor": 4.0, "truncate": "no"}, ModelFormatError, ("rope_scaling.truncate",)),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}, ModelFormatError,
     ("original_max_position_embeddings",)),
    ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, UnsupportedModelError,
     ("low_freq_factor", "linear")),
    ({"full_attention": {"rope_type": "default"}}, UnsupportedModelError, ("rope_scaling", "per-layer")),
    ("linear", UnsupportedModelError, ("rope_scaling",)),
])
def test_unsupported_or_malformed_rope_is_refused(rope: Any, error: type, needles: tuple[str, ...]) -> None:
    with pytest.raises(error) as info:
        _config(rope)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


def test_rope_parameters_is_named_when_that_is_the_field() -> None:
    with pytest.raises(UnsupportedModelError, match=r"rope_parameters\.rope_type = dynamic"):
        ModelConfig.from_hf(dict(LLAMA, rope_parameters={"rope_type": "dynamic", "factor": 2.0}))


def test_odd_rotary_dims_are_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor"):
        _config(None, partial_rotary_factor=0.1875)         # 3 of 16 dims


@pytest.mark.parametrize("field", ["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"])
def test_missing_required_field_is_named(field: str) -> None:
    raw = dict(LLAMA)
    del raw[field]
    with pytest.raises(ModelFormatError, match=f"required field '{field}'"):
        ModelConfig.from_hf(raw)
    with pytest.raises(ModelFormatError, match=f"'{field}' must be a positive integer"):
        ModelConfig.from_hf(dict(raw, **{field: "many"}))
    with pytest.raises(ModelFormatError, match=f"'{field}' must be a positive integer"):
        ModelConfig.from_hf(dict(raw, **{field: 0}))


@pytest.mark.parametrize("field,value", [("rms_norm_eps", "small"), ("max_position_embeddings", "long"),
                                         ("rope_theta", "big"), ("head_dim", [16])])
def test_malformed_optional_field_is_a_one_line_error(field: str, value: Any) -> None:
    with pytest.raises(ModelFormatError, match="malformed value") as info:
        ModelConfig.from_hf(dict(LLAMA, **{field: value}))
    assert "\n" not in str(info.value)


def test_qwen35_gdn_fields_are_required() -> None:
    from tests.support.checkpoints import BASE_QWEN35

    raw = dict(BASE_QWEN35, model_type="qwen3_5_text")
    del raw["linear_key_head_dim"]
    with pytest.raises(ModelFormatError, match="'linear_key_head_dim'"):
        ModelConfig.from_hf(raw)


def test_qwen3_next_is_refused_at_config_time() -> None:
    for raw in (dict(LLAMA, model_type="qwen3_next"),
                {"model_type": "qwen3_next", "text_config": dict(LLAMA, model_type="qwen3_next")}):
        with pytest.raises(UnsupportedModelError, match="'qwen3_next' is not supported"):
            ModelConfig.from_hf(raw)


def _cli(model: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ninfer_nb", "--model", str(model), "--device", "cpu",
                           "--prompt", "hi"], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c.pop("num_hidden_layers"), "'num_hidden_layers'"),
    (lambda c: c.update(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
     "rope_parameters.rope_type = dynamic"),
    (lambda c: c.update(model_type="qwen3_next"), "qwen3_next"),
], ids=["missing-field", "dynamic-rope", "qwen3_next"])
def test_cli_refuses_in_one_line(tiny_llama_dir: Path, tmp_path: Path, edit: Any, needle: str) -> None:
    raw = json.loads((tiny_llama_dir / "config.json").read_text())
    edit(raw)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    proc = _cli(tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ninfer: error:") and needle in lines[0], proc.stderr


def test_every_refusal_is_a_ninfer_error() -> None:
    """The CLI and server map NinferError to exit 2 / a refused start; nothing else escapes."""
    for bad in ({"rope_type": "su"}, {"rope_type": "linear"}, 7, [1]):
        with pytest.raises(NinferError):
            _config(bad)  # type: ignore[arg-type]


# --- GGUF: llama.cpp's forms of the same scaling -------------------------------------------

def _llama_cpp_rope_freqs(rope: dict[str, Any], dim: int, base: float) -> np.ndarray:
    """The rope_freqs tensor llama.cpp's convert_hf_to_gguf.py writes for rope_type llama3."""
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    old, low, high = rope["original_max_position_embeddings"], rope["low_freq_factor"], rope["high_freq_factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(rope["factor"])
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def _gguf_of(hf: Any, path: Path, write_gguf, hf_to_gguf, meta: dict[str, Any],
             extra: dict[str, np.ndarray]) -> Path:
    sd = {k: v.detach().numpy() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    c = hf.config
    meta = {"llama.embedding_length": c.hidden_size, "llama.block_count": c.num_hidden_layers,
            "llama.feed_forward_length": c.intermediate_size, "llama.attention.head_count": 4,
            "llama.attention.head_count_kv": 2, "llama.attention.key_length": 16,
            "llama.rope.dimension_count": 16, "llama.rope.freq_base": 10000.0,
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.context_length": 256, **meta}
    tensors = hf_to_gguf(sd, arch="llama", n_heads=4, n_kv_heads=2)
    tensors.update({name: (array, None) for name, array in extra.items()})
    return write_gguf(path, "llama", meta, tensors)


@pytest.mark.parametrize("name", ["llama3", "linear"])
def test_gguf_rope_scaling_matches_transformers(tmp_path: Path, write_gguf, hf_to_gguf, name: str,
                                                tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama 3 scaling as llama.cpp stores it (the rope_freqs tensor) and linear scaling as
    rope.scaling metadata give transformers' logits past the original context."""
    import ninfer_nb.llm as llm_module
    from ninfer_nb import LLM
    from ninfer_nb.chat.tokenizer import Tokenizer
    from ninfer_nb.models.loader import load_checkpoint
    from tests.support.checkpoints import build_hf_model

    checkpoints: list[Any] = []

    def load(*args: Any, **kwargs: Any) -> Any:            # the file has no tokenizer: lend one
        ckpt = load_checkpoint(*args, **kwargs)
        ckpt.tokenizer = Tokenizer.from_dir(tiny_llama_dir)
        checkpoints.append(ckpt)
        return ckpt

    monkeypatch.setattr(llm_module, "load_checkpoint", load)

    rope = ROPES[name]
    hf = build_hf_model("llama", max_position_embeddings=256, rope_parameters=dict(rope, rope_theta=10000.0))
    if name == "llama3":
        meta, extra = {}, {"rope_freqs.weight": _llama_cpp_rope_freqs(rope, 16, 10000.0)}
    else:
        meta, extra = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": rope["factor"]}, {}
    path = _gguf_of(hf, tmp_path / f"{name}.gguf", write_gguf, hf_to_gguf, meta, extra)
    llm = LLM(str(path), device="cpu", max_context=256, prefill_chunk=16)
    assert "rope_freqs.weight" not in checkpoints[0].metadata["unmapped_tensors"]
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 248000, 100)]
    ours = llm.logits(ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float().numpy()
    assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max()


def test_gguf_other_rope_scaling_is_refused(tmp_path: Path, write_gguf, hf_to_gguf) -> None:
    from ninfer_nb.models.gguf_loader import load_gguf
    from tests.support.checkpoints import build_hf_model

    hf = build_hf_model("llama", max_position_embeddings=256)
    meta = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}
    path = _gguf_of(hf, tmp_path / "yarn.gguf", write_gguf, hf_to_gguf, meta, {})
    with pytest.raises(UnsupportedModelError, match=r"llama\.rope\.scaling\.type = yarn"):
        load_gguf(path)
    bad = _gguf_of(hf, tmp_path / "bad.gguf", write_gguf, hf_to_gguf, {},
                   {"rope_freqs.weight": np.ones(5, np.float32)})
    with pytest.raises(ModelFormatError, match="rope_freqs"):
        load_gguf(bad)
    longrope = _gguf_of(hf, tmp_path / "longrope.gguf", write_gguf, hf_to_gguf, {},
                        {"rope_factors_long.weight": np.ones(8, np.float32)})
    with pytest.raises(UnsupportedModelError, match="rope_factors_long"):
        load_gguf(longrope)
