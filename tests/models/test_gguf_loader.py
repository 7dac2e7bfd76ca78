"""load_gguf on small GGUF files written here: config, names, dequantization, errors."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from ninfer_nb.errors import ModelFormatError, ModelNotFoundError, UnsupportedModelError
from ninfer_nb.models.gguf_loader import hf_tensor_name, load_gguf, unpermute_rope_rows
from ninfer_nb.quant.rows import values

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, VOCAB = 256, 4, 2, 64, 512, 2, 32


def tiny_weights(
    rng: np.random.Generator, *, tied: bool = True, head_dim: int = HEAD_DIM,
    qk_norm: bool = False, bias: bool = False,
) -> dict[str, np.ndarray]:
    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN), "model.norm.weight": 1 + rand(HIDDEN)}
    if not tied:
        w["lm_head.weight"] = rand(VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w |= {
            p + "input_layernorm.weight": 1 + rand(HIDDEN),
            p + "post_attention_layernorm.weight": 1 + rand(HIDDEN),
            p + "self_attn.q_proj.weight": rand(HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": rand(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": rand(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": rand(HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": rand(FFN, HIDDEN),
            p + "mlp.up_proj.weight": rand(FFN, HIDDEN),
            p + "mlp.down_proj.weight": rand(HIDDEN, FFN),
        }
        if qk_norm:
            w[p + "self_attn.q_norm.weight"] = 1 + rand(head_dim)
            w[p + "self_attn.k_norm.weight"] = 1 + rand(head_dim)
        if bias:
            w[p + "self_attn.q_proj.bias"] = rand(HEADS * head_dim)
            w[p + "self_attn.k_proj.bias"] = rand(KV_HEADS * head_dim)
            w[p + "self_attn.v_proj.bias"] = rand(KV_HEADS * head_dim)
    return w


def metadata(arch: str = "llama", **extra: object) -> dict[str, object]:
    return {
        f"{arch}.embedding_length": HIDDEN,
        f"{arch}.block_count": LAYERS,
        f"{arch}.feed_forward_length": FFN,
        f"{arch}.attention.head_count": HEADS,
        f"{arch}.attention.head_count_kv": KV_HEADS,
        f"{arch}.rope.freq_base": 500000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{arch}.context_length": 2048,
        **extra,
    }


@pytest.fixture
def tiny_llama(tmp_path: Path, write_gguf, hf_to_gguf) -> tuple[Path, dict[str, np.ndarray]]:
    w = tiny_weights(np.random.default_rng(0))
    tensors = hf_to_gguf(w, arch="llama", n_heads=HEADS, n_kv_heads=KV_HEADS)
    return write_gguf(tmp_path / "tiny-llama.Q8_0.gguf", "llama", metadata(), tensors), w


def test_config_from_metadata(tiny_llama: tuple[Path, dict[str, np.ndarray]]) -> None:
    ckpt = load_gguf(tiny_llama[0])
    c = ckpt.config
    assert (c.architecture, c.model_type) == ("llama", "llama")
    assert (c.hidden_size, c.num_layers, c.intermediate_size) == (HIDDEN, LAYERS, FFN)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.rotary_dim) == (HEADS, KV_HEADS, 64, 64)
    assert c.rope_theta == 500000.0
    assert c.rms_norm_eps == pytest.approx(1e-5)
    assert c.max_position_embeddings == 2048
    assert c.vocab_size == VOCAB                       # from token_embd: no vocab, no tokenizer
    assert c.tie_word_embeddings and "lm_head.weight" not in ckpt.weights
    assert ckpt.tokenizer is None
    assert ckpt.name == "tiny-llama"                   # quant suffix dropped
    assert ckpt.metadata["gguf_architecture"] == "llama"


def test_f32_weights_are_exact_under_hf_names(tiny_llama) -> None:
    path, w = tiny_llama
    ckpt = load_gguf(path)
    assert sorted(ckpt.weights) == sorted(w)
    for name, ref in w.items():
        got = values(ckpt.weights[name])
        assert got.dtype == np.float32 and got.shape == ref.shape, name
        np.testing.assert_array_equal(got, ref, err_msg=name)


def test_f16_weights_are_exact(tmp_path: Path, write_gguf, hf_to_gguf) -> None:
    w = tiny_weights(np.random.default_rng(1), tied=False)
    tensors = hf_to_gguf(w, arch="llama", n_heads=HEADS, n_kv_heads=KV_HEADS, qtype=Q.F16)
    ckpt = load_gguf(write_gguf(tmp_path / "m.gguf", "llama", metadata(), tensors))
    assert not ckpt.config.tie_word_embeddings
    for name, ref in w.items():
        expect = ref if ref.ndim == 1 else ref.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(values(ckpt.weights[name]), expect, err_msg=name)


def _error_bound(ref: np.ndarray, qtype: Q) -> np.ndarray:
    """Per-element worst-case quantization error of one 32-wide block format, with slack."""
    blocks = ref.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    span = blocks.max(axis=1, keepdims=True) - blocks.min(axis=1, keepdims=True)
    bound = {
        Q.Q8_0: amax / 127 * 0.6,
        Q.Q4_0: amax / 8 * 1.05,        # can clip one step at the positive end
        Q.Q5_0: amax / 16 * 1.05,
        Q.Q4_1: span / 15 * 0.6,
        Q.Q5_1: span / 31 * 0.6,
        Q.BF16: np.abs(blocks) * 2.0**-8,
    }[qtype]
    return np.broadcast_to(bound, blocks.shape).reshape(ref.shape) + 1e-7


@pytest.mark.parametrize(
    "qtype", [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16], ids=lambda q: q.name
)
def test_quantized_weights_within_format_error(
    tmp_path: Path, write_gguf, hf_to_gguf, qtype: Q
) -> None:
    w = tiny_weights(np.random.default_rng(2))
    tensors = hf_to_gguf(w, arch="llama", n_heads=HEADS, n_kv_heads=KV_HEADS, qtype=qtype)
    ckpt = load_gguf(write_gguf(tmp_path / "m.gguf", "llama", metadata(), tensors))
    assert ckpt.metadata["tensor_types"][qtype.name] == 1 + 7 * LAYERS
    for name, ref in w.items():
        got = values(ckpt.weights[name])
        if ref.ndim == 1:
            np.testing.assert_array_equal(got, ref)
            continue
        err = np.abs(got - ref)
        assert (err <= _error_bound(ref, qtype)).all(), (name, float(err.max()))
        assert err.max() > 0 or qtype == Q.BF16, name    # it really went through the format


def test_qwen3_arch_maps_qk_norm_and_keeps_rows(tmp_path: Path, write_gguf, hf_to_gguf) -> None:
    w = tiny_weights(np.random.default_rng(3), head_dim=32, qk_norm=True)
    tensors = hf_to_gguf(w, arch="qwen3", n_heads=HEADS, n_kv_heads=KV_HEADS)
    meta = metadata("qwen3", **{"qwen3.attention.key_length": 32,
                                "qwen3.attention.value_length": 32})
    ckpt = load_gguf(write_gguf(tmp_path / "q3.gguf", "qwen3", meta, tensors))
    assert (ckpt.config.model_type, ckpt.config.head_dim, ckpt.config.qk_norm) == ("qwen3", 32, True)
    for name, ref in w.items():                           # no Q/K permutation for qwen3
        np.testing.assert_array_equal(values(ckpt.weights[name]), ref, err_msg=name)


def test_qwen2_arch_loads_attention_biases(tmp_path: Path, write_gguf, hf_to_gguf) -> None:
    w = tiny_weights(np.random.default_rng(4), bias=True)
    tensors = hf_to_gguf(w, arch="qwen2", n_heads=HEADS, n_kv_heads=KV_HEADS)
    ckpt = load_gguf(write_gguf(tmp_path / "q2.gguf", "qwen2", metadata("qwen2"), tensors))
    assert ckpt.config.attention_bias and ckpt.config.model_type == "qwen2"
    np.testing.assert_array_equal(
        values(ckpt.weights["model.layers.1.self_attn.k_proj.bias"]), w["model.layers.1.self_attn.k_proj.bias"]
    )


def test_unpermute_inverts_the_llama_cpp_layout() -> None:
    rows = np.arange(2 * 8, dtype=np.float32)          # 2 heads, head_dim 8
    # llama.cpp layout of head 0: HF rows 0,4,1,5,2,6,3,7 (pairs interleaved)
    gguf_rows = np.array([0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15], np.float32)
    np.testing.assert_array_equal(unpermute_rope_rows(gguf_rows, 2), rows)
    assert hf_tensor_name("blk.7.ffn_down.weight") == "model.layers.7.mlp.down_proj.weight"
    assert hf_tensor_name("rope_freqs.weight") is None


def test_unmapped_tensors_are_reported(tmp_path: Path, write_gguf, hf_to_gguf) -> None:
    tensors = hf_to_gguf(tiny_weights(np.random.default_rng(5)), arch="llama",
                         n_heads=HEADS, n_kv_heads=KV_HEADS)
    tensors["blk.0.attn_rot_embd.weight"] = (np.ones(32, np.float32), None)   # (rope_freqs is read)
    ckpt = load_gguf(write_gguf(tmp_path / "m.gguf", "llama", metadata(), tensors))
    assert ckpt.metadata["unmapped_tensors"] == ["blk.0.attn_rot_embd.weight"]


def test_progress_bar_only_when_asked(tiny_llama, capsys: pytest.CaptureFixture[str]) -> None:
    load_gguf(tiny_llama[0])
    assert capsys.readouterr().err == ""
    load_gguf(tiny_llama[0], show_progress=True)
    err = capsys.readouterr().err                      # a bar only on a terminal; always a summary
    assert "loading tiny-llama.Q8_0.gguf" in err and err.endswith(" s)\n")


# ---- errors ------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        load_gguf(tmp_path / "nope.gguf")


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_text('{"this": "is json"}')
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        load_gguf(path)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        load_gguf(empty)


@pytest.mark.parametrize("keep", [0.003, 0.02, 0.3, 0.999])
def test_truncated_file(tiny_llama, tmp_path: Path, keep: float) -> None:
    data = tiny_llama[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(8, int(len(data) * keep))])
    with pytest.raises(ModelFormatError) as info:
        load_gguf(cut)
    message = str(info.value)
    assert "\n" not in message and str(cut) in message
    assert "truncated" in message


def test_corrupt_header(tiny_llama, tmp_path: Path) -> None:
    data = bytearray(tiny_llama[0].read_bytes())
    data[4:8] = (99).to_bytes(4, "little")              # unknown GGUF version
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="corrupt"):
        load_gguf(bad)
    data = bytearray(tiny_llama[0].read_bytes())
    data[24:32] = (1 << 40).to_bytes(8, "little")       # first key's length: far past the end
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="corrupt or truncated"):
        load_gguf(bad)


def test_unsupported_architecture(tmp_path: Path, write_gguf) -> None:
    tensors = {"token_embd.weight": (np.zeros((VOCAB, HIDDEN), np.float32), None)}
    for arch in ("qwen3next", "gpt2"):
        path = write_gguf(tmp_path / f"{arch}.gguf", arch, metadata(arch), tensors)
        with pytest.raises(UnsupportedModelError, match=repr(arch)):
            load_gguf(path)


def test_unsupported_tensor_type(tmp_path: Path, write_gguf, hf_to_gguf) -> None:
    tensors = hf_to_gguf(tiny_weights(np.random.default_rng(6)), arch="llama",
                         n_heads=HEADS, n_kv_heads=KV_HEADS)
    q2k_bytes = np.zeros((VOCAB, HIDDEN // 256 * 84), np.uint8)   # one Q2_K block per row
    tensors["token_embd.weight"] = (q2k_bytes, Q.Q2_K)
    path = write_gguf(tmp_path / "m.gguf", "llama", metadata(), tensors)
    with pytest.raises(UnsupportedModelError, match=r"'token_embd\.weight'.*Q2_K"):
        load_gguf(path)


def test_missing_metadata_key(tmp_path: Path, write_gguf, hf_to_gguf) -> None:
    tensors = hf_to_gguf(tiny_weights(np.random.default_rng(7)), arch="llama",
                         n_heads=HEADS, n_kv_heads=KV_HEADS)
    meta = metadata()
    del meta["llama.block_count"]
    path = write_gguf(tmp_path / "m.gguf", "llama", meta, tensors)
    with pytest.raises(ModelFormatError, match=r"llama\.block_count"):
        load_gguf(path)


def test_shapes_must_match_metadata(tmp_path: Path, write_gguf, hf_to_gguf) -> None:
    tensors = hf_to_gguf(tiny_weights(np.random.default_rng(8)), arch="llama",
                         n_heads=HEADS, n_kv_heads=KV_HEADS)
    meta = metadata(**{"llama.attention.head_count_kv": 4})   # k_proj has rows for 2
    path = write_gguf(tmp_path / "m.gguf", "llama", meta, tensors)
    with pytest.raises(ModelFormatError, match=r"k_proj\.weight has shape \(128, 256\)"):
        load_gguf(path)
    del tensors["blk.1.attn_v.weight"]
    path = write_gguf(tmp_path / "m2.gguf", "llama", metadata(), tensors)
    with pytest.raises(ModelFormatError, match=r"layers\.1\.self_attn\.v_proj\.weight is missing"):
        load_gguf(path)
