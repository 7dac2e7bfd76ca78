"""gguf_header / open_gguf against the gguf package's GGUFReader on files written here.

Every key, value, value type and tensor view must equal GGUFReader's; strings that are not
UTF-8 keep their bytes; truncated or corrupt headers give a one-line ModelFormatError; and
the tokenizer built from the fast reader encodes exactly as one built from GGUFReader's values.
"""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from ninfer_nb.errors import ModelFormatError
from ninfer_nb.models.gguf_header import read_header
from ninfer_nb.models.gguf_loader import open_gguf
from ninfer_nb.models.gguf_tokenizer import tokenizer_from_gguf

VT = GGUFValueType
TEXTS = ["", "a", "ünïcode ✓ 😀", "日本語のテキスト", "\x00nul", "x" * 300]
SCALARS: dict[VT, Any] = {      # one value per scalar type, near the ends of its range
    VT.UINT8: 250, VT.INT8: -120, VT.UINT16: 65000, VT.INT16: -32000, VT.UINT32: 4_000_000_000,
    VT.INT32: -2_000_000_000, VT.FLOAT32: 0.1, VT.BOOL: True, VT.UINT64: 2**63 + 5,
    VT.INT64: -(2**62), VT.FLOAT64: -1e300,
}


def _write(path: Path, endian: GGUFEndian = GGUFEndian.LITTLE, *, tensors: bool = True,
           extra: dict[str, tuple[Any, VT, VT | None]] | None = None) -> Path:
    """A GGUF with one scalar and one array key per value type, strings, and a few tensors."""
    w = GGUFWriter(str(path), "llama", endianess=endian)
    arrays = {VT.BOOL: [True, False, True], VT.FLOAT32: [0.5, -1e-30, 3.4e38]}
    for vtype, value in SCALARS.items():
        w.add_key_value(f"t.scalar.{vtype.name}", value, vtype)
        w.add_key_value(f"t.array.{vtype.name}", arrays.get(vtype, [value, 0, value]), VT.ARRAY,
                        vtype)
    for i, text in enumerate(TEXTS):
        w.add_string(f"t.string.{i}", text)
    w.add_array("t.strings", TEXTS * 3)
    for key, (value, vtype, sub) in (extra or {}).items():
        w.add_key_value(key, value, vtype, sub)
    if tensors:
        rng = np.random.default_rng(0)
        w.add_tensor("f32", rng.standard_normal((3, 64)).astype(np.float32))
        w.add_tensor("f16", rng.standard_normal((2, 32)).astype(np.float16))
        w.add_tensor("i32", np.arange(7, dtype=np.int32))
        w.add_tensor("q8_0", quantize(rng.standard_normal((4, 64)).astype(np.float32), Q.Q8_0),
                     raw_dtype=Q.Q8_0)
        w.add_tensor("q4_k", rng.integers(0, 256, (2, 144), dtype=np.uint8), raw_dtype=Q.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _same(ours: Any, ref: Any) -> bool:
    """Equal values of the same Python types (1 == 1.0 == True would hide a wrong decode)."""
    if isinstance(ref, list):
        return isinstance(ours, list) and len(ours) == len(ref) and all(map(_same, ours, ref))
    return type(ours) is type(ref) and (ours == ref or (ours != ours and ref != ref))


@pytest.mark.parametrize("endian", [GGUFEndian.LITTLE, GGUFEndian.BIG])
def test_every_key_and_tensor_equals_gguf_reader(tmp_path: Path, endian: GGUFEndian) -> None:
    path = _write(tmp_path / "all.gguf", endian)
    ref = GGUFReader(path)
    metadata, tensors = open_gguf(path)
    assert list(metadata) == list(ref.fields)              # same keys, file order, pseudo keys
    for key, field in ref.fields.items():
        assert _same(metadata[key], field.contents()), key
        assert metadata.value_type(key)[0] == field.types[0], key
    assert metadata["t.strings"] == TEXTS * 3 and metadata["GGUF.kv_count"] == len(ref.fields) - 3
    assert list(tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        ours = tensors[t.name]
        assert (ours.tensor_type, ours.n_elements, ours.n_bytes, ours.data_offset) == (
            t.tensor_type, t.n_elements, t.n_bytes, t.data_offset), t.name
        assert ours.shape.tolist() == t.shape.tolist(), t.name
        assert ours.data.dtype == t.data.dtype and ours.data.shape == t.data.shape, t.name
        assert ours.data.tobytes() == t.data.tobytes(), t.name
    header = read_header(path)
    assert (header.version, header.alignment, header.data_offset) == (3, 32, ref.data_offset)
    assert header.byte_order == ("<" if endian == GGUFEndian.LITTLE else ">")


def test_strings_that_are_not_utf8_keep_their_bytes(tmp_path: Path) -> None:
    bad_tokens = [b"ok", b"\xc3", "é".encode(), b"\xff\xfe raw"]
    path = _write(tmp_path / "raw.gguf", tensors=False, extra={
        "t.raw": (b"\xe2\x82 cut", VT.STRING, None),
        "t.raw_tokens": (bad_tokens, VT.ARRAY, VT.STRING),
    })
    ref = GGUFReader(path)
    metadata, _ = open_gguf(path)
    raw, raw_tokens = ref.fields["t.raw"], ref.fields["t.raw_tokens"]
    with pytest.raises(UnicodeDecodeError):
        raw.contents()                                      # GGUFReader refuses to decode too
    assert metadata.raw("t.raw") == bytes(raw.parts[-1]) == b"\xe2\x82 cut"
    assert metadata.raw("t.raw_tokens") == [bytes(raw_tokens.parts[i]) for i in raw_tokens.data]
    assert metadata.raw("t.raw_tokens") == bad_tokens
    assert metadata.raw("t.strings") == [t.encode() for t in TEXTS * 3]
    with pytest.raises(ModelFormatError, match=r"t\.raw is not valid UTF-8"):
        metadata["t.raw"]
    with pytest.raises(ModelFormatError, match=r"element 1 of t\.raw_tokens is not valid UTF-8"):
        metadata["t.raw_tokens"]
    assert metadata["t.string.2"] == TEXTS[2]              # other keys still read


def _handmade(*kvs: bytes, version: int = 3) -> bytes:
    """A GGUF with no tensors and the given raw key-value records."""
    return b"GGUF" + struct.pack("<IQQ", version, 0, len(kvs)) + b"".join(kvs)


def _key(name: str, vtype: int, payload: bytes) -> bytes:
    """One raw key-value record: key string, value type, value bytes."""
    return struct.pack("<Q", len(name)) + name.encode() + struct.pack("<I", vtype) + payload


def test_empty_array_as_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"          # GGUFWriter refuses empty arrays; llama.cpp does not
    path.write_bytes(_handmade(
        _key("t.empty", VT.ARRAY, struct.pack("<IQ", VT.UINT32, 0)),
        _key("t.empty_strings", VT.ARRAY, struct.pack("<IQ", VT.STRING, 0)),
        _key("t.after", VT.UINT16, struct.pack("<H", 7)),
    ))
    ref = GGUFReader(path)
    metadata, tensors = open_gguf(path)
    assert {k: metadata[k] for k in metadata} == {k: f.contents() for k, f in ref.fields.items()}
    assert metadata["t.empty"] == [] and metadata["t.after"] == 7 and tensors == {}


@pytest.mark.parametrize(("records", "reason"), [
    ((_key("a", VT.UINT8, b"\1"), _key("a", VT.UINT8, b"\2")), "duplicate metadata key 'a'"),
    ((_key("a", 99, b"\1"),), "unknown value type 99"),
    ((_key("a", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 1) + struct.pack("<IQ", VT.UINT8, 0)),),
     "array of arrays"),
    ((_key("general.alignment", VT.UINT32, struct.pack("<I", 24)),), "not a power of two"),
    ((_key("general.alignment", VT.UINT64, struct.pack("<Q", 32)),), "not a uint32"),
])
def test_corrupt_headers_are_one_line_errors(tmp_path: Path, records: tuple[bytes, ...],
                                             reason: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(_handmade(*records))
    with pytest.raises(ModelFormatError, match="corrupt or truncated GGUF file") as info:
        read_header(path)
    assert reason in str(info.value) and "\n" not in str(info.value)


def test_every_truncation_of_the_header_is_a_clear_error(tmp_path: Path) -> None:
    full = _write(tmp_path / "full.gguf").read_bytes()
    header = read_header(tmp_path / "full.gguf")
    cut = tmp_path / "cut.gguf"
    # every 5th length shorter than the tensor infos (5: cuts inside every u32 / u64 field)
    for n in range(0, header.data_offset - header.alignment, 5):
        cut.write_bytes(full[:n])
        with pytest.raises(ModelFormatError, match="corrupt or truncated") as info:
            read_header(cut)
        assert str(cut) in str(info.value), n


def test_huge_lengths_fail_fast(tmp_path: Path) -> None:
    """Lengths and counts far past the end of the file are refused before any loop or copy."""
    path = tmp_path / "huge.gguf"
    strings = _key("t.s", VT.ARRAY, struct.pack("<IQ", VT.STRING, 2**62) + struct.pack("<Q", 1) + b"x")
    numbers = _key("t.n", VT.ARRAY, struct.pack("<IQ", VT.UINT64, 2**61) + b"\0" * 8)
    one = _key("t.one", VT.STRING, struct.pack("<Q", 2**63) + b"abc")
    for record in (strings, numbers, one):
        path.write_bytes(_handmade(record))
        start = time.perf_counter()
        with pytest.raises(ModelFormatError, match="runs past the end of the file"):
            read_header(path)
        assert time.perf_counter() - start < 1.0


def test_a_large_string_array_reads_in_one_pass(tmp_path: Path) -> None:
    """200K strings: GGUFReader needs tens of seconds on a loaded machine, this a fraction of one."""
    tokens = [f"tok{i}-ü" for i in range(200_000)]
    body = b"".join(struct.pack("<Q", len(b)) + b for b in (t.encode() for t in tokens))
    path = tmp_path / "big.gguf"
    path.write_bytes(_handmade(_key("t.tokens", VT.ARRAY, struct.pack("<IQ", VT.STRING, len(tokens))
                                    + body)))
    start = time.perf_counter()
    metadata = read_header(path).metadata
    assert metadata["t.tokens"] == tokens
    assert time.perf_counter() - start < 15.0


# ---- the tokenizer built from the fast reader ----------------------------------------------


def _trained_bpe() -> tuple[list[str], list[str]]:
    """A byte-level BPE learned here (multi-byte UTF-8 in its tokens): tokens by id, merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1200, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["The quick brown fox jumps over the lazy dog. naïve café 😀 12345 apples!",
              "日本語のテキスト、Ελληνικά, русский текст, עִבְרִית", "def f(x):\n    return x**2\n"]
    tok.train_from_iterator(corpus * 40, trainer)
    vocab = tok.get_vocab()
    merges = json.loads(tok.to_str())["model"]["merges"]
    return sorted(vocab, key=vocab.__getitem__), [" ".join(m) for m in merges]


def test_tokenizer_encodes_as_from_gguf_reader_values(tmp_path: Path) -> None:
    tokens, merges = _trained_bpe()
    tokens += ["<|im_start|>", "<|im_end|>", "<tool_call>"]
    types = [1] * (len(tokens) - 3) + [3, 3, 4]
    w = GGUFWriter(str(tmp_path / "tok.gguf"), "qwen3")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 3)
    w.add_eos_token_id(len(tokens) - 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = tokenizer_from_gguf({k: f.contents() for k, f in GGUFReader(tmp_path / "tok.gguf").fields.items()})
    ours = tokenizer_from_gguf(open_gguf(tmp_path / "tok.gguf")[0])
    for text in ["The quick brown fox, naïve café 😀", "日本語のテキスト ελληνικά",
                 "<|im_start|>user\n def f(x): return x**2<tool_call><|im_end|>", "  \t\n 12345"]:
        ids = ours.encode(text)
        assert ids == ref.encode(text) and ours.decode(ids) == text
        assert len(ids) < len(text.encode())                 # the merges are in use
    assert (ours.bos_token_id, ours.eos_token_ids) == (ref.bos_token_id, ref.eos_token_ids)
