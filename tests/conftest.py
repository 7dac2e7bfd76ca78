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
if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):      # the simulator cases' processes
    from tests.support.sim_threads import install

    install()


@pytest.fixture()
def pretend_cc90_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba compiles device helpers lazily for the *current* device; the compile-only tests
    (PTX, ptxas, the launch ABI) run without a driver, so pretend a cc 9.0 one. Also a cheaper
    compiler (tests/support/numba_compile.py: the same PTX, fewer copies and compiles)."""
    import types

    import numba.cuda.dispatcher as disp

    from tests.support.numba_compile import install

    install()
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
XDIST_WORKER = "PYTEST_XDIST_WORKER"
# tests parametrized by a registered kernel's `name`: one worker compiles each kernel (numba types
# a kernel once per process; its other targets then take a fraction of the first compile)
KERNEL_BUILD_MODULES = ("tests/kernels/test_compile_ptx.py", "tests/kernels/test_ptxas.py",
                        "tests/runtime/test_launch_abi.py", "tests/kernels/test_gemv_quant.py",
                        "tests/kernels/test_gemv_tiled.py")


def pytest_configure(config: pytest.Config) -> None:
    """`-n N` (pytest-xdist) without a --dist of its own means `--dist loadgroup`: the groups
    below, dealt in collection order, not largest first (the simulator's test first:
    _simulator_in_background). Each worker parses the command line itself, so it is told too."""
    args = [str(a) for a in config.invocation_params.args]
    if not any(a in ("--dist", "-d", "--distload") or a.startswith("--dist=") for a in args):
        if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") == "load":
            config.option.dist = "loadgroup"
        elif hasattr(config, "workerinput"):
            config.option.loadgroup = True
    if getattr(config.option, "dist", "no") == "loadgroup":
        config.option.loadscopereorder = False
    config.pluginmanager.register(_XdistGroups(), "ninfer-xdist-groups")


class _XdistGroups:
    """Under pytest-xdist (`-n 2`, the CI command): tests that share a costly
    state run in one worker. A test that uses a module-scoped fixture, or a session-scoped one
    defined in its own module (the converted GGUFs), is grouped with its module; a compile test
    with its kernel. Everything else is dealt one test at a time."""

    @pytest.hookimpl(tryfirst=True)        # before xdist's worker appends the group to the node ids
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if XDIST_WORKER not in os.environ:
            return
        for item in items:
            group = _xdist_group(item)
            if group:
                item.add_marker(pytest.mark.xdist_group(group))


def _xdist_group(item: pytest.Item) -> str | None:
    module = item.nodeid.split("::", 1)[0]
    callspec = getattr(item, "callspec", None)
    name = callspec.params.get("name") if callspec is not None else None
    if module in KERNEL_BUILD_MODULES and isinstance(name, str):
        return f"kernel:{name}"
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    for defs in (fixtureinfo.name2fixturedefs.values() if fixtureinfo is not None else ()):
        fixturedef = defs[-1]
        if fixturedef.scope == "module" or (fixturedef.scope in ("package", "session")
                                             and fixturedef.baseid == module):
            return module
    return None


_CALLED = pytest.StashKey[bool]()


def pytest_runtest_call(item: pytest.Item) -> None:
    item.stash[_CALLED] = True


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Free a GPU test's device memory now: backends and arenas caught in reference cycles would
    otherwise outlive it, and xdist workers sharing one GPU run out of memory. Only after a GPU
    test that ran: a full collection costs ~0.3 s, and CI skips ~500 GPU tests."""
    if "gpu" in item.keywords and item.stash.get(_CALLED, False):
        import gc

        gc.collect()


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
    simulator now, on all cores but one, and run its test last (tests/support/sim_runner.py).
    Under pytest-xdist its test goes first instead: one worker waits on the simulator's
    processes while the others run the rest."""
    sim = [item for item in items if item.nodeid.endswith(SIMULATOR_TEST)]
    cores = os.cpu_count() or 1
    if not sim or len(items) == 1:
        return
    if XDIST_WORKER in os.environ:
        items[:] = sim + [item for item in items if item not in sim]
        return
    if cores < 2:
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


# what Tokenizer.from_dir reads
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                    "chat_template.json")


@pytest.fixture(scope="session", autouse=True)
def _tokenizers_parsed_once() -> Any:
    """Tokenizer.from_dir parses each distinct tokenizer directory once per session: every tiny
    checkpoint carries the real 248k-token Qwen3.6 tokenizer.json (~1.5 s of CPU to parse) and
    the tests build hundreds of LLMs. Keyed by the content of the files from_dir reads; a miss
    (and every error) goes through the real from_dir; a hit is a shallow copy."""
    import copy
    import hashlib

    from ninfer_nb.chat.tokenizer import Tokenizer

    real = Tokenizer.from_dir.__func__       # type: ignore[attr-defined]
    parsed: dict[tuple[Any, ...], Any] = {}

    def from_dir(cls: type, path: str | Path) -> Any:
        root = Path(path)
        try:
            files = [root / name for name in _TOKENIZER_FILES]
            key = (cls, *(hashlib.sha1(p.read_bytes()).digest() if p.is_file() else None for p in files))
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
