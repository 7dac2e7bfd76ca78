"""The project's own weight artifact (what `ninfer convert` writes): an HF-style directory whose
safetensors shards hold quantized weights as their format's arrays, read without repacking.

A quantized weight `NAME` (a text-decoder name such as `model.layers.0.mlp.up_proj.weight`)
is stored as the tensors `NAME.codes`, `NAME.scales` and, by format, `NAME.zeros` or
`NAME.mins`, exactly the arrays of quant/formats.py; every shard's `__metadata__` carries
`"ninfer.weights"`: JSON `{"version": 1, "tensors": {NAME: {"format": "int4-g64",
"shape": [N, K]}}}` for the weights in that shard. Other tensors are stored as they are (bf16 /
fp16 / fp32). docs/weights-format.md is the specification. This module reads and writes those
shards; it knows nothing about models or quantization math.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from ..errors import ModelFormatError
from ..quant.formats import QuantFormat, quant_format
from .safetensors_io import SafetensorsFile
from .weights import QuantizedWeight

ARTIFACT_KEY = "ninfer.weights"
ARTIFACT_VERSION = 1
ARTIFACT_ARRAYS = frozenset({"codes", "scales", "zeros", "mins"})

_ST_DTYPES: dict[str, str] = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "uint8": "U8", "int8": "I8",
    "int32": "I32", "int64": "I64", "float64": "F64", "float8_e4m3fn": "F8_E4M3",
}


def artifact_formats(files: Sequence[SafetensorsFile]) -> dict[str, tuple[QuantFormat, tuple[int, ...]]] | None:
    """NAME -> (format, logical shape) of every quantized weight in the shards; None when the
    shards are not an artifact of this project."""
    found: dict[str, tuple[QuantFormat, tuple[int, ...]]] = {}
    seen = False
    for st in files:
        text = st.metadata.get(ARTIFACT_KEY)
        if text is None:
            continue
        seen = True
        try:
            meta = json.loads(text)
            if int(meta.get("version", 0)) != ARTIFACT_VERSION:
                raise ModelFormatError(f"{st.path}: ninfer weights version {meta.get('version')} "
                                       f"is not supported (expected {ARTIFACT_VERSION})")
            for name, entry in meta["tensors"].items():
                found[name] = (quant_format(entry["format"]), tuple(int(d) for d in entry["shape"]))
        except (ValueError, KeyError, TypeError) as e:
            if isinstance(e, ModelFormatError):
                raise
            raise ModelFormatError(f"{st.path}: corrupt {ARTIFACT_KEY} metadata ({e})") from None
    return found if seen else None


def read_artifact_weight(read: Callable[[str], np.ndarray], name: str,
                         formats: Mapping[str, tuple[QuantFormat, tuple[int, ...]]] | None) -> QuantizedWeight:
    """The record of quantized weight `name`, its arrays read as stored."""
    assert formats is not None
    fmt, shape = formats[name]
    try:
        arrays = {k: read(f"{name}.{k}") for k in fmt.arrays}
    except KeyError as e:
        raise ModelFormatError(f"quantized weight {name}: missing array {e}") from None
    try:
        return QuantizedWeight(fmt, shape, arrays)
    except ValueError as e:
        raise ModelFormatError(f"quantized weight {name}: {e}") from None


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor of a shard: its name, safetensors dtype and shape (data comes later)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def planned_arrays(name: str, fmt: QuantFormat, shape: tuple[int, ...]) -> list[PlannedTensor]:
    """The tensors a quantized weight of `fmt` and logical `shape` is stored as."""
    *lead, n, k = shape
    if fmt.layout == "fp8-block":
        b = fmt.group_size
        return [PlannedTensor(f"{name}.codes", np.dtype(np.uint8), tuple(shape)),
                PlannedTensor(f"{name}.scales", np.dtype(np.float32), (*lead, -(-n // b), -(-k // b)))]
    groups = (*lead, n, k // fmt.group_size)
    out = [PlannedTensor(f"{name}.codes", np.dtype(np.uint8), (*lead, n, k * fmt.bits // 8)),
           PlannedTensor(f"{name}.scales", np.dtype(np.float16), groups)]
    if fmt.zero_points:
        out.append(PlannedTensor(f"{name}.zeros", np.dtype(np.uint8), groups))
    if fmt.layout == "groupwise-min":
        out.append(PlannedTensor(f"{name}.mins", np.dtype(np.float16), groups))
    return out


def st_dtype(dtype: np.dtype) -> str:
    name = np.dtype(dtype).name
    if name not in _ST_DTYPES:
        raise ValueError(f"no safetensors dtype for {name}")
    return _ST_DTYPES[name]


class ShardWriter:
    """Writes one safetensors shard whose tensors are known in advance (`plan`); data is
    appended tensor by tensor in plan order, so only one tensor is in memory at a time."""

    def __init__(self, path: Path, plan: Sequence[PlannedTensor], metadata: Mapping[str, str]) -> None:
        self.path, self.plan = path, list(plan)
        header: dict[str, Any] = {"__metadata__": dict(metadata)}
        offset = 0
        for t in self.plan:
            header[t.name] = {"dtype": st_dtype(t.dtype), "shape": list(t.shape),
                              "data_offsets": [offset, offset + t.nbytes]}
            offset += t.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._fh: BinaryIO = path.open("xb")
        self._fh.write(struct.pack("<Q", len(raw)) + raw)
        self._next = 0

    def write(self, name: str, array: np.ndarray) -> None:
        t = self.plan[self._next]
        if name != t.name or tuple(array.shape) != t.shape or np.dtype(array.dtype) != t.dtype:
            raise ValueError(f"shard {self.path.name}: expected {t.name} {t.shape} {t.dtype}, "
                             f"got {name} {tuple(array.shape)} {array.dtype}")
        self._fh.write(np.ascontiguousarray(array).tobytes())
        self._next += 1

    def close(self) -> None:
        if self._next != len(self.plan):
            raise ValueError(f"shard {self.path.name}: {len(self.plan) - self._next} tensors not written")
        self._fh.close()


BF16 = np.dtype(ml_dtypes.bfloat16)
