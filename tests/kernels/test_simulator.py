"""Runs tests/kernels/sim_cases.py under the CUDA simulator, in a subprocess (the simulator
must be enabled before numba is imported, so it cannot share this process)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.timeout(900)
def test_simulator_cases() -> None:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(HERE.parent.parent))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "sim_cases.py")],
                       env=env, capture_output=True, text=True, timeout=880)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
