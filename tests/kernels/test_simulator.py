"""Runs tests/kernels/sim_cases.py under the CUDA simulator, in subprocesses (the simulator
must be enabled before numba is imported, so it cannot share this process).

The cases are collected once, then run in up to SHARDS concurrent processes, round-robin over
the collected order: the simulator is single-threaded Python. On this project's 2-core machine
two shards took 171-182 s against 370-407 s for one process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SHARDS = max(1, min(2, os.cpu_count() or 1))


@pytest.mark.timeout(900)
def test_simulator_cases() -> None:
    root = HERE.parent.parent                        # node ids below are relative to it
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(root))
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    collected = subprocess.run(pytest_cmd + ["--collect-only", str(HERE / "sim_cases.py")], cwd=root,
                               env=env, capture_output=True, text=True, timeout=300)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    ids = [line.strip() for line in collected.stdout.splitlines() if "sim_cases.py::" in line]
    assert len(ids) >= 30, collected.stdout[-3000:]
    shards = [ids[i::SHARDS] for i in range(SHARDS)]
    procs = [subprocess.Popen(pytest_cmd + shard, cwd=root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for shard in shards if shard]
    outputs = [p.communicate(timeout=880)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-6000:]
