"""tokenizer_from_gguf on small byte-level BPE vocabularies built here, and via load_gguf."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers.pre_tokenizers import ByteLevel

from ninfer_nb.errors import ModelFormatError, UnsupportedModelError
from ninfer_nb.models.gguf_loader import load_gguf
from ninfer_nb.models.gguf_tokenizer import backend_from_gguf, tokenizer_from_gguf

BYTES = sorted(ByteLevel.alphabet())             # the 256 byte-level symbols
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot|>"]
USER = ["<tool_call>"]
MERGES = ["Ġ t", "h e", "Ġt he", "l l", "ll o", "1 2", "12 3"]


def vocab_fields(pre: str = "default", **extra: Any) -> dict[str, Any]:
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = SPECIALS + BYTES + merged + USER
    types = [3] * len(SPECIALS) + [1] * (len(BYTES) + len(merged)) + [4] * len(USER)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        **extra,
    }


def ids_of(fields: dict[str, Any], *tokens: str) -> list[int]:
    return [fields["tokenizer.ggml.tokens"].index(t) for t in tokens]


def test_bpe_merges_specials_and_round_trip() -> None:
    fields = vocab_fields(**{"tokenizer.ggml.eot_token_id": 3})
    tok = tokenizer_from_gguf(fields)
    assert tok.encode(" the hello") == ids_of(fields, "Ġthe", "Ġ", "he", "llo")
    text = "<|im_start|>user\n the<tool_call><|im_end|>"
    ids = tok.encode(text)
    assert ids[0] == 1 and ids[-1] == 2 and ids_of(fields, "<tool_call>")[0] in ids
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode("ünïcode ✓ 😀")) == "ünïcode ✓ 😀"
    assert tok.eos_token_ids == (2, 3)                      # eos then end-of-turn
    assert (tok.bos_token, tok.eos_token, tok.add_bos) == ("<|im_start|>", "<|im_end|>", False)
    assert 0 in tok.special_token_ids and ids_of(fields, "<tool_call>")[0] not in tok.special_token_ids


def test_add_bos_and_chat_template() -> None:
    tok = tokenizer_from_gguf(vocab_fields(**{"tokenizer.ggml.add_bos_token": True,
                                              "tokenizer.chat_template": "{{ messages }}"}))
    assert tok.encode("he", add_special_tokens=True)[0] == 1
    assert tok.encode("he")[0] != 1
    assert tok.chat_template == "{{ messages }}"


@pytest.mark.parametrize(
    ("pre", "text", "pieces"),
    [
        ("default", "abc 12345", ["abc", "Ġ12345"]),
        ("smollm", "abc 123", ["abc", "Ġ", "1", "2", "3"]),
        ("llama3", "abc 12345", ["abc", "Ġ", "123", "45"]),
        ("qwen2", "abc 123", ["abc", "Ġ", "1", "2", "3"]),
    ],
)
def test_pre_tokenizer_per_gguf_pre(pre: str, text: str, pieces: list[str]) -> None:
    backend = backend_from_gguf(vocab_fields(pre))
    assert [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(text)] == pieces


def test_digits_merge_only_where_the_split_allows() -> None:
    fields = vocab_fields("default")
    assert tokenizer_from_gguf(fields).encode("123") == ids_of(fields, "123")
    smol = vocab_fields("smollm")
    assert tokenizer_from_gguf(smol).encode("123") == ids_of(smol, "1", "2", "3")


def test_unsupported_tokenizers() -> None:
    with pytest.raises(UnsupportedModelError, match="'llama'"):
        tokenizer_from_gguf(vocab_fields(**{"tokenizer.ggml.model": "llama"}))
    with pytest.raises(UnsupportedModelError, match="pre-tokenizer 'mystery'"):
        tokenizer_from_gguf(vocab_fields("mystery"))


def test_malformed_vocabularies() -> None:
    with pytest.raises(ModelFormatError, match="merge #1"):
        tokenizer_from_gguf(vocab_fields(**{"tokenizer.ggml.merges": ["Ġ t", "broken"]}))
    with pytest.raises(ModelFormatError, match="bos_token_id=99999"):
        tokenizer_from_gguf(vocab_fields(**{"tokenizer.ggml.bos_token_id": 99999}))
    fields = vocab_fields()
    fields["tokenizer.ggml.token_type"] = fields["tokenizer.ggml.token_type"][:-1]
    with pytest.raises(ModelFormatError, match="token types"):
        tokenizer_from_gguf(fields)


def test_load_gguf_builds_the_tokenizer(tmp_path: Path, write_gguf) -> None:
    fields = vocab_fields("smollm", **{"tokenizer.chat_template": "{{ bos_token }}"})
    meta: dict[str, Any] = {
        "llama.embedding_length": 32, "llama.block_count": 1, "llama.feed_forward_length": 64,
        "llama.attention.head_count": 2, **fields,
    }
    n = len(fields["tokenizer.ggml.tokens"])
    tensors = {"token_embd.weight": (np.zeros((n, 32), np.float32), None),   # + one layer's q / k / v
               **{f"blk.0.attn_{p}.weight": (np.zeros((32, 32), np.float32), None) for p in "qkv"}}
    ckpt = load_gguf(write_gguf(tmp_path / "tok.gguf", "llama", meta, tensors))
    tok = ckpt.tokenizer
    assert tok is not None and tok.chat_template == "{{ bos_token }}"
    assert ckpt.config.vocab_size == n and ckpt.config.eos_token_ids == (2,)
    assert tok.decode(tok.encode("<|im_start|> the")) == "<|im_start|> the"
