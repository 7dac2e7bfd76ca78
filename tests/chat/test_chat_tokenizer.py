from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path

import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from ninfer_nb.chat import Tokenizer
from ninfer_nb.errors import ModelFormatError
from tests.support.qwen_tokenizer import SPECIAL_TOKENS, special_token_ids

PIECES = [
    "Hello", " world", "  ", "\n", "\r\n", "\t", "123456", "3.14159", "def f(x):\n    return x**2\n",
    "日本語のテキスト", "中文字符", "한국어", "emoji 😀🎉👨‍👩‍👧", "Ünïcödé", "e\u0301", "A\u0308", "'s",
    "'LL", " don't", "{\"a\": [1, 2]}", "   \n\n  ", "العربية", "हिन्दी", "\u200b", "...", "!!!", "$$",
    "x" * 40, " " * 17, "\u00a0", "<b>html</b>", "C:\\path\\file.txt", "🇫🇷", "ﬁ", "Ⅻ", "\x00",
]


# Random code points exclude combining marks: runs of marks with different combining classes are
# reordered by NFC, and the Rust and Python Unicode tables disagree on a few recent marks.
STABLE_CHARS = [chr(c) for c in range(32, 0x3000) if unicodedata.combining(chr(c)) == 0]


def varied_strings(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8))) for _ in range(n)]
    out += ["".join(rng.choice(STABLE_CHARS) for _ in range(rng.randint(1, 30))) for _ in range(80)]
    return out


def test_encoding_matches_tiktoken_reference(qwen_tok: Tokenizer, tiktoken_qwen) -> None:
    for text in varied_strings(300) + [Path(__file__).read_text(encoding="utf-8")]:
        assert qwen_tok.encode(text) == tiktoken_qwen.encode(text), repr(text)


def test_round_trip_is_nfc_identity(qwen_tok: Tokenizer) -> None:
    for text in varied_strings(200, seed=1):
        assert qwen_tok.decode(qwen_tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_special_tokens_have_their_ids(qwen_tok: Tokenizer) -> None:
    ids = special_token_ids()
    assert ids["<|endoftext|>"] == 248044
    assert ids["<|im_start|>"] == 248045 and ids["<|im_end|>"] == 248046
    assert ids["<think>"] == 248068 and ids["</think>"] == 248069
    assert ids["<|vision_start|>"] == 248053 and ids["<|image_pad|>"] == 248056
    for token, token_id in ids.items():
        assert qwen_tok.token_to_id(token) == token_id
        assert qwen_tok.id_to_token(token_id) == token
        assert qwen_tok.encode(token) == [token_id]
    assert len(ids) == len(SPECIAL_TOKENS) == 33


def test_special_tokens_inside_text(qwen_tok: Tokenizer) -> None:
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nok</think>"
    ids = qwen_tok.encode(text)
    assert ids[0] == 248045 and 248046 in ids and ids[-1] == 248069
    assert ids.count(248045) == 2
    assert qwen_tok.decode(ids) == text
    # skip_special_tokens drops the ChatML markers but keeps the reasoning tags
    assert qwen_tok.decode(ids, skip_special_tokens=True) == "user\nhi\nassistant\n<think>\nok</think>"


def test_properties(qwen_tok: Tokenizer) -> None:
    assert qwen_tok.vocab_size == 248077
    assert qwen_tok.eos_token_ids == (248046, 248044)
    assert qwen_tok.bos_token_id is None
    assert qwen_tok.encode("hi", add_special_tokens=True) == qwen_tok.encode("hi")
    assert {248044, 248045, 248046} <= qwen_tok.special_token_ids
    assert 248068 not in qwen_tok.special_token_ids  # <think> is text-like
    assert qwen_tok.chat_template is not None and "<tool_call>" in qwen_tok.chat_template
    assert qwen_tok.token_to_id("no-such-token-xyz") is None
    assert qwen_tok.id_to_token(10**9) is None


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_corrupt_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", ')
    with pytest.raises(ModelFormatError) as info:
        Tokenizer.from_dir(tmp_path)
    assert "tokenizer.json" in info.value.message and "\n" not in info.value.message


def test_corrupt_config(tmp_path: Path) -> None:
    _tiny_backend().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="tokenizer_config.json"):
        Tokenizer.from_dir(tmp_path)


def test_template_file_precedence_and_eos_int(tmp_path: Path) -> None:
    _tiny_backend().save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": "C"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.chat_template == "C"
    assert tok.eos_token_ids == (1, 0)  # config's eos_token first, then generation's
    templates = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": templates}))
    assert Tokenizer.from_dir(tmp_path).chat_template == "D"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert Tokenizer.from_dir(tmp_path).chat_template == "J"


def _tiny_backend() -> tokenizers.Tokenizer:
    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "ab": 4, "[UNK]": 5}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["<s>", "</s>"])
    return backend


def test_constructor_is_general_and_adds_bos_on_request() -> None:
    tok = Tokenizer(_tiny_backend(), eos_token_ids=[1], bos_token_id=0, add_bos=True, bos_token="<s>", eos_token="</s>")
    assert tok.encode("ab b") == [4, 3]
    assert tok.encode("ab b", add_special_tokens=True) == [0, 4, 3]
    assert tok.encode("<s> ab", add_special_tokens=True) == [0, 4]  # no double BOS
    assert tok.special_token_ids == frozenset({0, 1})
    assert tok.eos_token_ids == (1,) and tok.vocab_size == 6 and tok.chat_template is None


def test_from_dir_reads_bos_and_config_only_tokens(tmp_path: Path) -> None:
    _tiny_backend().save(str(tmp_path / "tokenizer.json"))
    config = {
        "bos_token": {"content": "<s>"},
        "eos_token": "</s>",
        "add_bos_token": True,
        "added_tokens_decoder": {
            "6": {"content": "<extra_a>", "special": True},
            "7": {"content": "<extra_b>", "special": False},
            "9": {"content": "<gap>", "special": True},
        },
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.bos_token_id == 0 and tok.encode("a", add_special_tokens=True) == [0, 2]
    assert tok.token_to_id("<extra_a>") == 6 and tok.token_to_id("<extra_b>") == 7
    assert tok.token_to_id("<gap>") is None
    assert 6 in tok.special_token_ids and 7 not in tok.special_token_ids
    assert tok.encode("a <extra_b> b") == [2, 7, 3]
    assert tok.vocab_size == 8


def test_no_eos_is_a_format_error(tmp_path: Path) -> None:
    _tiny_backend().save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ModelFormatError, match="no eos"):
        Tokenizer.from_dir(tmp_path)
