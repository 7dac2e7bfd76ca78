"""Backends: where the model runs. `CpuBackend` runs `ops.cpu` on NumPy arrays (its linear
layers through ops/cpu_fast.py's few-row kernel, `CpuOps`).

Both backends implement the contract in engine/backends/base.py (`Backend`); the CPU one runs
every step eagerly: it has no decode graph, so the engine never queues a step ahead on it, and
its token ring picks on the host. `create_backend` picks the backend for a device string.
Knows nothing about requests.
"""
from __future__ import annotations

import collections
import os
from typing import Any, Sequence

import numpy as np

from ..config import ModelConfig
from ..errors import DeviceError
from ..models.presets import random_weights
from ..models.weights import ModelWeights
from ..ops import cpu, cpu_fast
from ..ops.kernel_choices import KernelChoices
from .backends.base import ARGMAX, Backend, Forward, Pick, RowsForward
from .sampler import gumbel_max_pick

__all__ = ["Backend", "CpuBackend", "create_backend"]


SPLIT_ROWS_BELOW = 2              # decode rounds of fewer rows run one row per forward (decode_rows)


class CpuOps:
    """ops.cpu, with the linear layers and the paged decode attention on ops/cpu_fast.py's
    kernels (the same contract; ops.cpu stays the reference). Other names resolve to ops.cpu
    at call time."""
    linear = staticmethod(cpu_fast.linear)
    linear_add = staticmethod(cpu_fast.linear_add)
    linear_swiglu = staticmethod(cpu_fast.linear_swiglu)
    linear_split = staticmethod(cpu_fast.linear_split)
    attention = staticmethod(cpu_fast.attention)
    attention_gated = staticmethod(cpu_fast.attention_gated)

    def __getattr__(self, name: str) -> Any:
        try:
            return vars(cpu)[name]
        except KeyError:
            raise AttributeError(f"ops.cpu has no {name!r}") from None


class CpuBackend:
    name = "cpu"
    device_name = "cpu"
    default_kv_cache = "fp32"      # NumPy computes in fp32; a bf16 cache would only add rounding
    ops: Any = CpuOps()
    decode_graphs = False

    def __init__(self) -> None:
        self._pick_vocab = 0
        self._picked: collections.deque[int] = collections.deque()   # the token ring's picks
        self._picked_rows: collections.deque[list[int]] = collections.deque()   # launched rounds' picks

    def check_model(self, cfg: ModelConfig) -> None:
        """Nothing to refuse: the NumPy ops take every shape the models have."""

    def begin_step(self) -> None:
        """Nothing to reset: NumPy allocates per op."""

    def zeros(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def upload(self, weights: ModelWeights) -> ModelWeights:
        """Host storage: quantized records as their float32 values (dequantized once here: the
        NumPy matmuls need float32, and dequantizing on every call costs more than the matmul);
        float32 matrices row-major [N, K] (ops/cpu_fast.py's few-row kernel reads them in place;
        BLAS takes w.T as a transposed operand); everything else as it is."""
        from ..models.weights import DenseWeight, QuantizedWeight, map_weights
        from ..quant.dequant import dequantize

        def host(w: Any) -> Any:
            if isinstance(w, QuantizedWeight):
                w = DenseWeight(dequantize(w), "f32")
            if isinstance(w, DenseWeight) and w.data.ndim == 2 and w.data.dtype == np.float32:
                return DenseWeight(np.ascontiguousarray(w.data), w.dtype)
            return w

        return map_weights(weights, host, lambda a: a)

    def random_weights(self, cfg: ModelConfig, seed: int = 0, weights: str | None = None) -> ModelWeights:
        """Random weights of a preset's shapes (benchmarks), see models/presets.py; `weights`: a
        quantized format for the matrices quant/random.py names (quantized to nearest)."""
        from ..quant.dequant import quantize
        from ..quant.formats import quant_format
        from ..quant.random import quantized_calls

        rng = np.random.default_rng(seed)
        fmt = quant_format(weights) if weights else None
        quantized = quantized_calls(cfg, fmt) if fmt is not None else frozenset()
        calls = [-1]

        def make(shape: tuple[int, ...], kind: str) -> Any:
            calls[0] += 1
            a = random_array(rng, shape, kind)
            return quantize(a, fmt) if fmt is not None and calls[0] in quantized else a

        return random_weights(cfg, make)

    def ids(self, tokens: list[int], start: int) -> tuple[np.ndarray, np.ndarray]:
        """token ids [T] int64 and their positions start..start+T-1."""
        return np.asarray(tokens, dtype=np.int64), np.arange(start, start + len(tokens), dtype=np.int64)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def copy_(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)

    def zero_(self, dst: np.ndarray) -> None:
        dst[...] = 0

    # --- decode steps: eager, the token picked on the host ----------------------------------
    def decode_step(self, forward: Forward, token: int, position: int) -> np.ndarray:
        self.begin_step()
        ids, pos = self.ids([token], position)
        return self.to_host(forward(ids, pos))[-1]

    def verify_step(self, forward: Forward, tokens: list[int], position: int, vocab: int = 0) -> np.ndarray:
        self.begin_step()
        ids, pos = self.ids(tokens, position)
        rows = np.asarray(self.to_host(forward(ids, pos)), dtype=np.float32)          # [n, V]
        return np.argmax(rows[:, :vocab], axis=1).astype(np.int32) if vocab else rows

    def time_verify_steps(self, n: int, vocab: int, replays: int = 16) -> float | None:
        return None                   # no graph to replay

    # --- decode rounds of several sequences: eager, picked on the host -------------------------
    def array(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.int32)

    def decode_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                    slots: Sequence[int], page_table: np.ndarray) -> np.ndarray:
        """A round of fewer than SPLIT_ROWS_BELOW rows runs row by row (one row alone); more rows
        in one forward: ops/cpu_fast.py's linear reads each weight once for all of them."""
        self.begin_step()
        ids, pos = np.asarray(tokens, dtype=np.int64), np.asarray(positions, dtype=np.int64)
        sl, table = np.asarray(slots, dtype=np.int32), np.asarray(page_table, dtype=np.int32)
        if len(ids) >= SPLIT_ROWS_BELOW:
            return np.asarray(self.to_host(forward(ids, pos, sl, table)), dtype=np.float32)
        rows = [forward(ids[b : b + 1], pos[b : b + 1], sl[b : b + 1], table[b : b + 1]) for b in range(len(ids))]
        return np.concatenate([np.asarray(r, dtype=np.float32) for r in rows], axis=0)

    def pick_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                  slots: Sequence[int], page_table: np.ndarray, picks: Sequence[Pick]) -> list[int]:
        if not self._pick_vocab:
            raise RuntimeError("pick_rows: enable_token_pick was not called")
        rows = self.decode_rows(forward, tokens, positions, slots, page_table)
        return [gumbel_max_pick(row[: self._pick_vocab], *pick) for row, pick in zip(rows, picks)]

    def launch_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                    slots: Sequence[int], page_table: np.ndarray, picks: Sequence[Pick]) -> None:
        self._picked_rows.append(self.pick_rows(forward, tokens, positions, slots, page_table, picks))

    def rows_ahead_ready(self) -> bool:
        return False                  # no graph: a round cannot be queued on unread picks

    def launch_rows_fed(self, page_table: np.ndarray) -> None:
        raise RuntimeError("launch_rows_fed: the CPU backend has no decode graph to feed itself")

    def collect_rows(self) -> list[int]:
        return self._picked_rows.popleft()

    def discard_rows(self) -> None:
        self._picked_rows.clear()

    @property
    def token_pick_vocab(self) -> int:
        return self._pick_vocab

    def enable_token_pick(self, vocab: int) -> None:
        self._pick_vocab = int(vocab)

    @property
    def graph_ready(self) -> bool:
        return False                  # no graph: a step cannot be queued on an unread token

    def launch_token_step(self, forward: Forward, token: int | None, position: int,
                          pick: Pick = ARGMAX) -> None:
        if token is None:
            raise RuntimeError("launch_token_step: the CPU backend has no decode graph to feed itself")
        if not self._pick_vocab:
            raise RuntimeError("launch_token_step: enable_token_pick was not called")
        row = self.decode_step(forward, token, position)[: self._pick_vocab]
        self._picked.append(gumbel_max_pick(row, *pick))

    def collect_token(self) -> int:
        return self._picked.popleft()

    def discard_tokens(self) -> None:
        self._picked.clear()

    def time_decode_steps(self, position: int, replays: int = 16) -> float | None:
        return None                   # no graph to replay

    def load_(self, dst: np.ndarray, host: np.ndarray) -> None:
        np.copyto(dst, host)

    def cache_budget(self) -> int | None:
        return None                   # host memory: caches sized by the context

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


def create_backend(device: str, *, choices: KernelChoices | None = None) -> Backend:
    """'cpu', 'cuda', 'cuda:N' or 'auto' (GPU when one is usable, else CPU). `choices`: the CUDA
    backend's kernel choices (ops/kernel_choices.py; the defaults when None)."""
    if device == "cpu":
        return CpuBackend()
    if device == "auto" or device.startswith("cuda"):
        usable = _cuda_usable()
        if device == "auto" and not usable:
            return CpuBackend()
        if not usable:
            raise DeviceError(f"--device {device}: no usable NVIDIA GPU / CUDA driver found")
        from .cuda_backend import CudaBackend

        index = int(device.split(":", 1)[1]) if ":" in device else 0
        return CudaBackend(index, choices=choices)
    raise DeviceError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)")


def _cuda_usable() -> bool:
    """A GPU and the CUDA driver answer (False where cuda-python is not installed)."""
    try:
        from ..runtime.device import cuda_available
    except ImportError:
        return False
    return bool(cuda_available())
