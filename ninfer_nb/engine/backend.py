"""Backends: where the model runs. `CpuBackend` runs `ops.cpu` on NumPy arrays.

A backend provides the `ops` object the decoder calls, allocates cache buffers, uploads
weights, turns token ids / positions into its arrays and brings logits back to the host.
The CUDA backend (`runtime/`) implements the same surface. Knows nothing about requests.
"""
from __future__ import annotations

import os
from typing import Any, Protocol

import numpy as np

from ..errors import DeviceError
from ..config import ModelConfig
from ..models.presets import random_weights
from ..models.weights import ModelWeights
from ..ops import cpu


class Backend(Protocol):
    name: str
    device_name: str
    default_kv_cache: str          # the KV cache storage EngineConfig(kv_cache="auto") takes here
    ops: Any

    def check_model(self, cfg: ModelConfig) -> None: ...
    def begin_step(self) -> None: ...
    def zeros(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Any: ...
    def upload(self, weights: ModelWeights) -> ModelWeights: ...
    def ids(self, tokens: list[int], start: int) -> tuple[Any, Any]: ...
    def to_host(self, x: Any) -> np.ndarray: ...
    def copy_(self, dst: Any, src: Any) -> None: ...
    def memory_info(self) -> tuple[int | None, int | None]: ...


class CpuBackend:
    name = "cpu"
    device_name = "cpu"
    default_kv_cache = "fp32"      # NumPy computes in fp32; a bf16 cache would only add rounding
    ops = cpu

    def check_model(self, cfg: ModelConfig) -> None:
        """Nothing to refuse: the NumPy ops take every shape the models have."""

    def begin_step(self) -> None:
        """Nothing to reset: NumPy allocates per op."""

    def zeros(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def upload(self, weights: ModelWeights) -> ModelWeights:
        return weights

    def random_weights(self, cfg: ModelConfig, seed: int = 0) -> ModelWeights:
        """Random weights of a preset's shapes (benchmarks), see models/presets.py."""
        rng = np.random.default_rng(seed)
        return random_weights(cfg, lambda shape, kind: random_array(rng, shape, kind))

    def ids(self, tokens: list[int], start: int) -> tuple[np.ndarray, np.ndarray]:
        """token ids [T] int64 and their positions start..start+T-1."""
        return np.asarray(tokens, dtype=np.int64), np.arange(start, start + len(tokens), dtype=np.int64)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def copy_(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)

    def memory_info(self) -> tuple[int | None, int | None]:
        try:
            import psutil

            rss = psutil.Process(os.getpid()).memory_info().rss
            return int(rss), int(psutil.virtual_memory().total)
        except Exception:  # psutil missing or restricted /proc: report unknown
            return None, None


def random_scale(shape: tuple[int, ...], kind: str) -> tuple[float, float]:
    """(scale, offset) of the uniform values a random weight of this kind gets: matrices keep
    activations at unit variance (U(-a, a) with a = sqrt(3 / fan_in)); norms are 1."""
    if kind in ("matrix", "experts"):
        return float(np.sqrt(3.0 / shape[-1])), 0.0
    if kind == "norm":
        return 0.0, 1.0
    return 0.5, 0.0


def random_array(rng: np.random.Generator, shape: tuple[int, ...], kind: str) -> np.ndarray:
    scale, offset = random_scale(shape, kind)
    return (offset + scale * rng.uniform(-1.0, 1.0, shape)).astype(np.float32)


def create_backend(device: str, *, prefill_gemm: str = "auto", prefill_attention: str = "flash",
                   pdl: bool = True) -> Backend:
    """'cpu', 'cuda', 'cuda:N' or 'auto' (GPU when one is usable, else CPU). `prefill_gemm`
    (auto | mma | wgmma) and `prefill_attention` (flash | gemm | simt | mma) pick CUDA prefill
    kernels; `pdl`: programmatic dependent launch in the CUDA decode graph (cc >= 9.0)."""
    if device == "cpu":
        return CpuBackend()
    if device == "auto" or device.startswith("cuda"):
        try:
            from ..runtime.device import cuda_available
        except ImportError:
            cuda_available = None  # type: ignore[assignment]
        usable = bool(cuda_available and cuda_available())
        if device == "auto" and not usable:
            return CpuBackend()
        if not usable:
            raise DeviceError(f"--device {device}: no usable NVIDIA GPU / CUDA driver found")
        from .cuda_backend import CudaBackend

        index = int(device.split(":", 1)[1]) if ":" in device else 0
        return CudaBackend(index, prefill_gemm=prefill_gemm, prefill_attention=prefill_attention, pdl=pdl)
    raise DeviceError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)")
