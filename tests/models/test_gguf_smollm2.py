"""The real default model: SmolLM2-135M-Instruct Q4_1 GGUF (downloaded once per machine).

The expected token ids were produced by transformers' own GGUF tokenizer conversion of the same
file (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), an implementation independent of
ours; the Q/K rows are compared with transformers' GGUF tensor processor for Llama.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from ninfer_nb.chat.template import format_chat
from ninfer_nb.models.checkpoint import LoadedCheckpoint
from ninfer_nb.models.gguf_loader import load_gguf
from ninfer_nb.models.weights import QuantizedWeight
from ninfer_nb.pull import ensure_default_model
from ninfer_nb.quant.rows import values

KNOWN_IDS = {
    "Hello world!": [19556, 905, 17],
    "12345 apples": [33, 34, 35, 36, 37, 13855],
    "<|im_start|>user\nhi<|im_end|>\n": [1, 4093, 198, 6004, 2, 198],
    "  spaced   out\n\nnew": [216, 23861, 256, 578, 198, 198, 2241],
    "naïve café 😀": [3546, 46494, 37366, 40303, 218],
}


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return ensure_default_model(show_progress=False)


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> LoadedCheckpoint:
    return load_gguf(smollm2_path)


def test_config(smollm2: LoadedCheckpoint) -> None:
    c = smollm2.config
    assert (c.architecture, c.num_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.rotary_dim) == (9, 3, 64, 64)
    assert c.vocab_size == 49152 and c.tie_word_embeddings
    assert c.rope_theta == 100000.0 and c.rms_norm_eps == pytest.approx(1e-5)
    assert c.max_position_embeddings == 8192
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2,))
    assert smollm2.name == "SmolLM2-135M-Instruct"


def test_weights(smollm2: LoadedCheckpoint) -> None:
    w = smollm2.weights
    assert len(w) == 2 + 30 * 9 and "lm_head.weight" not in w
    assert w["model.embed_tokens.weight"].shape == (49152, 576)
    assert w["model.layers.0.self_attn.q_proj.weight"].shape == (576, 576)
    assert w["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert w["model.layers.29.mlp.down_proj.weight"].shape == (576, 1536)
    quantized = [a for a in w.values() if isinstance(a, QuantizedWeight)]
    assert sorted({q.format.name for q in quantized}) == ["int4-g32-min", "int8-g32"]
    assert len(quantized) == 211 and isinstance(w["model.embed_tokens.weight"], QuantizedWeight)
    assert all(a.dtype == np.float32 and np.isfinite(a).all() for a in w.values()
               if not isinstance(a, QuantizedWeight))
    assert smollm2.metadata["tensor_types"] == {"Q8_0": 1, "Q4_1": 210, "F32": 61}


def test_qk_rows_match_transformers_gguf_processor(
    smollm2: LoadedCheckpoint, smollm2_path: Path
) -> None:
    pytest.importorskip("torch")
    utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    processor = utils.LlamaTensorProcessor(config={"num_attention_heads": 9,
                                                  "num_key_value_heads": 3})
    tensors = {t.name: t for t in GGUFReader(smollm2_path).tensors}
    for layer in (0, 17, 29):
        for part, hf in (("attn_q", "q_proj"), ("attn_k", "k_proj")):
            name = f"blk.{layer}.{part}.weight"
            raw = dequantize(tensors[name].data, tensors[name].tensor_type)
            theirs = processor.process(weights=raw, name=name).weights
            ours = values(smollm2.weights[f"model.layers.{layer}.self_attn.{hf}.weight"])
            np.testing.assert_array_equal(ours, theirs, err_msg=name)


def test_tokenizer_known_ids_and_round_trip(smollm2: LoadedCheckpoint) -> None:
    tok = smollm2.tokenizer
    assert tok is not None
    for text, ids in KNOWN_IDS.items():
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == text
    for text in ("def f(x):\n    return x**2  # ünïcödé", "日本語のテキスト", "\t\ttabs\r\n"):
        assert tok.decode(tok.encode(text)) == text
    assert (tok.bos_token_id, tok.eos_token_ids, tok.add_bos) == (1, (2,), False)
    assert (tok.bos_token, tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi")   # no BOS for SmolLM2
    assert tok.vocab_size == 49152


def test_chat_template_renders_special_tokens_as_single_ids(smollm2: LoadedCheckpoint) -> None:
    tok = smollm2.tokenizer
    assert tok is not None and tok.chat_template and "<|im_start|>" in tok.chat_template
    text = format_chat(tok, [{"role": "user", "content": "What is 2+2?"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(text)
    assert ids.count(1) == 3 and ids.count(2) == 2        # <|im_start|> x3, <|im_end|> x2
    assert ids[:2] == [1, 9690]                            # <|im_start|> "system"
    assert tok.decode(ids) == text
