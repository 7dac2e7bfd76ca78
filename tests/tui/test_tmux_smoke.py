"""Smoke run of the `ninfer-tui` command in a real terminal (tmux): the default model
(SmolLM2-135M-Instruct, real weights, downloaded once by the engine) answers a question.

Uses the installed `ninfer-tui` console script when it is on PATH, else `python -m ninfer_nb.tui` from
the repository (the same `ninfer_nb.tui.__main__:main`). Skips when tmux is missing.
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def _wait_screen(session: str, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux("capture-pane", "-p", "-t", session)
        if needle in screen:
            return screen
        time.sleep(0.25)
    raise AssertionError(f"{needle!r} not on screen within {timeout} s:\n{screen}")


def test_default_model_answers_in_tmux(tmp_path: Path) -> None:
    exe = shutil.which("ninfer-tui")
    command = [exe] if exe else [sys.executable, "-m", "ninfer_nb.tui"]
    command += ["--device", "cpu", "--no-thinking", "--temperature", "0", "--max-tokens", "32"]
    session = f"ninfer-tui-{uuid.uuid4().hex[:8]}"
    shell = (f"cd {shlex.quote(str(ROOT))} && NINFER_TUI_DATA={shlex.quote(str(tmp_path))} "
             f"{shlex.join(command)}; echo EXITED $?; sleep 60")
    _tmux("new-session", "-d", "-s", session, "-x", "100", "-y", "30", shell)
    try:
        _wait_screen(session, "ready on cpu", timeout=240)   # first run downloads ~98 MB
        _tmux("send-keys", "-t", session, "What is the capital of France?", "Enter")
        _wait_screen(session, "tok/s ", timeout=120)      # the answer's timings footer
        screen = _wait_screen(session, "│ ready", timeout=30)  # then the status line settles
        assert "What is the capital of France?" in screen
        assert "Paris" in screen
        assert "TTFT" in screen and "│ ready" in screen
        _tmux("send-keys", "-t", session, "C-q")
        screen = _wait_screen(session, "EXITED", timeout=30)
        assert "EXITED 0" in screen
        assert (tmp_path / "history.sqlite3").exists()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
