"""Read safetensors files into host NumPy arrays, with clear errors for broken files.

Parses the header itself (8-byte little-endian length + JSON) and memory-maps the data, so a
truncated or corrupt file is reported by name instead of crashing. Tensors come out in their
stored dtype, never widened: BF16 as `ml_dtypes.bfloat16`, F8_E4M3 as `ml_dtypes.float8_e4m3fn`,
F16 as float16. `read` copies one tensor out of the map and hands the map's pages of it back
to the kernel, so reading a checkpoint tensor by tensor holds about one tensor of file pages
at a time. Knows nothing about model names or configs.
"""
from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Iterator

import ml_dtypes
import numpy as np

from ..errors import ModelFormatError

_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


_PAGE = mmap.PAGESIZE
_FLOATS = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3"})


class SafetensorsFile:
    """One .safetensors file: names, shapes and lazily read tensors."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            size = path.stat().st_size
            with path.open("rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ModelFormatError(f"{path}: not a safetensors file (too short)")
                (n,) = struct.unpack("<Q", head)
                if n <= 0 or n > min(size - 8, 100 * 2**20):
                    raise ModelFormatError(f"{path}: corrupt safetensors header (length {n})")
                header = json.loads(f.read(n))
        except (OSError, ValueError, UnicodeDecodeError) as e:
            if isinstance(e, ModelFormatError):
                raise
            raise ModelFormatError(f"{path}: cannot read safetensors header ({e})") from None
        if not isinstance(header, dict):
            raise ModelFormatError(f"{path}: corrupt safetensors header")
        meta = header.pop("__metadata__", None)
        self._offset = 8 + n
        self._entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        data_len = size - self._offset
        for name, entry in header.items():
            try:
                dtype, shape, (lo, hi) = (entry["dtype"], tuple(int(s) for s in entry["shape"]),
                                          entry["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise ModelFormatError(f"{path}: corrupt header entry for {name!r}") from None
            if dtype not in _DTYPES:
                raise ModelFormatError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
            expect = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
            if hi - lo != expect or lo < 0:
                raise ModelFormatError(f"{path}: tensor {name!r} size does not match its shape")
            if hi > data_len:
                raise ModelFormatError(
                    f"{path}: file is truncated (tensor {name!r} ends at byte {hi + self._offset}, "
                    f"file has {size})"
                )
            self._entries[name] = (dtype, shape, lo, hi)
        self.metadata = {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}
        self._mmap: mmap.mmap | None = None

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entries[name][1]

    def dtype(self, name: str) -> str:
        """The safetensors dtype name ("BF16", "F8_E4M3", ...)."""
        return self._entries[name][0]

    def nbytes(self, name: str) -> int:
        _, _, lo, hi = self._entries[name]
        return hi - lo

    def read(self, name: str, *, as_float32: bool = False) -> np.ndarray:
        """A copy of one tensor in its stored dtype (as_float32: floats widened to float32)."""
        dtype, shape, lo, hi = self._entries[name]
        if self._mmap is None:
            with self.path.open("rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        start, stop = self._offset + lo, self._offset + hi
        out = np.frombuffer(self._mmap, np.uint8, hi - lo, start).view(_DTYPES[dtype]).reshape(shape).copy()
        self._release(start, stop)
        if as_float32 and dtype in _FLOATS:
            return out.astype(np.float32)
        return out

    def _release(self, start: int, stop: int) -> None:
        """Drop the map's pages of bytes [start, stop) (read, copied; no longer needed)."""
        assert self._mmap is not None
        lo = start // _PAGE * _PAGE
        if hasattr(self._mmap, "madvise") and stop > lo:
            self._mmap.madvise(mmap.MADV_DONTNEED, lo, stop - lo)

    def close(self) -> None:
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None


def checkpoint_files(directory: Path) -> list[Path]:
    """The safetensors shards of an HF checkpoint directory (index file respected)."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError):
            raise ModelFormatError(f"{index}: corrupt safetensors index") from None
        files = sorted({directory / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ModelFormatError(f"{directory}: missing shard(s) {', '.join(missing)}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{directory}: no *.safetensors weights found")
    return files


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, SafetensorsFile]]:
    for path in files:
        st = SafetensorsFile(path)
        for name in st.keys():
            yield name, st
