"""kernels/linear/gemv_quant.py: the quantized decode GEMVs and the prefill dequantization.

- the simulator cases (tests/kernels/gemv_quant_sim.py, in a subprocess with
  NUMBA_ENABLE_CUDASIM=1) against quant/dequant.py + NumPy on fresh random data;
- every registered build compiles to PTX without float64 instructions and assembles for
  sm_90a with ptxas without register spills (prints registers / spills per build);
- on the GPU (`-m gpu`): CudaOps' quantized linear ops vs the NumPy reference at the 27B and
  35B-A3B shapes, printing GB/s of the quantized bytes from a CUDA graph of the GEMV.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ninfer_nb.kernels.linear import gemv_quant as K_q

ROOT = Path(__file__).resolve().parents[2]
BUILD_NAMES = sorted({K_q.gemv_quant(*b).name for b in K_q.BUILDS} | {K_q.dequant_bf16_kernel.name})


def test_simulator_cases() -> None:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "kernels" / "gemv_quant_sim.py")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-2000:]


def _spec(name: str):
    from ninfer_nb.kernels.common.registry import all_specs
    return all_specs()[name]


@pytest.mark.usefixtures("pretend_cc90_device")
@pytest.mark.parametrize("name", BUILD_NAMES)
def test_ptx_has_no_float64_and_assembles_without_spills(name: str, tmp_path: Path) -> None:
    from numba import cuda

    from tests.kernels.test_ptxas import PTXAS

    spec = _spec(name)
    ptx, _ = cuda.compile_ptx(spec.entry(), spec.sigs[0], cc=(9, 0, "a"), **spec.options)
    ops = set(re.findall(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)", ptx, re.M))
    assert not sorted(op for op in ops if ".f64" in op), f"{name}: float64 instructions"
    if PTXAS is None:
        pytest.skip("ptxas not installed (pip install nvidia-cuda-nvcc)")
    src = tmp_path / f"{name}.ptx"
    src.write_text(ptx)
    r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / f"{name}.cubin")],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "Unsupported .version" in r.stderr:
        pytest.skip(f"ptxas older than NVVM: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    assert regs and spills, r.stderr
    print(f"\n{name}: {regs.group(1)} registers, spills {spills.group(1)}/{spills.group(2)} B")
    assert spills.group(1) == "0" and spills.group(2) == "0", r.stderr


def test_builds_reject_unknown_modes() -> None:
    with pytest.raises(ValueError):
        K_q.gemv_quant(4, "normed", 4, 1, 8, 2)          # normed input: one token only
    with pytest.raises(ValueError):
        K_q.gemv_quant(3, "plain", 1, 1, 4, 4)
