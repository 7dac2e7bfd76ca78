"""The wheel built from this repository: `server/` and `tui/` install as `ninfer_nb.server` /
`ninfer_nb.tui` (no top-level `server` / `tui`), the three console scripts exist, and `dev/`
and `tests/` are not packaged. Builds from a copy of the sources, so the working tree is left
untouched; installs with --no-deps into a fresh venv, so nothing is imported beyond spec lookup."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "ninfer_nb", "server", "tui")


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    done = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, src,
                cwd=src)
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("ninfer_nb-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv_python(built_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # The host's pip installs into the venv (--python): no network, no pip copy in the venv.
    done = _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", built_wheel,
                cwd=env_dir)
    assert done.returncode == 0, done.stderr
    return python


def test_wheel_maps_server_and_tui_under_ninfer_nb(built_wheel: Path) -> None:
    names = set(zipfile.ZipFile(built_wheel).namelist())
    for expected in ("ninfer_nb/server/app.py", "ninfer_nb/server/__main__.py", "ninfer_nb/tui/app.py",
                     "ninfer_nb/tui/app.tcss", "ninfer_nb/tui/widgets/perf.py", "ninfer_nb/tui/screens/help.py"):
        assert expected in names
    top_level = {name.split("/")[0] for name in names}
    assert not top_level & {"server", "tui", "dev", "tests", "scripts"}, sorted(top_level)
    # Every package folder of the sources is in the wheel (none forgotten by the layout in setup.py).
    for root, mapped in (("ninfer_nb", "ninfer_nb"), ("server", "ninfer_nb/server"), ("tui", "ninfer_nb/tui")):
        for init in (REPO / root).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                assert f"{mapped}/{init.relative_to(REPO / root).as_posix()}" in names


def test_venv_has_console_scripts(venv_python: Path) -> None:
    for script in ("ninfer", "ninfer-serve", "ninfer-tui"):
        assert (venv_python.parent / script).is_file(), script
    text = (venv_python.parent / "ninfer-serve").read_text()
    assert "from ninfer_nb.server.__main__ import main" in text


def test_top_level_server_is_not_importable(venv_python: Path, tmp_path: Path) -> None:
    for name in ("server", "tui"):
        done = _run(venv_python, "-c", f"import {name}", cwd=tmp_path)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, done.stderr
    # --no-deps: importing would fail on numpy etc., so only locate the files (no package is run).
    probe = ("from importlib.machinery import PathFinder as F; top = F.find_spec('ninfer_nb'); "
             "server = F.find_spec('ninfer_nb.server', top.submodule_search_locations); "
             "tui = F.find_spec('ninfer_nb.tui', top.submodule_search_locations); "
             "print(server.origin); print(F.find_spec('ninfer_nb.tui.app', tui.submodule_search_locations).origin)")
    done = _run(venv_python, "-c", probe, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    site = venv_python.parent.parent
    server_init, tui_app = (Path(line) for line in done.stdout.split())
    assert server_init.is_relative_to(site) and server_init.parts[-3:] == ("ninfer_nb", "server", "__init__.py")
    assert tui_app.is_relative_to(site) and tui_app.parts[-3:] == ("ninfer_nb", "tui", "app.py")
