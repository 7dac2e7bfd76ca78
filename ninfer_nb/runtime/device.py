"""Device selection and queries (`cuda`, `cuda:N`), through cuda.core / cuda.bindings.

`cuda_available()` never raises: it answers False on machines without a driver or GPU.
This module knows nothing about memory arenas, tensors or kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

from ninfer_nb.runtime._drv import check, driver


def cuda_available() -> bool:
    """True when a CUDA driver is present and reports at least one device. Never raises."""
    try:
        drv = driver()
        err = drv.cuInit(0)[0]
        if err != drv.CUresult.CUDA_SUCCESS:
            return False
        err, n = drv.cuDeviceGetCount()
        return err == drv.CUresult.CUDA_SUCCESS and n > 0
    except Exception:
        return False


def device_count() -> int:
    return int(check(driver().cuDeviceGetCount())) if cuda_available() else 0


def parse_device(spec: str | int | None) -> int:
    """'cuda' / 'cuda:N' / N / None -> device ordinal."""
    if spec is None or spec == "cuda":
        return 0
    if isinstance(spec, int):
        return spec
    if spec.startswith("cuda:") and spec[5:].isdigit():
        return int(spec[5:])
    raise ValueError(f"bad device {spec!r}: expected 'cuda' or 'cuda:N'")


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    total_bytes: int
    multiprocessors: int


_selected: int | None = None


def select(spec: str | int | None = None) -> DeviceInfo:
    """Make device `spec` current for cuda.core and numba (same primary context)."""
    global _selected
    if not cuda_available():
        raise RuntimeError("no CUDA device available")
    ordinal = parse_device(spec)
    n = device_count()
    if not 0 <= ordinal < n:
        raise ValueError(f"device cuda:{ordinal} does not exist ({n} device(s))")
    from cuda.core import Device
    from numba import cuda

    cuda.select_device(ordinal)
    Device(ordinal).set_current()
    _selected = ordinal
    return info(ordinal)


def current_ordinal() -> int:
    return 0 if _selected is None else _selected


def info(ordinal: int | None = None) -> DeviceInfo:
    drv = driver()
    o = current_ordinal() if ordinal is None else ordinal
    dev = check(drv.cuDeviceGet(o))
    raw = check(drv.cuDeviceGetName(256, dev))
    name = raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)
    attr = drv.CUdevice_attribute
    major = check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    sms = check(drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    total = check(drv.cuDeviceTotalMem(dev))
    return DeviceInfo(o, name, (int(major), int(minor)), int(total), int(sms))


def mem_info() -> tuple[int, int]:
    """(free, total) bytes of the current device (needs a current context, e.g. after select())."""
    free, total = check(driver().cuMemGetInfo())
    return int(free), int(total)
