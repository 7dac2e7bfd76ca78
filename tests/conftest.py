"""Session fixtures shared by every test package: tiny random HF checkpoints (with the real
Qwen3.6 vocabulary and chat template) and the HF models they were made from (the oracle).
GPU-marked tests are skipped on machines without a usable CUDA device."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture()
def pretend_cc90_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba compiles device helpers lazily for the *current* device; the compile-only tests
    (PTX, ptxas, the launch ABI) run without a driver, so pretend a cc 9.0 one."""
    import types

    import numba.cuda.dispatcher as disp

    monkeypatch.setattr(disp, "get_current_device", lambda: types.SimpleNamespace(compute_capability=(9, 0)))


def _cuda_usable() -> bool:
    try:
        from ninfer_nb.runtime.device import cuda_available
    except ImportError:
        return False
    try:
        return bool(cuda_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _cuda_usable():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run `pytest -m gpu` on the GPU machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


class TinyCheckpoints:
    """Writes each tiny checkpoint once per session; remembers the HF model (the oracle)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.models: dict[str, Any] = {}

    def get(self, name: str, kind: str, **kwargs: Any) -> Path:
        path = self.root / name
        if name not in self.models:
            from tests.support.checkpoints import write_tiny_checkpoint

            self.models[name] = write_tiny_checkpoint(path, kind, **kwargs)
        return path

    def hf_model(self, name: str) -> Any:
        return self.models[name]


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> TinyCheckpoints:
    return TinyCheckpoints(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def tiny_qwen35_dir(tiny_checkpoints: TinyCheckpoints) -> Path:
    """Dense Qwen3.5 hybrid: 3 Gated DeltaNet layers + 1 gated attention layer."""
    return tiny_checkpoints.get("qwen35", "qwen35")


@pytest.fixture(scope="session")
def tiny_qwen35_moe_dir(tiny_checkpoints: TinyCheckpoints) -> Path:
    """MoE Qwen3.5 hybrid in the multimodal wrapper layout (model.language_model.*)."""
    return tiny_checkpoints.get("qwen35_moe", "qwen35_moe", wrapper=True)


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_checkpoints: TinyCheckpoints) -> Path:
    """Llama with tied embeddings."""
    return tiny_checkpoints.get("llama", "llama")
