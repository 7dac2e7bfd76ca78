"""Every registered kernel compiles to PTX with its real signatures (no GPU needed).

Every kernel compiles for cc 9.0 (sm_90a, as numba builds it for the H200) with its first signature. With NINFER_SLOW_SIM=1 also its other
signatures, and the targets 8.9, 8.0 and 12.0 for the kernels that use warp shuffles or inline
PTX (`sim=False` in the registry, and the `self_sync` ones that run in the simulator on
ptx_sim's stand-ins), whose code is what could differ between architectures; the plain
kernels' PTX does not depend on the target.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ninfer_nb.kernels.common.registry import all_specs

SPECS = all_specs()
SLOW = os.environ.get("NINFER_SLOW_SIM") == "1"
# every kernel with its first signature; its other signatures (dtype variants) with NINFER_SLOW_SIM=1
CASES_90 = [(n, i) for n, s in sorted(SPECS.items()) for i in range(len(s.sigs) if SLOW else 1)]
# the other targets (RTX 4090 / A100 before Hopper, RTX 5090 after) only with NINFER_SLOW_SIM=1:
# each recompiles every warp-level kernel (~125 s of CI time)
OTHER_CC = [(8, 9), (8, 0), (12, 0)] if SLOW else []
pytestmark = pytest.mark.usefixtures("pretend_cc90_device")


def test_registry_is_complete() -> None:
    import inspect

    import ninfer_nb.kernels.common.registry as reg

    assert len(SPECS) >= 25
    for m in reg.MODULES:
        mod = __import__(f"ninfer_nb.kernels.{m}", fromlist=["x"])
        src = inspect.getsource(mod)
        n_specs = sum(1 for s in SPECS.values() if s.fn.__module__ == mod.__name__)
        # every decorated kernel is registered; factories (`kernel(...)(fn)`) add one per variant
        assert n_specs >= max(1, src.count("@kernel(")), m
    here = Path(reg.__file__).parent.parent           # no kernel module is missing from MODULES
    for path in sorted(here.rglob("*.py")):
        if path.stem not in ("registry", "__init__") and "@kernel(" in path.read_text():
            dotted = ".".join(path.relative_to(here).with_suffix("").parts)
            assert dotted in reg.MODULES, dotted


@pytest.mark.parametrize("name,i", CASES_90, ids=[f"{n}-{i}" for n, i in CASES_90])
def test_compile_sm90(name: str, i: int) -> None:
    # sm_90a: what numba builds for a cc 9.0 device (the H200), and what test_ptxas assembles
    ptx = SPECS[name].compile_ptx(SPECS[name].sigs[i], (9, 0, "a"))
    assert ".entry" in ptx and ".target sm_90a" in ptx
    _assert_waits_before_memory(ptx, name)
    if name not in FLOAT64_BY_DESIGN:
        _assert_no_float64(ptx, name)


# Kernels whose float64 arithmetic is meant. Anywhere else a float64 instruction is a Numba
# typing slip (a Python float constant such as math.inf or LOG2E, float32 / int64, a float32
# compared with an int): the router's top-k and the flash attention's exponent had them.
FLOAT64_BY_DESIGN = {
    "rope_kernel": "the angle position * (table hi + lo) and its reduction mod 2 pi in float64 (rope_angle)",
    "qk_norm_rope_store_kernel": "the same RoPE angle",
    "qk_norm_rope_store_paged_kernel": "the same RoPE angle",
    "kv_store_int8_kernel": "round() goes through float64; the codes must equal ops.cpu's np.rint",
    "fill_uniform_f32_kernel": "bench's random weights: the uniform value from the hash in float64",
    "fill_uniform_bf16_kernel": "the same",
    "add_rms_norm_kernel": "1 / rms in float64 (ss / d); in float32 ptxas spills 4 bytes at the 1024-thread "
                           "block's 64 registers (prefill, bandwidth-bound)",
}


def _assert_no_float64(ptx: str, name: str) -> None:
    body = ptx[ptx.index(".entry"):]
    ops = [line.split()[0] for line in body.splitlines() if line.strip().endswith(";") and line.split()]
    f64 = sorted({op for op in ops if ".f64" in op})
    assert not f64, f"{name}: float64 instructions {f64} (see FLOAT64_BY_DESIGN)"


# weights only: ptx.ldg_stream_v4_u32, and gemv_tiled's shared-memory weight ring (cp.async with an L2
# prefetch size), whose commit / wait groups touch no global memory of their own
WEIGHT_STREAM_LOADS = ("ld.global.nc.L1::no_allocate", "cp.async.cg.shared.global.L2::256B",
                       "cp.async.ca.shared.global.L2::128B")
CP_ASYNC_GROUPS = ("cp.async.commit_group", "cp.async.wait_group", "cp.async.wait_all")
# self_sync kernels that also read, before the wait, data written two or more launches back
# (their docstrings say why that is complete): any global load, still no store or shared access
EARLY_READERS = {"moe_down_wide_kernel", "gdn_decode_kernel", "gdn_decode_slots_kernel", "gdn_decode_head_slots_kernel"}


# global memory only: a block's shared memory is its own, no earlier kernel can touch it
_MEMORY_OPS = ("ld.global", "st.global", "atom.global", "red.global", "cp.async", "ld.volatile.global")


def _basic_blocks(body: str) -> tuple[list[list[str]], list[list[int]]]:
    """A kernel body's PTX as basic blocks (instruction lines) and each block's successors: a
    new block at every label; a branch ends one (`@%p bra L`: L and the next block; `bra L`:
    L); `ret` / `exit` end the path."""
    blocks: list[list[str]] = [[]]
    labels: dict[str, int] = {}
    for raw in body.splitlines():
        line = raw.strip()
        if line.startswith("$") and line.endswith(":"):
            if blocks[-1]:
                blocks.append([])
            labels[line[:-1]] = len(blocks) - 1
        elif line and not line.startswith("//"):
            blocks[-1].append(line)
            if line.split()[-2:-1] == ["bra"] or " bra" in line or line.startswith(("bra", "ret", "exit")):
                blocks.append([])
    succ: list[list[int]] = []
    for i, blk in enumerate(blocks):
        last = blk[-1].rstrip(";") if blk else ""
        nxt = [i + 1] if i + 1 < len(blocks) else []
        words = last.split()
        if any(w.startswith("bra") for w in words):
            succ.append([labels[words[-1]]] + (nxt if last.startswith("@") else []))
        elif last.startswith(("ret", "exit")):
            succ.append([])
        else:
            succ.append(nxt)
    return blocks, succ


def _assert_waits_before_memory(ptx: str, name: str) -> None:
    """Programmatic dependent launch is safe only if the kernel waits (griddepcontrol.wait)
    before its first global memory access on every path from the entry: the previous kernel
    may still run. A self_sync kernel may stream weights, and only weights,
    before it waits.
    Paths, not text order: LLVM may place a later block before the wait in the text (it put a
    down-projection kernel's epilogue there for sm_120). Every thread must wait, also one
    whose streaming loop has no iterations."""
    body = ptx[ptx.index(".entry"):]
    assert "griddepcontrol.wait;" in body, name
    self_sync = SPECS[name].self_sync
    if self_sync:
        for op in WEIGHT_STREAM_LOADS:
            body = body.replace(op, "weight-stream-load")
        for op in CP_ASYNC_GROUPS:
            body = body.replace(op, "async-copy-group")
        if name in EARLY_READERS:
            body = body.replace("ld.global", "early-load")
    blocks, succ = _basic_blocks(body[body.index("{") + 1:])     # past the parameter list
    seen: set[int] = set()
    todo = [0]
    streams_early = False
    while todo:                                                    # the blocks reached before a wait
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        for line in blocks[i]:
            if "griddepcontrol.wait;" in line:
                break
            assert not any(op in line for op in _MEMORY_OPS), f"{name}: global access before the wait: {line}"
            streams_early |= "weight-stream-load" in line
        else:
            todo += succ[i]
    assert streams_early or not self_sync, f"{name}: self_sync but no weight load before the wait"


_HEAD = ".visible .entry k(\n.param .u64 p\n)\n{\n"


def test_wait_check_follows_paths_not_text() -> None:
    """The PDL check on hand-written PTX: a store after the wait passes; a branch around the
    wait to a store fails; an epilogue laid out before the wait in the text but reached only
    through it passes; a loop whose body waits, entered or skipped, fails (the skip path)."""
    name = "rms_norm_kernel"                        # a plain (not self_sync) kernel
    ok = _HEAD + "griddepcontrol.wait;\nst.global.f32 [%rd1], %f1;\nret;\n}"
    _assert_waits_before_memory(ok, name)
    skip = _HEAD + ("@%p1 bra $L__BB0_2;\ngriddepcontrol.wait;\n$L__BB0_2:\n"
                    "st.global.f32 [%rd1], %f1;\nret;\n}")
    with pytest.raises(AssertionError, match="before the wait"):
        _assert_waits_before_memory(skip, name)
    epilogue_first = _HEAD + ("bra.uni $L__BB0_3;\n$L__BB0_2:\nst.global.f32 [%rd1], %f1;\nret;\n"
                              "$L__BB0_3:\ngriddepcontrol.wait;\nbra.uni $L__BB0_2;\n}")
    _assert_waits_before_memory(epilogue_first, name)
    loop = _HEAD + ("setp.ge.s32 %p1, %r1, %r2;\n@%p1 bra $L__BB0_3;\n$L__BB0_2:\ngriddepcontrol.wait;\n"
                    "ld.global.f32 %f1, [%rd2];\n@%p2 bra $L__BB0_2;\n$L__BB0_3:\nst.global.f32 [%rd1], %f1;\n"
                    "ret;\n}")
    with pytest.raises(AssertionError, match="before the wait"):
        _assert_waits_before_memory(loop, name)
    # a self_sync kernel may fill its weight ring with L2-prefetching cp.async before the wait;
    # a plain cp.async (any other data) there fails
    streaming = next(n for n, s in sorted(SPECS.items()) if s.self_sync and n not in EARLY_READERS)
    ring = _HEAD + ("cp.async.cg.shared.global.L2::256B [%r1], [%rd2], 16;\ncp.async.commit_group;\n"
                    "griddepcontrol.wait;\nst.global.f32 [%rd1], %f1;\nret;\n}")
    _assert_waits_before_memory(ring, streaming)
    with pytest.raises(AssertionError, match="before the wait"):
        _assert_waits_before_memory(ring.replace(".L2::256B", ""), streaming)


def check_other_target(cc: tuple[int, int]) -> None:
    """Compile every sim=False or self_sync kernel for cc, in a process whose current device has
    that cc (run by test_compile_other_targets in a fresh interpreter)."""
    for name, spec in sorted(SPECS.items()):
        if spec.sim and not spec.self_sync:      # self_sync ones: their own wait is checked below
            continue
        ptx = spec.compile_ptx(spec.sigs[0], cc)
        assert f".target sm_{cc[0]}{cc[1]}" in ptx, name
        if cc >= (9, 0):
            _assert_waits_before_memory(ptx, name)
        else:                                   # griddepcontrol and clusters do not exist before sm_90
            assert "griddepcontrol" not in ptx and "barrier.cluster" not in ptx and "mapa" not in ptx, name


@pytest.mark.parametrize("cc", OTHER_CC, ids=[f"sm{a}{b}" for a, b in OTHER_CC])
def test_compile_other_targets(cc: tuple[int, int]) -> None:
    """In a fresh interpreter that pretends its device has compute capability cc: numba
    compiles device functions once, for the current device's cc (not the kernel's target), so
    a process with a cc 9.0 device would hand its sm_90 helpers (the self_sync GEMVs'
    griddepcontrol) to an sm_80 kernel. On a real sm_80 GPU the current device is sm_80,
    which is what this reproduces."""
    import subprocess
    import sys

    code = ("import types\n"
            "import numba.cuda.dispatcher as disp\n"
            f"disp.get_current_device = lambda: types.SimpleNamespace(compute_capability={cc!r})\n"
            "from tests.kernels.test_compile_ptx import check_other_target\n"
            f"check_other_target({cc!r})\n")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
