"""Build a tokenizer from a GGUF file's `tokenizer.*` metadata.

Input is a plain mapping of GGUF key -> decoded value (strings, ints, lists), so this module
does not depend on the GGUF reader. Only byte-level BPE vocabularies (`tokenizer.ggml.model ==
"gpt2"`) are supported; the pre-tokenizer split is chosen from `tokenizer.ggml.pre` (the names
llama.cpp writes). SentencePiece ("llama"), WordPiece and other models raise
UnsupportedModelError. It knows nothing about chat templates beyond passing the string on.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from ..chat.tokenizer import Tokenizer
from ..errors import ModelFormatError, UnsupportedModelError

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5 / 3.6: as Qwen2, but combining marks (\p{M}) stay with the letters they follow
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> pre-tokenizer family
_PRE_FAMILIES: dict[str, str] = {
    "default": "gpt2",
    "gpt2": "gpt2",
    "gpt-2": "gpt2",
    "smollm": "digits+gpt2",
    "starcoder": "digits+gpt2",
    "refact": "digits+gpt2",
    "codeshell": "digits+gpt2",
    "command-r": "digits+gpt2",
    "llama3": "llama3",
    "llama-v3": "llama3",
    "llama-bpe": "llama3",
    "smaug-bpe": "llama3",
    "falcon3": "llama3",
    "qwen2": "qwen2",
    "deepseek-r1-qwen": "qwen2",
    "qwen35": "qwen35",
}


def _pre_tokenizer(pre: str) -> tuple[Any, Any, bool]:
    """(normalizer or None, pre-tokenizer, ignore_merges) for one `tokenizer.ggml.pre` value."""
    family = _PRE_FAMILIES.get(pre)
    if family is None:
        known = ", ".join(sorted(_PRE_FAMILIES))
        raise UnsupportedModelError(
            f"unsupported GGUF pre-tokenizer {pre!r} (supported: {known})"
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if family == "gpt2":
        return None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False
    if family == "digits+gpt2":
        split = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        return None, split, False
    regex = {"llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "qwen35": _QWEN35_SPLIT}[family]
    split = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(regex), behavior="isolated"), byte_level]
    )
    normalizer = normalizers.NFC() if family in ("qwen2", "qwen35") else None
    return normalizer, split, family == "llama3"


def _merges(raw: Sequence[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for i, merge in enumerate(raw):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise ModelFormatError(f"GGUF tokenizer merge #{i} is malformed: {merge!r}")
        pairs.append((left, right))
    return pairs


def backend_from_gguf(fields: Mapping[str, Any]) -> BackendTokenizer:
    """A `tokenizers.Tokenizer` for a byte-level BPE GGUF vocabulary (no BOS/EOS handling)."""
    model = fields.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise UnsupportedModelError(
            f"unsupported GGUF tokenizer model {model!r} (only byte-level BPE 'gpt2' is supported)"
        )
    tokens: list[str] = list(fields.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise ModelFormatError("GGUF tokenizer has no tokenizer.ggml.tokens")
    types: list[int] = list(fields.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise ModelFormatError(
            f"GGUF tokenizer has {len(tokens)} tokens but {len(types)} token types"
        )
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)       # duplicates (rare padding entries) keep their first id
    normalizer, pre, ignore_merges = _pre_tokenizer(str(fields.get("tokenizer.ggml.pre") or "default"))
    bpe = models.BPE(
        vocab=vocab,
        merges=_merges(fields.get("tokenizer.ggml.merges") or []),
        ignore_merges=ignore_merges,
    )
    backend = BackendTokenizer(bpe)
    if normalizer is not None:
        backend.normalizer = normalizer
    backend.pre_tokenizer = pre
    backend.decoder = decoders.ByteLevel()
    special = [tokens[i] for i, t in enumerate(types) if t == TOKEN_CONTROL and vocab[tokens[i]] == i]
    user = [tokens[i] for i, t in enumerate(types) if t == TOKEN_USER_DEFINED and vocab[tokens[i]] == i]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return backend


def _token_id(fields: Mapping[str, Any], key: str, n_tokens: int) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    ident = int(value)
    if not 0 <= ident < n_tokens:
        raise ModelFormatError(f"GGUF {key}={ident} is outside the vocabulary (0..{n_tokens - 1})")
    return ident


def eos_token_ids(fields: Mapping[str, Any]) -> tuple[int, ...]:
    """End-of-sequence ids: eos, then end-of-turn and end-of-message ids when present."""
    n = len(fields.get("tokenizer.ggml.tokens") or ())
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"):
        ident = _token_id(fields, key, n) if n else None
        if ident is not None and ident not in ids:
            ids.append(ident)
    return tuple(ids)


def tokenizer_from_gguf(fields: Mapping[str, Any]) -> Tokenizer:
    """The engine's Tokenizer for GGUF `tokenizer.*` metadata (values already decoded)."""
    backend = backend_from_gguf(fields)
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    bos = _token_id(fields, "tokenizer.ggml.bos_token_id", len(tokens))
    eos_ids = eos_token_ids(fields)
    template = fields.get("tokenizer.chat_template")
    return Tokenizer(
        backend,
        eos_token_ids=eos_ids,
        bos_token_id=bos,
        add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)) and bos is not None,
        chat_template=str(template) if template else None,
        bos_token=tokens[bos] if bos is not None else "",
        eos_token=tokens[eos_ids[0]] if eos_ids else "",
    )
