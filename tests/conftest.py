"""Session fixtures shared by every test package: tiny random HF checkpoints (with the real
Qwen3.6 vocabulary and chat template) and the HF models they were made from (the oracle).
GPU-marked tests are skipped on machines without a usable CUDA device, unless the run says a
GPU must be there (NINFER_REQUIRE_GPU=1, the GPU session's scripts): then the whole run fails
at collection with the reason, instead of reporting skips and exiting 0."""
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


REQUIRE_GPU = "NINFER_REQUIRE_GPU"


def _cuda_unusable_reason() -> str | None:
    """None when a CUDA device answers; else why not (for the skip or the error)."""
    try:
        from ninfer_nb.runtime._drv import driver

        drv = driver()
    except Exception as exc:
        return f"cuda-python is not usable ({type(exc).__name__}: {exc})"
    try:
        err = drv.cuInit(0)[0]
        if err != drv.CUresult.CUDA_SUCCESS:
            return f"cuInit failed: {err!r}"
        err, n = drv.cuDeviceGetCount()
        if err != drv.CUresult.CUDA_SUCCESS or n < 1:
            return f"no CUDA device (cuDeviceGetCount: {err!r}, {n})"
    except Exception as exc:
        return f"CUDA failed to initialise ({type(exc).__name__}: {exc})"
    return None


def gpu_required() -> bool:
    """The run must have a usable GPU (NINFER_REQUIRE_GPU set to anything but '' / '0')."""
    return os.environ.get(REQUIRE_GPU, "") not in ("", "0")


SIMULATOR_TEST = "test_simulator.py::test_simulator_cases"


@pytest.hookimpl(trylast=True)          # after -m / -k deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and (reason := _cuda_unusable_reason()):
        if gpu_required():
            raise pytest.UsageError(f"{REQUIRE_GPU}=1 but the GPU is unusable: {reason}")
        skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU (run `pytest -m gpu` on the GPU machine): {reason}")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    if not config.option.collectonly:
        _simulator_in_background(items)


def _simulator_in_background(items: list[pytest.Item]) -> None:
    """With other tests selected beside the simulator cases and a core to spare: start the
    simulator now, on all cores but one, and run its test last (tests/support/sim_runner.py)."""
    sim = [item for item in items if item.nodeid.endswith(SIMULATOR_TEST)]
    cores = os.cpu_count() or 1
    if not sim or len(items) == 1 or cores < 2:
        return
    from tests.support.sim_runner import BACKGROUND, SimulatorRun

    BACKGROUND.append(SimulatorRun(cores - 1))
    items[:] = [item for item in items if item not in sim] + sim


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A background simulator run that its test did not collect (-x, a deselection): stop it."""
    import sys

    runner = sys.modules.get("tests.support.sim_runner")
    if runner is not None:
        while runner.BACKGROUND:
            runner.BACKGROUND.pop().kill()


_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".npy", ".npz")


@pytest.fixture(scope="session", autouse=True)
def _tokenizers_parsed_once() -> Any:
    """Tokenizer.from_dir parses each distinct tokenizer directory once per session: every tiny
    checkpoint carries the real 248k-token Qwen3.6 tokenizer.json (~1.5 s of CPU to parse) and
    the tests build hundreds of LLMs. Keyed by the content of the directory's non-weight files;
    a miss (and every error) goes through the real from_dir; a hit is a shallow copy."""
    import copy
    import hashlib

    from ninfer_nb.chat.tokenizer import Tokenizer

    real = Tokenizer.from_dir.__func__       # type: ignore[attr-defined]
    parsed: dict[tuple[Any, ...], Any] = {}

    def from_dir(cls: type, path: str | Path) -> Any:
        root = Path(path)
        try:
            files = sorted(p for p in root.iterdir() if p.is_file() and not p.name.endswith(_WEIGHT_SUFFIXES))
            key = (cls, *((p.name, hashlib.sha1(p.read_bytes()).digest()) for p in files))
        except OSError:
            return real(cls, path)
        if key not in parsed:
            parsed[key] = real(cls, path)
        return copy.copy(parsed[key])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Tokenizer, "from_dir", classmethod(from_dir))
        yield


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
