"""The simulator cases (the family modules tests/kernels/test_cases_*.py, test_norm.py, ...:
tests/support/sim_runner.py CASE_FILES) under the CUDA simulator, in subprocesses. In a
whole-suite run they were started in the background when the session began and this test,
moved to the end, collects their result; run on its own, or first in one pytest-xdist worker
(CI's -n 2, tests/conftest.py), it starts them here, one process per core."""
from __future__ import annotations

import os
import re

import pytest

from tests.support.sim_runner import BACKGROUND, MIN_CASES, SimulatorRun

PROCESSES = max(1, min(2, os.cpu_count() or 1))


@pytest.mark.timeout(900)
def test_simulator_cases() -> None:
    run = BACKGROUND.pop() if BACKGROUND else SimulatorRun(PROCESSES)
    assert not run.error, run.error
    results = run.wait(timeout=880)
    assert results
    passed = 0
    for code, out in results:
        assert code == 0, out[-6000:]
        counts = re.findall(r"(\d+) passed", out)
        assert counts, out[-3000:]
        passed += int(counts[-1])
    assert passed >= MIN_CASES, f"only {passed} simulator cases ran"
