"""Find and load a model: HF checkpoint directory, GGUF file, or the default model.

Produces a `LoadedCheckpoint` with weights under Hugging Face text-decoder names
(`model.layers.N....`): multimodal wrappers (`model.language_model.`) are unwrapped, vision and
MTP tensors are skipped, per-expert MoE tensors are stacked. Knows nothing about devices.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFormatError, ModelNotFoundError
from ..progress import Progress
from .checkpoint import LoadedCheckpoint
from .safetensors_io import checkpoint_files, iter_tensors

_SKIP = re.compile(r"^(model\.visual\.|visual\.|mtp\.|model\.mtp\.)")
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
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    if name.startswith("language_model.model."):
        return "model." + name[len("language_model.model.") :]
    if name.startswith("language_model.lm_head."):
        return name[len("language_model.") :]
    return name


def load_hf_dir(directory: Path, *, show_progress: bool = False) -> LoadedCheckpoint:
    cfg_path = directory / "config.json"
    if not cfg_path.exists():
        raise ModelNotFoundError(f"{directory}: no config.json (not an HF checkpoint directory)")
    try:
        raw = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise ModelFormatError(f"{cfg_path}: invalid JSON ({e})") from None
    config = ModelConfig.from_hf(raw)
    files = checkpoint_files(directory)
    entries = [(n, st) for n, st in iter_tensors(files)]
    bar = Progress(f"loading {directory.name}", len(entries), enabled=show_progress)
    weights: dict[str, np.ndarray] = {}
    experts: dict[str, dict[tuple[int, str], np.ndarray]] = {}
    for name, st in entries:
        bar.update()
        canon = canonical_name(name)
        if canon is None:
            continue
        m = _EXPERT.match(canon)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = st.read(name)
            continue
        weights[canon] = st.read(name)
    for prefix, parts in experts.items():
        n = 1 + max(e for e, _ in parts)
        try:
            gate_up = np.stack([np.concatenate([parts[(e, "gate_proj")], parts[(e, "up_proj")]]) for e in range(n)])
            down = np.stack([parts[(e, "down_proj")] for e in range(n)])
        except KeyError as e:
            raise ModelFormatError(f"{directory}: missing expert tensor {prefix}.{e}") from None
        weights[f"{prefix}.gate_up_proj"] = gate_up
        weights[f"{prefix}.down_proj"] = down
    bar.close(f"loaded {directory.name}: {len(weights)} tensors")
    from ..chat.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(directory)
    return LoadedCheckpoint(config=config, weights=weights, tokenizer=tokenizer,
                            source=str(directory), name=directory.name)
