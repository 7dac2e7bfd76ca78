"""The inline-PTX kernels assemble for sm_90a with ptxas, without register spills (no GPU needed).

compile_ptx (test_compile_ptx.py) only checks that NVVM produces PTX: inline asm is opaque to
it, so a malformed `wgmma` / `cp.async` / `mma` operand list would first fail on the GPU. ptxas
(from the `nvidia-cuda-nvcc` wheel, a test dependency) assembles it here and reports registers
and spills; the kernels whose speed depends on staying in registers must not spill.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ninfer_nb.kernels.common.registry import all_specs

SPECS = all_specs()
NO_SPILL = {"gemv_bf16_kernel", "gemv_bf16_splitk_kernel", "gemv_bf16_splitk2_kernel", "gemv_bf16_swiglu_kernel", "gemm_mma_kernel", "gemm_wgmma_kernel",
            "attn_split_kernel", "attn_split_mma_d64_kernel", "attn_split_mma_d256_kernel", "attn_combine_kernel", "moe_gate_up_unrolled_kernel",
            "attn_split_paged_kernel", "attn_split_mma_paged_d64_kernel", "attn_split_mma_paged_d256_kernel",
            "gemv_mma_kernel",
            "moe_gate_up_wide_kernel", "moe_down_wide_kernel",
            "moe_grouped_gate_up_kernel", "moe_grouped_down_kernel", "moe_mma_grouped_kernel", "moe_router_fused_kernel",
            "moe_router_cluster_kernel",
            "moe_wgmma_gate_up_kernel", "moe_wgmma_down_kernel", "gemm_wgmma_swiglu_kernel",
            "conv1d_tokens_k4_kernel", "add_rms_norm_rows_kernel", "flash_attn_kernel",
            "add_rms_norm_kernel", "gdc_prepare_mma_kernel",
            "gemv_bf16_plain_w2_b2_kernel", "gemv_bf16_plain_w2_b3_kernel", "gemv_bf16_normed_w1_b2_kernel",
            "gemv_bf16_swiglu_w1_b2_kernel", "gemv_bf16_plain_w2_b4_x4_kernel", "gemv_bf16_plain_w2_b6_x4_kernel", "gemv_bf16_plain_w1_b5_x4_kernel",
            "gemv_bf16_normed_w1_b4_x4_kernel", "gemv_bf16_swiglu_w1_b4_x4_kernel",
            "gemv_mma3_plain_x4_r2_u2_b4_kernel", "gemv_mma3_plain_x4_r1_u4_b4_kernel", "gemv_mma3_swiglu_x4_r2_u2_b4_kernel",
            "moe_rows_gate_up_kernel", "moe_rows_down_kernel"}
# simulator-safe kernels whose PTX intrinsics are emulated there (ptx_sim.py), assembled here too
SIM_EMULATED_PTX = {"gdc_state_mma_kernel", "gdc_prepare_mma_kernel"}
# the inline-PTX / shuffle ones, and the simulator-safe mma kernels (emulated there)
PTX_KERNELS = sorted(n for n, s in SPECS.items() if not s.sim or n in NO_SPILL or n in SIM_EMULATED_PTX)


def _ptxas() -> str | None:
    try:
        import nvidia.cu13  # the nvidia-cuda-nvcc wheel puts bin/ptxas here
        for root in nvidia.cu13.__path__:
            cand = Path(root) / "bin" / "ptxas"
            if cand.exists():
                return str(cand)
    except ImportError:
        pass
    return shutil.which("ptxas")


PTXAS = _ptxas()
pytestmark = [pytest.mark.skipif(PTXAS is None, reason="ptxas not installed (pip install nvidia-cuda-nvcc)"),
              pytest.mark.usefixtures("pretend_cc90_device")]


@pytest.mark.parametrize("name", PTX_KERNELS)
def test_assembles_for_sm90a(name: str, tmp_path: Path) -> None:
    from numba import cuda

    spec = SPECS[name]
    ptx, _ = cuda.compile_ptx(spec.entry(), spec.sigs[0], cc=(9, 0, "a"), **spec.options)
    src = tmp_path / f"{name}.ptx"
    src.write_text(ptx)
    r = subprocess.run([PTXAS, "-arch=sm_90a", "-v", str(src), "-o", str(tmp_path / f"{name}.cubin")],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "Unsupported .version" in r.stderr:
        pytest.skip(f"ptxas older than NVVM: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "serialized" not in r.stderr, r.stderr          # wgmma serialisation warning
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    assert regs and spills, r.stderr
    print(f"\n{name}: {regs.group(1)} registers, spills {spills.group(1)}/{spills.group(2)} B")
    if name in NO_SPILL:
        assert spills.group(1) == "0" and spills.group(2) == "0", r.stderr
