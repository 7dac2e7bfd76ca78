from __future__ import annotations

import random
from typing import Sequence

import pytest

from ninfer_nb.chat import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "Hello, world! 😀🎉 emoji 👨‍👩‍👧 family and flags 🇫🇷🇯🇵",
    "日本語のテキストと中文字符，한국어 문장도 있어요。",
    "def f(x):\n    return x ** 2  # ünïcödé ✓\n",
    "<|im_start|>assistant\n<think>\nhmm 🤔\n</think>\n\nOK<|im_end|>",
    "mixed 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and math ∑∫√ and a real replacement char \ufffd here",
]


def byte_token_ids(tok: Tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte, so every multi-byte character is split across tokens."""
    table = _byte_to_unicode()
    ids = [tok.token_to_id(table[b]) for b in text.encode("utf-8")]
    assert all(i is not None for i in ids)
    return ids  # type: ignore[return-value]


def _byte_to_unicode() -> dict[int, str]:
    from tests.support.qwen_tokenizer import _byte_to_unicode as table

    return table()


def stream(detok: IncrementalDetokenizer, ids: Sequence[int]) -> list[str]:
    return [detok.push(i) for i in ids] + [detok.flush()]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_split_characters_never_emit_broken_utf8(qwen_tok: Tokenizer, text: str) -> None:
    ids = byte_token_ids(qwen_tok, text)
    detok = IncrementalDetokenizer(qwen_tok)
    pieces = stream(detok, ids)
    assert "".join(pieces) == qwen_tok.decode(ids) == text
    assert detok.text == text
    if "\ufffd" not in text:
        assert all("\ufffd" not in p for p in pieces)
    # each emoji arrives whole: no piece ends in the middle of a surrogate-free character sequence
    assert sum(1 for p in pieces if p) > 1


def test_real_tokenization_and_random_ids(qwen_tok: Tokenizer) -> None:
    rng = random.Random(0)
    sequences = [qwen_tok.encode(t) for t in TEXTS]
    for _ in range(30):  # random mixtures of whole tokens and single bytes
        text = rng.choice(TEXTS)
        ids: list[int] = []
        for part in text.split(" "):
            ids += byte_token_ids(qwen_tok, part + " ") if rng.random() < 0.5 else qwen_tok.encode(part + " ")
        sequences.append(ids)
    sequences += [[rng.randrange(0, 248077) for _ in range(200)] for _ in range(5)]
    for ids in sequences:
        for skip in (False, True):
            detok = IncrementalDetokenizer(qwen_tok, skip_special_tokens=skip)
            assert "".join(stream(detok, ids)) == qwen_tok.decode(ids, skip_special_tokens=skip)


def test_skip_special_tokens(qwen_tok: Tokenizer) -> None:
    ids = qwen_tok.encode(TEXTS[3])
    detok = IncrementalDetokenizer(qwen_tok, skip_special_tokens=True)
    assert "".join(stream(detok, ids)) == "assistant\n<think>\nhmm 🤔\n</think>\n\nOK"


def test_invalid_bytes_are_released_not_held_forever(qwen_tok: Tokenizer) -> None:
    lone = qwen_tok.token_to_id(_byte_to_unicode()[0x80])
    detok = IncrementalDetokenizer(qwen_tok)
    out = "".join(detok.push(lone) for _ in range(10))
    assert out.startswith("\ufffd") and out == "\ufffd" * len(out) and len(out) >= 8
    assert out + detok.flush() == "\ufffd" * 10
    assert detok.flush() == ""


def test_incomplete_character_is_held_until_flush(qwen_tok: Tokenizer) -> None:
    ids = byte_token_ids(qwen_tok, "a😀")
    detok = IncrementalDetokenizer(qwen_tok)
    assert detok.push(ids[0]) == "a"
    assert [detok.push(i) for i in ids[1:3]] == ["", ""]
    assert detok.flush() == "\ufffd"  # cut off mid-character: one replacement char, never bytes
    detok = IncrementalDetokenizer(qwen_tok)
    assert [detok.push(i) for i in ids] == ["a", "", "", "", "😀"]


class CountingTokenizer(Tokenizer):
    """The real Qwen tokenizer, recording how many ids each decode call sees."""

    def __init__(self, inner: Tokenizer) -> None:
        super().__init__(inner.backend, eos_token_ids=inner.eos_token_ids)
        self.max_window = 0

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        self.max_window = max(self.max_window, len(ids))
        return super().decode(ids, skip_special_tokens)


def test_per_token_work_does_not_grow_with_length(qwen_tok: Tokenizer) -> None:
    counting = CountingTokenizer(qwen_tok)
    ids = qwen_tok.encode(" ".join(TEXTS) * 40)
    ids += byte_token_ids(qwen_tok, "😀" * 50)
    assert len(ids) > 2000
    detok = IncrementalDetokenizer(counting)
    assert "".join(stream(detok, ids)) == qwen_tok.decode(ids)
    assert counting.max_window <= 8


def sentencepiece_style() -> tuple[Tokenizer, dict[str, int]]:
    """A Llama/SentencePiece-style tokenizer: ▁ for spaces, <0xNN> byte fallback, strip first space."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, pre_tokenizers
    from tokenizers.models import BPE

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for word in ["▁", "▁hello", "▁world", "h", "e", "l", "o"]:
        vocab[word] = len(vocab)
    backend = Backend(BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens(["<s>", "</s>"])
    return Tokenizer(backend, eos_token_ids=[2], bos_token_id=1, add_bos=True), vocab


def test_sentencepiece_style_spaces_and_byte_fallback() -> None:
    tok, vocab = sentencepiece_style()
    emoji = [vocab[f"<0x{b:02X}>"] for b in "😀é".encode()]
    ids = [1, vocab["▁hello"], vocab["▁world"], vocab["▁"], *emoji, vocab["▁world"], 2, 2, vocab["▁hello"]]
    for skip in (False, True):
        detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
        pieces = stream(detok, ids)
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
        assert "😀" in pieces and all("\ufffd" not in p for p in pieces)
    assert tok.decode(ids, skip_special_tokens=True) == "hello world 😀é world hello"
