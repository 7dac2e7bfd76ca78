"""Runs the simulator cases (CASE_FILES) under the CUDA simulator in subprocesses (the simulator must
be enabled before numba is imported, so it cannot share the test process), optionally in the
background while the rest of the suite runs.

The simulator is Python, one thread at a time: its cases are the largest part of the suite's CPU
time. tests/conftest.py starts it when the session begins
(with one process fewer than the machine's cores, so the suite keeps a core) and moves
test_simulator_cases to the end of the session, which then only collects the result. Run on
its own, the test starts the processes itself, on every core.

With more than one process, the cases are collected first and dealt longest first, each to the
process with the least work so far (SLOW_SECONDS: the slow cases' one-process times; 2 s for
the rest), so the two slowest cases do not land in the same process.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
# the simulator cases: the family modules whose cases run here and on the GPU (tests/kernels/device.py)
CASE_FILES = [ROOT / "tests" / "kernels" / name
              for name in ("test_cases_linear.py", "test_cases_attention.py", "test_cases_gdn.py",
                           "test_cases_moe.py", "test_cases_model.py", "test_norm.py", "test_sampling.py", "test_sample_pick.py", "test_gdn.py", "test_moe.py",
                           "test_linear.py", "gemv_quant_sim.py", "gemv_tiled_sim.py", "test_rope_table.py", "test_paged.py", "test_gemv_mma.py")]
# one-process seconds of the slower cases (per parametrized id; 2026-12-02, a loaded machine: the
# ratios matter); the others count SECONDS_DEFAULT
SLOW_SECONDS = {"test_whole_hybrid_model_prefill_chunk_matches_cpu": 61, "test_cuda_ops_route_quantized_records": 28,
                "test_prefill_flash_gqa2_d256": 29, "test_cuda_moe_experts_on_tiled_stacks": 23,
                "test_gemv_multi_token": 17, "test_gemv_t1_moe": 16, "test_attention_gemm_kernels": 16,
                "test_moe_experts_rows": 14, "test_gemv_quant_tokens": 13, "test_norms": 11,
                "test_moe_grouped_mma": 10, "test_decode_attention_mma": 10, "test_gemv_quant_one_token": 9,
                "test_gemv_one_token": 8, "test_attention_combine_many_splits": 8,
                "test_paged_gather_kv_equals_contiguous_gather": 7, "test_paged_decode_costs_what_contiguous_costs": 7,
                "test_paged_decode_attention": 7, "test_gdn_decode_slots": 7, "test_gated_delta_rule": 7,
                "test_pick_feed": 6, "test_gdn_decode_head": 6, "test_cuda_ops_one_token_on_gemv_t1": 6,
                "test_sample_pick_rows": 5, "test_gemv_tiled_moe": 5, "test_moe_route": 4, "test_gemv_mma4": 4,
                "test_gdr_prepare_mma_vs_simt_kernel": 4, "test_gdn_decode_head_snapshots": 4,
                "test_attention_qwen_dims": 4, "test_attention_prefill_chunk": 4, "test_attention_int8_kv": 4}
SECONDS_DEFAULT = 2.0
MIN_CASES = 30


def _env() -> dict[str, str]:
    return dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))


def _pytest_cmd() -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def shard(ids: list[str], n: int) -> list[list[str]]:
    """Longest-first greedy split of the case ids into n shards of similar total time."""
    def cost(node: str) -> float:
        name = node.split("::", 1)[1].split("[", 1)[0]
        return SLOW_SECONDS.get(name, SECONDS_DEFAULT)

    shards: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for node in sorted(ids, key=cost, reverse=True):
        i = load.index(min(load))
        shards[i].append(node)
        load[i] += cost(node)
    return [s for s in shards if s]


class SimulatorRun:
    """The simulator cases running in `processes` subprocesses, each writing to a temporary file."""

    def __init__(self, processes: int) -> None:
        self.error = ""
        if processes > 1:
            collected = subprocess.run(_pytest_cmd() + ["--collect-only"] + [str(f) for f in CASE_FILES], cwd=ROOT,
                                       env=_env(), capture_output=True, text=True, timeout=300)
            names = tuple(f"{f.name}::" for f in CASE_FILES)
            ids = [line.strip() for line in collected.stdout.splitlines() if any(n in line for n in names)]
            if collected.returncode != 0 or len(ids) < MIN_CASES:
                self.error = f"collecting the cases failed:\n{collected.stdout[-3000:]}{collected.stderr[-3000:]}"
                groups: list[list[str]] = []
            else:
                groups = shard(ids, processes)
        else:
            groups = [[str(f) for f in CASE_FILES]]
        self.logs: list[IO[str]] = []
        self.procs: list[subprocess.Popen[str]] = []
        for group in groups:
            log = tempfile.TemporaryFile("w+")
            self.logs.append(log)
            self.procs.append(subprocess.Popen(_pytest_cmd() + group, cwd=ROOT, env=_env(), stdout=log,
                                               stderr=subprocess.STDOUT, text=True))

    def wait(self, timeout: float) -> list[tuple[int, str]]:
        """(exit code, output) of each process, after waiting for all of them."""
        results = []
        for proc, log in zip(self.procs, self.logs):
            proc.wait(timeout=timeout)
            log.seek(0)
            results.append((proc.returncode, log.read()))
            log.close()
        return results

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


BACKGROUND: list[SimulatorRun] = []      # started by tests/conftest.py for this session
