"""runtime/launch.py packs kernel parameters itself, in numba's ABI: for the signatures of a
spread of registered kernels (1-4-D arrays of four dtypes, int32 / float32 scalars), the packed
layout must have the kernel's PTX parameters, in order and of the same sizes (compile_ptx runs
without a GPU)."""
from __future__ import annotations

import re

import pytest

from ninfer_nb.kernels.common.registry import all_specs
from ninfer_nb.runtime.launch import param_layout

SPECS = all_specs()
_PTX_SIZES = {"u64": 8, "b64": 8, "s64": 8, "f64": 8, "u32": 4, "b32": 4, "s32": 4, "f32": 4,
              "u16": 2, "b16": 2, "s16": 2, "u8": 1, "b8": 1, "s8": 1}
_FMT_SIZES = {"q": 8, "Q": 8, "d": 8, "i": 4, "I": 4, "f": 4, "h": 2, "H": 2, "b": 1, "B": 1}
CASES = [(name, i) for name, spec in sorted(SPECS.items()) for i in range(len(spec.sigs))]
# a spread of kernels is enough to pin the ABI; the rest follow the same two rules
PICKED = {"rms_norm_kernel", "kv_store_kernel", "gdc_state_mma_kernel", "moe_router_fused_kernel",
          "moe_router_cluster_kernel",
          "attn_split_kernel", "gemv_bf16_kernel", "moe_route_kernel", "gdr_recurrent_kernel",
          "embedding_bf16_kernel"}
assert PICKED <= SPECS.keys()
CASES = [c for c in CASES if c[0] in PICKED]
pytestmark = pytest.mark.usefixtures("pretend_cc90_device")


@pytest.mark.parametrize("name,sig", CASES)
def test_packed_layout_matches_ptx_params(name: str, sig: int) -> None:
    from numba import cuda

    spec = SPECS[name]
    ptx, _ = cuda.compile_ptx(spec.entry(), spec.sigs[sig], cc=(9, 0), **spec.options)
    entry = ptx[ptx.index(".entry"):]
    params = re.findall(r"\.param\s+\.(\w+)\s", entry[:entry.index(")")])
    argtypes = spec.sigs[sig] if isinstance(spec.sigs[sig], tuple) else spec.sigs[sig].args
    kinds, fmt = param_layout(argtypes)
    slots = [c for c in fmt[1:] if c != "x" and not c.isdigit()]
    assert len(kinds) == len(argtypes)
    assert len(slots) == len(params), (fmt, params)
    assert [_FMT_SIZES[c] for c in slots] == [_PTX_SIZES[p] for p in params]
