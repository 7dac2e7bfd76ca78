"""Runs tests/kernels/sim_cases.py under the CUDA simulator, in subprocesses (the simulator
must be enabled before numba is imported, so it cannot share this process).

The cases are collected once, then run in up to SHARDS concurrent processes: the simulator is
single-threaded Python. On this project's 2-core machine two shards took 171-182 s against
370-407 s for one process. Cases are dealt to the shards longest first, each to the shard with
the least work so far (SLOW_SECONDS: the slow cases' one-process times; 1 s for the rest), so
the two slowest cases do not land in the same shard as round-robin over the file order can."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SHARDS = max(1, min(2, os.cpu_count() or 1))
# one-process seconds of the slow cases on this project's machine (2026-11-30)
SLOW_SECONDS = {"test_whole_hybrid_model_prefill_chunk_matches_cpu": 103, "test_prefill_flash_gqa2_d256": 76,
                "test_moe_grouped_top2_hot_expert": 28, "test_gdr_chunked_tensor_core_state": 25,
                "test_sampling": 22, "test_norms": 18, "test_gdr_prepare_mma_vs_simt_kernel": 17,
                "test_gdr_chunked_tensor_core_prepare": 17, "test_attention_gemm_kernels": 15,
                "test_moe_grouped_top4": 14, "test_prefill_mma_int8_d256": 11, "test_prefill_mma_bf16_gqa3_d64": 10,
                "test_decode_attention_mma": 27, "test_attention_combine_many_splits": 15}


def _shards(ids: list[str], n: int) -> list[list[str]]:
    """Longest-first greedy split of the case ids into n shards of similar total time."""
    def cost(node: str) -> float:
        name = node.split("::", 1)[1].split("[", 1)[0]
        return SLOW_SECONDS.get(name, 1.0)

    shards: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for node in sorted(ids, key=cost, reverse=True):
        i = load.index(min(load))
        shards[i].append(node)
        load[i] += cost(node)
    return shards


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
    shards = _shards(ids, SHARDS)
    procs = [subprocess.Popen(pytest_cmd + shard, cwd=root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for shard in shards if shard]
    outputs = [p.communicate(timeout=880)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-6000:]
