"""Read a GGUF file's header, key-value metadata and tensor directory (not the tensor data).

GGUF v2/v3 layout, all integers in the file's byte order (little-endian, or big-endian when
the version's low 16 bits read as zero):

    magic "GGUF" | u32 version | u64 tensor count | u64 kv count
    kv:      string key | u32 value type | value
    value:   scalar (u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64) | string
             | array: u32 element type, u64 count, then the elements back to back
    string:  u64 byte length | bytes (UTF-8 by convention, not guaranteed)
    tensor:  string name | u32 n_dims | u64 dims[n_dims] | u32 ggml type | u64 offset
    data:    starts at the end of the tensor infos rounded up to `general.alignment` (32)

The gguf package's GGUFReader builds numpy views for every element of every array (minutes
for a 248K-token vocabulary); here one pass only finds where each string of an array starts,
and values are decoded on first access. Decoded values equal GGUFReader's
`ReaderField.contents()`, including its pseudo keys GGUF.version / tensor_count / kv_count.
Nested arrays are refused. Knows nothing about tensor data, quantization or model semantics.
"""
from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType as VT

from ..errors import ModelFormatError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# struct / numpy type code of each scalar type (prefixed with the byte order '<' or '>')
_CODES: dict[VT, str] = {
    VT.UINT8: "B", VT.INT8: "b", VT.UINT16: "H", VT.INT16: "h", VT.UINT32: "I", VT.INT32: "i",
    VT.FLOAT32: "f", VT.BOOL: "?", VT.UINT64: "Q", VT.INT64: "q", VT.FLOAT64: "d",
}


class _Truncated(Exception):
    """Internal: a read ran past the end of the file (the message says what was being read)."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor directory. `dims` in GGUF order (dims[0] varies fastest)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int               # bytes from the start of the data section


@dataclass(frozen=True)
class _Value:
    """Where an undecoded value lies in the header bytes."""

    value_type: VT
    element_type: VT | None   # arrays only
    start: int                # first byte of the value (arrays: of the first element)
    count: int                # arrays: number of elements; scalars and strings: 1
    string_bounds: list[int] | None = None   # string arrays: each length prefix, then the end


class GgufMetadata(Mapping[str, Any]):
    """Key -> value, decoded (and cached) on first access; file order.

    Scalars are Python int / float / bool, strings str, arrays lists of those (cached: do not
    modify them). Strings that are not valid UTF-8 raise ModelFormatError when read; `raw`
    gives their bytes.
    """

    def __init__(self, buf: bytes, order: str, values: dict[str, _Value], source: str) -> None:
        self._buf, self._order, self._values, self._source = buf, order, values, source
        self._decoded: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._decoded:
            self._decoded[key] = self._decode(key, self._values[key], raw=False)
        return self._decoded[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def raw(self, key: str) -> Any:
        """As `self[key]`, but strings (also in arrays) as undecoded bytes."""
        return self._decode(key, self._values[key], raw=True)

    def value_type(self, key: str) -> tuple[VT, VT | None]:
        """(value type, element type or None) of one key, as stored in the file."""
        v = self._values[key]
        return v.value_type, v.element_type

    def _decode(self, key: str, v: _Value, *, raw: bool) -> Any:
        buf, order = self._buf, self._order
        if v.value_type == VT.STRING:
            (length,) = struct.unpack_from(order + "Q", buf, v.start)
            data = buf[v.start + 8 : v.start + 8 + length]
            return data if raw else self._utf8(key, [data], in_array=False)[0]
        if v.value_type != VT.ARRAY:
            return struct.unpack_from(order + _CODES[v.value_type], buf, v.start)[0]
        if v.element_type == VT.STRING:
            bounds = v.string_bounds
            assert bounds is not None
            items = [buf[a + 8 : b] for a, b in zip(bounds, bounds[1:])]
            return items if raw else self._utf8(key, items, in_array=True)
        if v.element_type is None:        # an empty array of any type
            return []
        dtype = np.dtype(order + _CODES[v.element_type])
        return np.frombuffer(buf, dtype, v.count, v.start).tolist()

    def _utf8(self, key: str, items: list[bytes], *, in_array: bool) -> list[str]:
        try:
            return [str(b, "utf-8") for b in items]
        except UnicodeDecodeError:
            i = next(i for i, b in enumerate(items) if not _is_utf8(b))
            where = f"element {i} of {key}" if in_array else key
            raise ModelFormatError(
                f"{self._source}: GGUF string {where} is not valid UTF-8: {items[i][:40]!r}"
            ) from None


@dataclass(frozen=True)
class GgufHeader:
    """Everything before the tensor data. `byte_order` is '<' or '>' (struct / numpy prefix)."""

    version: int
    byte_order: str
    metadata: GgufMetadata
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int          # absolute file offset of the data section


def read_header(path: str | Path) -> GgufHeader:
    """Parse the header of the GGUF file at `path`.

    Raises ModelFormatError ("corrupt or truncated GGUF file (...)") on a bad magic or version,
    a read past the end of the file, an unknown value type, nested arrays, duplicate keys or
    tensor names, or a bad general.alignment. Tensor data is neither read nor checked.
    """
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size < 24:
            raise _error(path, f"{size} bytes, too short for a GGUF header")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                return _parse(mm, str(path))
            except _Truncated as exc:
                raise _error(path, f"{exc} runs past the end of the file ({size} bytes)") from None
            except (ValueError, struct.error) as exc:
                raise _error(path, str(exc).splitlines()[0]) from None


def _error(path: str | Path, reason: str) -> ModelFormatError:
    return ModelFormatError(f"{path}: corrupt or truncated GGUF file ({reason})")


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _parse(mm: mmap.mmap, source: str) -> GgufHeader:
    if mm[:4] != MAGIC:
        raise ValueError(f"bad magic {mm[:4]!r}")
    order = "<"
    (version,) = struct.unpack_from("<I", mm, 4)
    if version & 0xFFFF == 0:                 # written on a host of the other byte order
        order = ">"
        (version,) = struct.unpack_from(">I", mm, 4)
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"unsupported GGUF version {version}")
    reader = _Reader(mm, order)
    values: dict[str, _Value] = {
        "GGUF.version": _Value(VT.UINT32, None, 4, 1),
        "GGUF.tensor_count": _Value(VT.UINT64, None, 8, 1),
        "GGUF.kv_count": _Value(VT.UINT64, None, 16, 1),
    }
    reader.pos = 8
    tensor_count, kv_count = reader.u64("tensor count"), reader.u64("kv count")
    for _ in range(kv_count):
        key = reader.string("a metadata key").decode("utf-8")
        if key in values:
            raise ValueError(f"duplicate metadata key {key!r}")
        values[key] = reader.value(key)
    tensors = [reader.tensor_info() for _ in range(reader.bounded(tensor_count, 24, "tensors"))]
    if len({t.name for t in tensors}) != len(tensors):
        raise ValueError("duplicate tensor names")
    metadata = GgufMetadata(bytes(mm[: reader.pos]), order, values, source)
    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        if metadata.value_type("general.alignment") != (VT.UINT32, None):
            raise ValueError("general.alignment is not a uint32")
        alignment = metadata["general.alignment"]
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment} is not a power of two")
    data_offset = -(-reader.pos // alignment) * alignment
    return GgufHeader(version, order, metadata, tuple(tensors), alignment, data_offset)


class _Reader:
    """A cursor over the mapped file; every read checks the file is long enough."""

    def __init__(self, mm: mmap.mmap, order: str) -> None:
        self.mm, self.order, self.pos, self.size = mm, order, 0, len(mm)
        self._u32 = struct.Struct(order + "I").unpack_from
        self._u64 = struct.Struct(order + "Q").unpack_from

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise _Truncated(f"{what} ({n} bytes at byte {self.pos})")

    def bounded(self, count: int, min_bytes: int, what: str) -> int:
        """`count` items of at least `min_bytes` each must fit in the rest of the file."""
        self.need(count * min_bytes, f"{count} {what}")
        return count

    def u32(self, what: str) -> int:
        self.need(4, what)
        self.pos += 4
        return int(self._u32(self.mm, self.pos - 4)[0])

    def u64(self, what: str) -> int:
        self.need(8, what)
        self.pos += 8
        return int(self._u64(self.mm, self.pos - 8)[0])

    def string(self, what: str) -> bytes:
        length = self.u64(what)
        self.need(length, what)
        self.pos += length
        return self.mm[self.pos - length : self.pos]

    def value(self, key: str) -> _Value:
        vtype = _value_type(self.u32(f"the type of {key}"), key)
        start = self.pos
        if vtype == VT.STRING:
            self.string(key)
            return _Value(vtype, None, start, 1)
        if vtype != VT.ARRAY:
            self.need(struct.calcsize(_CODES[vtype]), key)
            self.pos += struct.calcsize(_CODES[vtype])
            return _Value(vtype, None, start, 1)
        etype = _value_type(self.u32(f"the element type of {key}"), key)
        count = self.u64(f"the length of {key}")
        start = self.pos
        if count == 0:                         # GGUFReader records no element type then
            return _Value(vtype, None, start, 0)
        if etype == VT.ARRAY:
            raise ValueError(f"{key} is an array of arrays (not supported)")
        if etype == VT.STRING:
            return _Value(vtype, etype, start, count, self.string_array(count, key))
        item = struct.calcsize(_CODES[etype])
        self.need(count * item, key)
        self.pos += count * item
        return _Value(vtype, etype, start, count)

    def string_array(self, count: int, key: str) -> list[int]:
        """Offsets of the `count` length prefixes from `self.pos`, then the end; one tight pass."""
        self.bounded(count, 8, f"strings of {key}")
        mm, unpack, pos = self.mm, self._u64, self.pos
        bounds = [0] * (count + 1)
        try:
            for i in range(count):
                bounds[i] = pos
                pos += 8 + unpack(mm, pos)[0]
        except struct.error:
            raise _Truncated(f"string {i} of {key} (at byte {pos})") from None
        if pos > self.size:
            raise _Truncated(f"string {count - 1} of {key} (ending at byte {pos})")
        bounds[count] = self.pos = pos
        return bounds

    def tensor_info(self) -> TensorInfo:
        name = self.string("a tensor name").decode("utf-8")
        n_dims = self.u32(f"the rank of tensor {name!r}")
        dims = tuple(self.u64(f"the shape of tensor {name!r}")
                     for _ in range(self.bounded(n_dims, 8, f"dims of {name!r}")))
        ggml_type = self.u32(f"the type of tensor {name!r}")
        return TensorInfo(name, dims, ggml_type, self.u64(f"the offset of tensor {name!r}"))


def _value_type(raw: int, key: str) -> VT:
    try:
        return VT(raw)
    except ValueError:
        raise ValueError(f"{key} has unknown value type {raw}") from None
