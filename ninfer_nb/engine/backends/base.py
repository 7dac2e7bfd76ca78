"""The backend contract: what the engine asks of the place the model runs.

A backend provides the `ops` object the decoder calls, allocates and copies cache buffers,
uploads weights, turns token ids / positions into its arrays and brings logits back. Decode
steps go through `decode_step` (CUDA: one graph replay; CPU: eager) or, when the backend picks
the next token itself, through the token ring: `launch_token_step` enqueues a step and the copy
of its picked token, `collect_token` waits for the oldest one; with a captured graph
(`graph_ready`) a step can be queued on the token the previous one picked, before the host has
read it. `CpuBackend` (engine/backend.py) and `CudaBackend` (engine/cuda_backend.py) implement
all of it; tests/engine/test_backend_protocol.py checks both against this class. Knows nothing
about requests, sampling parameters or text.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ...config import ModelConfig
from ...models.weights import ModelWeights
from ..pick import ARGMAX, Pick, PickFilters

# forward(ids [T], positions [T]) -> logits ([T, V] or [1, V]) as the backend's array
Forward = Callable[[Any, Any], Any]
# forward_rows(ids [B], positions [B], slots [B] int32, page_table [B, P] int32) -> logits [B, V]:
# one decode round of B sequences (ForwardBatch.rows), the backend's arrays in and out
RowsForward = Callable[[Any, Any, Any, Any], Any]


# a token pick (temperature, seed, offset, filters): engine/pick.py
__all__ = ["ARGMAX", "Backend", "Forward", "Pick", "PickFilters", "RowsForward"]


class Backend(Protocol):
    name: str                      # "cpu" | "cuda"
    device_name: str
    default_kv_cache: str          # the KV cache storage EngineConfig(kv_cache="auto") takes here
    ops: Any                       # the op set models/ call (ops.cpu or CudaOps)
    decode_graphs: bool            # decode steps replay a captured graph (False: eager launches)

    # --- model and memory -----------------------------------------------------------------
    def check_model(self, cfg: ModelConfig) -> None:
        """Refuse (UnsupportedModelError) a model whose shapes this backend cannot run."""
        ...

    def upload(self, weights: ModelWeights) -> ModelWeights: ...

    def random_weights(self, cfg: ModelConfig, seed: int = 0, weights: str | None = None) -> ModelWeights:
        """Random weights of a preset's shapes (benchmarks), made where they will be used;
        `weights`: a quantized format for the matrices quant/random.py names (None: dense)."""
        ...

    def zeros(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Any: ...

    def copy_(self, dst: Any, src: Any) -> None:
        """dst := src (same shape and dtype), ordered with the steps."""
        ...

    def zero_(self, dst: Any) -> None:
        """dst := 0, ordered with the steps."""
        ...

    def memory_info(self) -> tuple[int | None, int | None]:
        """(bytes used, bytes total) of the device memory; None where unknown."""
        ...

    def load_(self, dst: Any, host: np.ndarray) -> None:
        """dst := the host array `host` (same shape and dtype), ordered with the steps."""
        ...

    def cache_budget(self) -> int | None:
        """Bytes of device memory still free for caches (the KV page pool of paged lanes), or
        None where the engine sizes them by the context alone (the CPU)."""
        ...

    # --- eager steps ------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Start a model step: the per-step scratch is handed back."""
        ...

    def ids(self, tokens: list[int], start: int) -> tuple[Any, Any]:
        """token ids [T] and their positions start .. start + T - 1, as the backend's arrays."""
        ...

    def to_host(self, x: Any) -> np.ndarray: ...

    # --- decode steps -----------------------------------------------------------------------
    def decode_step(self, forward: Forward, token: int, position: int) -> np.ndarray:
        """Feed one token at `position`; the logits row [V] after it."""
        ...

    def verify_step(self, forward: Forward, tokens: list[int], position: int, vocab: int = 0) -> np.ndarray:
        """Feed `tokens` [n] at positions position.. in one forward that returns logits at every
        one (a speculative verify round); vocab > 0: each row's argmax over ids < vocab ([n]
        int32, lowest id on ties), else the logits rows [n, V] fp32. CUDA: a graph per n."""
        ...

    def time_verify_steps(self, n: int, vocab: int, replays: int = 16) -> float | None:
        """Device time (us) of the n-token verify graph replayed back to back (it rewrites the
        caches at its last call's positions); None without a captured graph."""
        ...

    # --- decode rounds of several sequences (the scheduler's paged path) ----------------------
    def array(self, x: np.ndarray) -> Any:
        """A small int32 host array (a prefill chunk's page table [1, P]) as the backend's array."""
        ...

    def decode_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                    slots: Sequence[int], page_table: np.ndarray) -> np.ndarray:
        """One decode round: sequence b feeds tokens[b] at positions[b], its GDN state in slot
        slots[b] and its KV through page_table[b] (host [B, P] int32, P fixed: the pages of
        the engine's maximum context). The logits rows [B, V] fp32 on the host. CUDA: the
        graph captured for batch size B, its inputs copied into the graph's buffers."""
        ...

    def pick_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                  slots: Sequence[int], page_table: np.ndarray, picks: Sequence[Pick]) -> list[int]:
        """decode_rows with each row's next token picked where the logits are (picks[b] =
        (temperature, seed, offset), as launch_token_step's) over ids < token_pick_vocab: B
        ids come back, not the rows."""
        ...

    def launch_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                    slots: Sequence[int], page_table: np.ndarray, picks: Sequence[Pick]) -> None:
        """pick_rows without waiting: the round and the copy of its B picks back are enqueued;
        collect_rows reads them (CUDA: a pinned ring slot; rounds without logprobs or grammar)."""
        ...

    def rows_ahead_ready(self) -> bool:
        """launch_rows_fed can continue the last launched round (its graph is captured)."""
        ...

    def launch_rows_fed(self, page_table: np.ndarray) -> None:
        """Enqueue the last launched round again on the picks it fed back (the same rows, one
        token further; page_table [B, P]: the rows' tables now), before those are read."""
        ...

    def collect_rows(self) -> list[int]:
        """The B picks of the oldest uncollected launch (waits for that round alone)."""
        ...

    def discard_rows(self) -> None:
        """Forget uncollected launches (their rounds still run; nobody reads their picks)."""
        ...

    @property
    def token_pick_vocab(self) -> int:
        """> 0: launch_token_step picks over ids below it (enable_token_pick); 0: not enabled."""
        ...

    def enable_token_pick(self, vocab: int) -> None:
        """Let decode steps pick their next token over ids < vocab (before the first decode step)."""
        ...

    @property
    def graph_ready(self) -> bool:
        """A step can be queued on the token the last one picked (launch_token_step(None))."""
        ...

    def launch_token_step(self, forward: Forward, token: int | None, position: int,
                          pick: Pick = ARGMAX) -> None:
        """Enqueue one decode step that picks its next token, and the copy of that token back.
        token None: the step reads the token and position the previous step left (needs
        graph_ready). Collect each launch's token, in order, with collect_token."""
        ...

    def collect_token(self) -> int:
        """The token of the oldest uncollected launch_token_step (waits for that step alone)."""
        ...

    def discard_tokens(self) -> None:
        """Forget uncollected launches (a run stopped with a step queued ahead)."""
        ...

    def time_decode_steps(self, position: int, replays: int = 16) -> float | None:
        """Device time (us) of one decode step, the graph replayed back to back from `position`
        (each replay fed by the last one's pick); it writes the caches past what the engine
        knows, so the caller forgets its cached prefix. None without a graph to replay."""
        ...
