"""Both backends provide every op of the contract (ops/base.py Ops) with compatible parameters:
the NumPy module ops.cpu, and CudaOps inspected as a class (no device needed)."""
from __future__ import annotations

import inspect
from typing import Any, Callable

import pytest

from ninfer_nb.ops import cpu
from ninfer_nb.ops.base import OP_NAMES, Ops
from ninfer_nb.ops.cuda import CudaOps


def _params(fn: Callable[..., Any], bound: bool) -> list[inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())
    return params[1:] if bound else params                  # drop `self` of a method


def incompatibilities(contract: Callable[..., Any], impl: Callable[..., Any], impl_is_method: bool) -> list[str]:
    """How `impl` fails to take every call the contract allows: the contract's parameters in
    order with the same names and kinds, a default wherever the contract has one; any extra
    parameter of the implementation must have a default."""
    want, have = _params(contract, True), _params(impl, impl_is_method)
    bad = []
    for i, p in enumerate(want):
        if i >= len(have):
            bad.append(f"missing parameter {p.name!r}")
            continue
        q = have[i]
        if (q.name, q.kind) != (p.name, p.kind):
            bad.append(f"parameter {i}: {q.name!r} ({q.kind.description}), contract {p.name!r} ({p.kind.description})")
        elif p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
            bad.append(f"parameter {p.name!r} needs a default")
    bad += [f"extra parameter {q.name!r} without a default" for q in have[len(want):]
            if q.default is inspect.Parameter.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
    return bad


def test_the_contract_lists_what_models_call() -> None:
    assert len(OP_NAMES) >= 20 and {"linear", "attention", "moe", "gdn_decode", "scope"} <= set(OP_NAMES)


@pytest.mark.parametrize("name", OP_NAMES)
def test_numpy_ops_satisfy_the_contract(name: str) -> None:
    assert callable(getattr(cpu, name, None)), f"ops.cpu has no {name}"
    bad = incompatibilities(getattr(Ops, name), getattr(cpu, name), False)
    assert not bad, f"ops.cpu.{name}: {bad}"


@pytest.mark.parametrize("name", OP_NAMES)
def test_cuda_ops_satisfy_the_contract(name: str) -> None:
    assert callable(getattr(CudaOps, name, None)), f"CudaOps has no {name}"
    bad = incompatibilities(getattr(Ops, name), getattr(CudaOps, name), True)
    assert not bad, f"CudaOps.{name}: {bad}"


def test_a_renamed_or_missing_parameter_is_caught() -> None:
    def renamed(x: Any, w: Any, bias: Any = None) -> Any: ...
    def no_default(x: Any, weight: Any, bias: Any) -> Any: ...
    def extra(x: Any, weight: Any, bias: Any = None, mode: Any = "a", other: Any = None) -> Any: ...
    def extra_required(x: Any, weight: Any, bias: Any, more: Any) -> Any: ...

    assert incompatibilities(Ops.linear, renamed, False)
    assert incompatibilities(Ops.linear, no_default, False)
    assert not incompatibilities(Ops.linear, extra, False)
    assert incompatibilities(Ops.linear, extra_required, False)
