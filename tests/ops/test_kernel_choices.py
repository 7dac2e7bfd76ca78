"""KernelChoices: frozen, defaults the engine runs, and a ValueError naming a bad field."""
from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest

from ninfer_nb.ops.kernel_choices import KernelChoices


def test_defaults_are_the_engine_kernels() -> None:
    c = KernelChoices()
    assert (c.prefill_gemm, c.prefill_attention, c.decode_attention, c.pdl) == ("auto", "flash", "auto", True)


@pytest.mark.parametrize("field,value", [("prefill_gemm", "cublas"), ("prefill_attention", "naive"),
                                         ("decode_attention", "mma"), ("gdn_state", "auto"),
                                         ("gdn_prepare", "tf32"), ("pdl", "yes")])
def test_an_unknown_choice_names_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"KernelChoices.{field}"):
        KernelChoices(**{field: value})


def test_choices_are_frozen_and_replaced_whole() -> None:
    c = KernelChoices()
    with pytest.raises(FrozenInstanceError):
        c.prefill_gemm = "mma"  # type: ignore[misc]
    assert replace(c, decode_attention="simt").decode_attention == "simt"
    with pytest.raises(ValueError, match="gdn_state"):
        replace(c, gdn_state="fast")


def test_cuda_ops_take_choices_and_refuse_wgmma_off_hopper() -> None:
    from ninfer_nb.ops.cuda import CudaOps
    from tests.support.cuda_helpers import HostArena, SimStream

    ops = CudaOps(HostArena(), SimStream(), arch=(9, 0), choices=KernelChoices(prefill_gemm="wgmma"))
    assert ops.choices.prefill_gemm == "wgmma" and ops.use_wgmma
    assert not CudaOps(HostArena(), SimStream(), arch=(9, 0), choices=KernelChoices(prefill_gemm="mma")).use_wgmma
    with pytest.raises(ValueError, match="wgmma"):
        CudaOps(HostArena(), SimStream(), arch=(8, 0), choices=KernelChoices(prefill_gemm="wgmma"))
