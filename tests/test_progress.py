"""ninfer_nb.progress: a bar on a terminal's stderr, one summary line otherwise, nothing when off."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ninfer_nb.progress import Progress

SCRIPT = """from ninfer_nb.progress import Progress
bar = Progress("loading x", 50, unit="B")
for _ in range(50):
    bar.update(1)
bar.close("loaded x")
"""


def test_summary_line_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    bar = Progress("loading y", 3)
    bar.update(3)
    bar.close()
    assert capsys.readouterr().err.startswith("loading y (") and bar.done == 3
    quiet = Progress("loading z", 3, enabled=False)
    quiet.update()
    quiet.close("done")
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_bar_on_a_terminal() -> None:
    leader, follower = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdin=follower, stdout=follower, stderr=follower,
                            env={**os.environ, "COLUMNS": "100", "TERM": "xterm"})
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:         # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    text = out.decode("utf-8", "replace")
    assert "loading x" in text and "100%" in text and "50/50 bytes" in text     # the bar, with sizes
    assert text.rstrip().endswith(")") and "loaded x (" in text
