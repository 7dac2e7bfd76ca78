"""Host-side resource probes for the performance monitor: GPU via NVML (pynvml, from
nvidia-ml-py) and this process's CPU % and RAM via psutil.

Every probe degrades to a reason string instead of raising: no NVML library, no driver,
no GPU, or a psutil failure all show as "unavailable" in the panel. Knows nothing about
the engine; the caller decides which device index to ask about.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class GpuStats:
    name: str
    memory_used: int
    memory_total: int
    utilization: int | None          # percent


@dataclass(frozen=True, slots=True)
class SystemStats:
    gpu: GpuStats | None = None
    gpu_note: str = ""               # why `gpu` is None
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    ram_total: int | None = None


class SystemProbe(Protocol):
    def sample(self) -> SystemStats: ...

    def close(self) -> None: ...


class _Nvml:
    """Lazily initialised NVML handle on one device index."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.note = ""
        self._lib: ModuleType | None = None
        self._handle: Any = None
        try:
            import pynvml
        except ImportError:
            self.note = "unavailable (nvidia-ml-py not installed)"
            return
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # pynvml raises NVMLError subclasses, and OSError-like loads
            self.note = f"unavailable ({_nvml_reason(exc)})"
            return
        self._lib = pynvml

    def sample(self) -> GpuStats | None:
        lib, h = self._lib, self._handle
        if lib is None:
            return None
        try:
            name = lib.nvmlDeviceGetName(h)
            mem = lib.nvmlDeviceGetMemoryInfo(h)
        except Exception as exc:
            self.note = f"unavailable ({_nvml_reason(exc)})"
            return None
        try:
            util: int | None = int(lib.nvmlDeviceGetUtilizationRates(h).gpu)
        except Exception:
            util = None  # some devices (MIG slices) report no utilisation
        text = name.decode() if isinstance(name, bytes) else str(name)
        return GpuStats(text, int(mem.used), int(mem.total), util)

    def close(self) -> None:
        if self._lib is not None:
            try:
                self._lib.nvmlShutdown()
            except Exception:
                pass  # shutting down a monitor must never fail the app
            self._lib = None


def _nvml_reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 40 else text[:39] + "…"


class LocalProbe:
    """Samples this machine: NVML when `gpu_index` is given, psutil for this process."""

    def __init__(self, gpu_index: int | None) -> None:
        self._nvml = _Nvml(gpu_index) if gpu_index is not None else None
        self._proc: Any = None
        try:
            import psutil

            self._proc = psutil.Process()
            self._proc.cpu_percent(None)  # first call primes the counter
            self._ram_total = int(psutil.virtual_memory().total)
        except Exception:
            self._proc = None
            self._ram_total = 0

    def sample(self) -> SystemStats:
        gpu = self._nvml.sample() if self._nvml is not None else None
        note = self._nvml.note if self._nvml is not None else "not used (CPU backend)"
        cpu: float | None = None
        rss: int | None = None
        if self._proc is not None:
            try:
                cpu = float(self._proc.cpu_percent(None))
                rss = int(self._proc.memory_info().rss)
            except Exception:
                cpu, rss = None, None
        return SystemStats(gpu, note, cpu, rss, self._ram_total or None)

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()


class RemoteProbe:
    """For --url mode: the engine's machine is not this one, so report nothing local."""

    def sample(self) -> SystemStats:
        return SystemStats(gpu_note="on the server (see /metrics)")

    def close(self) -> None:
        return None


def gpu_index(device: str) -> int | None:
    """NVML index for an engine device string: cuda:N -> N, cuda/auto -> 0, cpu -> None."""
    if device.startswith("cuda"):
        _, _, idx = device.partition(":")
        return int(idx) if idx.isdigit() else 0
    return None if device == "cpu" else 0
