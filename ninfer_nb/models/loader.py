"""Find and load a model: HF checkpoint directory, GGUF file, or the default model.

Produces a `LoadedCheckpoint` with weights under Hugging Face text-decoder names
(`model.layers.N....`): multimodal wrappers (`model.language_model.`) are unwrapped, vision
tensors are skipped, the MTP head's stay under `mtp.` names, per-expert MoE tensors are
stacked. Tensors are read on access from the shards' memory maps, one at a time, in their
stored format (never widened): bf16 / fp16 arrays, quantized checkpoints (FP8, GPTQ, AWQ,
compressed-tensors: hf_quant.py; the project's own artifact: weights_format.py) as
QuantizedWeight records. Knows nothing about devices.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFormatError, ModelNotFoundError
from ..progress import Progress
from ..quant.rows import concat_rows, stack_experts
from .checkpoint import LoadedCheckpoint
from .hf_quant import MARKERS, SUFFIXES, load_quantized, quant_method
from .safetensors_io import _DTYPES, SafetensorsFile, checkpoint_files
from .weights import DenseWeight
from .weights_format import ARTIFACT_ARRAYS, artifact_formats, read_artifact_weight

_SKIP = re.compile(r"^(model\.visual\.|visual\.)")
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def load_checkpoint(model: str | None, *, show_progress: bool = False) -> LoadedCheckpoint:
    if model is None:
        from ..pull import ensure_default_model

        model = str(ensure_default_model(show_progress=show_progress))
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"model not found: {model} (expected an HF checkpoint directory or a .gguf file)")
    if path.is_file():
        if path.suffix.lower() == ".gguf" or _is_gguf(path):
            from .gguf_loader import load_gguf

            return load_gguf(path, show_progress=show_progress)
        raise ModelFormatError(f"{path}: not a GGUF file or an HF checkpoint directory")
    return load_hf_dir(path, show_progress=show_progress)


def _is_gguf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def canonical_name(name: str) -> str | None:
    """HF tensor name -> text-decoder name, or None when the tensor is not used."""
    if _SKIP.match(name):
        return None
    if name.startswith("model.mtp."):            # the MTP head keeps its own `mtp.` names
        return name[len("model."):]
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    if name.startswith("language_model.model."):
        return "model." + name[len("language_model.model.") :]
    if name.startswith("language_model.lm_head."):
        return name[len("language_model.") :]
    return name


def read_hf_config(directory: Path) -> dict[str, Any]:
    """config.json as a dict; a missing or unparsable file is a one-line error."""
    cfg_path = directory / "config.json"
    if not cfg_path.exists():
        raise ModelNotFoundError(f"{directory}: no config.json (not an HF checkpoint directory)")
    try:
        raw = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise ModelFormatError(f"{cfg_path}: invalid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ModelFormatError(f"{cfg_path}: not a JSON object")
    return raw


class CheckpointTensors(Mapping[str, Any]):
    """The checkpoint's tensors under text-decoder names, read from the shards' memory maps on
    access (each read once): host arrays in their stored dtype, quantized weights as records
    (hf_quant.py, or the project's own artifact, weights_format.py), per-expert MoE tensors
    stacked into `experts.gate_up_proj` / `experts.down_proj`."""

    def __init__(self, directory: Path, files: list[SafetensorsFile], raw_config: dict[str, Any]) -> None:
        self.directory = directory
        self.files = files
        self._where: dict[str, SafetensorsFile] = {}
        for st in files:
            for name in st.keys():
                self._where[name] = st
        self.method, self._qc = quant_method(raw_config)
        self.artifact = artifact_formats(files)
        self._names: dict[str, tuple[str, str]] = {}        # canonical -> (kind, source name)
        experts: dict[str, set[int]] = {}
        quant_parts = {s for m in ([self.method] if self.method else []) for s in SUFFIXES[m]}
        marker = MARKERS.get(self.method or "")
        for name in self._where:
            canon = canonical_name(name)
            if canon is None:
                continue
            if self.artifact is not None and canon.rsplit(".", 1)[-1] in ARTIFACT_ARRAYS:
                base = canon.rsplit(".", 1)[0]
                if name.rsplit(".", 1)[0] in self.artifact:
                    self._names[base] = ("artifact", name.rsplit(".", 1)[0])
                    continue
            if marker is not None and canon.endswith(marker):
                x = name[: -len(marker)]
                self._add(canon[: -len(marker)] + ".weight", ("quant", x), experts)
                continue
            if any(canon.endswith(sfx) for sfx in quant_parts):
                continue
            if self.method == "fp8" and (name[: -len(".weight")] + ".weight_scale_inv") in self._where:
                continue                                     # read with its scales above
            self._add(canon, ("plain", name), experts)
        self._experts = experts

    def _add(self, canon: str, entry: tuple[str, str], experts: dict[str, set[int]]) -> None:
        m = _EXPERT.match(canon)
        if m:
            experts.setdefault(m.group(1), set()).add(int(m.group(2)))
            self._names[canon] = entry
            for fused in ("gate_up_proj", "down_proj"):
                self._names.setdefault(f"{m.group(1)}.{fused}", ("experts", m.group(1)))
            return
        self._names[canon] = entry

    def _read(self, name: str) -> np.ndarray:
        return self._where[name].read(name)

    def _has(self, name: str) -> bool:
        return name in self._where

    def __getitem__(self, canon: str) -> Any:
        kind, src = self._names[canon]
        if kind == "plain":
            return self._read(src)
        if kind == "quant":
            assert self.method is not None
            return load_quantized(self.method, self._qc, self._read, src, self._has)
        if kind == "artifact":
            return read_artifact_weight(self._read, src, self.artifact)
        n = 1 + max(self._experts[src])
        try:
            if canon.endswith("gate_up_proj"):
                return stack_experts([concat_rows([self[f"{src}.{e}.gate_proj.weight"],
                                                   self[f"{src}.{e}.up_proj.weight"]]) for e in range(n)])
            return stack_experts([self[f"{src}.{e}.down_proj.weight"] for e in range(n)])
        except KeyError as e:
            raise ModelFormatError(f"{self.directory}: missing expert tensor {e}") from None

    def shape_of(self, canon: str) -> tuple[int, ...]:
        """The tensor's shape, read from the headers where that tells it."""
        kind, src = self._names[canon]
        if kind == "plain":
            return self._where[src].shape(src)
        if kind == "artifact":
            assert self.artifact is not None
            return self.artifact[src][1]
        return tuple(self[canon].shape)

    def dtype_of(self, canon: str) -> np.dtype:
        """The stored dtype of a plain tensor (float32 for the values of quantized ones)."""
        kind, src = self._names[canon]
        if kind == "plain":
            return _DTYPES[self._where[src].dtype(src)]
        x = self[canon]
        return np.dtype(x.data.dtype) if isinstance(x, DenseWeight) else np.dtype(np.float32)

    def __iter__(self) -> Iterator[str]:
        return iter(k for k in self._names if not _EXPERT.match(k))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def nbytes(self) -> int:
        return sum(st.nbytes(n) for n, st in self._where.items())


def load_hf_dir(directory: Path, *, show_progress: bool = False) -> LoadedCheckpoint:
    """An HF checkpoint directory (or one `ninfer convert` wrote): config, lazily read tensors
    (CheckpointTensors), tokenizer."""
    raw = read_hf_config(directory)
    try:
        config = ModelConfig.from_hf(raw)
    except ModelFormatError as e:
        raise ModelFormatError(f"{directory / 'config.json'}: {e.message}") from None
    files = [SafetensorsFile(f) for f in checkpoint_files(directory)]
    tensors = CheckpointTensors(directory, files, raw)
    if show_progress:
        size = sum(f.path.stat().st_size for f in files)
        Progress(f"mapped {directory.name}", 1).close(
            f"mapped {directory.name}: {len(files)} shard(s), {size / 2**30:.2f} GiB"
            + (f", {tensors.method} weights" if tensors.method else "")
            + (", ninfer weights" if tensors.artifact is not None else ""))
    from ..chat.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(directory)
    return LoadedCheckpoint(config=config, weights=tensors, tokenizer=tokenizer,
                            source=str(directory), name=directory.name,
                            metadata={"format": "safetensors", "quant_method": tensors.method})
