"""The GPU backend: the decoder's ops as Numba kernels on one device (ops/cuda.py).

One device arena is taken at start; weights (bf16 matrices, fp32 vectors), caches and the GDN
state live in it, and a scratch region is reset at the start of every model step, so a step
allocates the same addresses each time (graph-capturable). Implements engine/backends/base.py
`Backend`: decode by graph replay, the token pick in the graph and the pinned token ring of the
steps queued ahead. Knows nothing about requests.
"""
from __future__ import annotations

import collections
import functools
import os
import threading
from typing import Any, Callable, Sequence

import numpy as np

from ..models.weights import ModelWeights
from ..ops.kernel_choices import KernelChoices
from .backends.base import ARGMAX, Forward, Pick, RowsForward

# Share of the free device memory taken at start, and the part of it kept for per-step scratch.
ARENA_FRACTION = 0.90


def arena_fraction() -> float:
    """The share of free device memory the arena takes: NINFER_ARENA_FRACTION (0 < f <= 1) lets
    several processes share one GPU (e.g. GPU tests under pytest-xdist), else ARENA_FRACTION."""
    raw = os.environ.get("NINFER_ARENA_FRACTION", "")
    if not raw:
        return ARENA_FRACTION
    value = float(raw)
    if not 0 < value <= 1:
        raise ValueError(f"NINFER_ARENA_FRACTION must be in (0, 1], got {raw}")
    return value


def arena_size(free: int) -> int:
    """The arena's bytes: NINFER_ARENA_GIB (a fixed size, so xdist workers sharing one GPU each
    get the same arena whatever the others hold), else free memory times arena_fraction()."""
    raw = os.environ.get("NINFER_ARENA_GIB", "").strip()
    if not raw:
        return int(free * arena_fraction())
    gib = float(raw)
    if gib <= 0:
        raise ValueError(f"NINFER_ARENA_GIB must be > 0, got {raw}")
    return min(int(gib * (1 << 30)), free)


SCRATCH_FRACTION = 0.25
SCRATCH_MAX = 24 << 30
TOKEN_RING = 4                 # token slots of the steps queued ahead (2 are ever in flight)
LP_SLOT = 4 * (1 + 2 * 20)     # bytes of a slot's logprobs: [21] fp32 and [20] int32 (device_pick.LOGPROBS_TOP)


def _on_calling_thread(method: Callable[..., Any]) -> Callable[..., Any]:
    """Make the backend's context current on the calling thread first. The CUDA driver binds a
    context per thread, and a backend may be built on one thread and driven from another (the
    server loads the engine on its main thread and runs requests on the engine worker); numba
    used to bind it implicitly on its first launch in a thread, which direct launches
    (runtime/launch.py) and the driver calls before them do not. One set lookup per call on a
    thread already bound."""
    @functools.wraps(method)
    def bound(self: "CudaBackend", *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() not in self._threads:
            self._bind_calling_thread()
        return method(self, *args, **kwargs)

    return bound


class _MultiStep:
    """A captured multi-token forward: its device inputs, its argmax outputs, its graph."""

    def __init__(self, ids: Any, pos: Any, picks: Any) -> None:
        self.ids, self.pos, self.picks = ids, pos, picks       # [n] int32 each
        self.warmed = False
        self.graph: Any = None
        self.out: Any = None


class CudaBackend:
    name = "cuda"
    decode_graphs = True
    device_name: str
    ops: Any
    # bf16 K / V: half the cache bytes, and decode attention on tensor cores; the prefill flash
    # attention rounds K / V to bf16 whatever the cache holds.
    default_kv_cache = "bf16"

    def __init__(self, index: int = 0, *, arena_bytes: int | None = None,
                 choices: KernelChoices | None = None) -> None:
        from ..ops.cuda import CudaOps
        from ..runtime import device as dev
        from ..runtime._drv import check, driver
        from ..runtime.arena import DeviceArena
        from ..runtime.stream import Stream

        info = dev.select(index)
        self._context = check(driver().cuCtxGetCurrent())      # the primary context select made current
        self._threads = {threading.get_ident()}
        self.device_name = info.name
        self.stream = Stream()
        free, _ = dev.mem_info()
        size = arena_bytes or arena_size(free)
        self.arena = DeviceArena(size)
        self.scratch = self.arena.carve(min(int(size * SCRATCH_FRACTION), SCRATCH_MAX))
        self.ops = CudaOps(self.scratch, self.stream, persistent=self.arena,
                           arch=info.compute_capability, sm_count=info.multiprocessors,
                           choices=choices)
        self.pdl = self.ops.choices.pdl   # decode graph with programmatic dependent launch (cc >= 9.0)
        self._inputs: tuple[Any, Any] | None = None
        self._graph: Any = None
        self._graph_out: tuple[Any, ...] = (None, None)   # the captured step's (logits, pick[, logprobs, ids])
        # the decode graph's two builds, without and with logprobs (ops.token_logprobs after the
        # pick): (graph, outputs) each; _graph / _graph_out are the build the last step took
        self._graphs: dict[bool, tuple[Any, tuple[Any, ...]]] = {}
        self._lp_warmed = False
        self._masked = False            # the last host-fed pick applied a grammar's bitmask
        # Grammar picks take the split build: the forward and the pick as two graphs per
        # logprobs kind ((forward, pick, outputs)), so a device-fed step's forward runs while
        # the host computes its bitmask; its pick is launched once the mask is known
        # (_launch_deferred, from the next launch or collect).
        self._split: dict[bool, tuple[Any, Any, tuple[Any, ...]]] = {}
        self._mask_pick: Any = None     # the host-fed grammar pick the device-fed steps continue
        self._deferred: int | None = None   # the ring slot of a step whose pick waits for its mask
        # > 0: the decode graph ends with the token pick over the first pick_vocab logits
        # (launch_token_step); set by enable_token_pick before the first decode step
        self._pick_vocab = 0
        # the token pick's parameters in device memory (the graph's sampler reads them; written
        # from the Pick of each host-fed step): engine/device_pick.py
        self._picker: Any = None
        self._warmed = False            # the first decode step runs eagerly (compiles kernels)
        # Decode steps queued ahead (launch_token_step / collect_token): each launched step's token
        # comes back through its own slot of a pinned ring, signalled by that slot's event.
        self._ring: Any = None          # PinnedBuffer of TOKEN_RING int32 slots
        self._ring_events: list[Any] = []
        self._lp_ring: Any = None       # PinnedBuffer: per slot the step's logprobs and their ids
        self._ring_picks: list[Any] = [None] * TOKEN_RING   # per slot: the Pick whose logprobs came back
        self._lp_pick: Any = None       # the last host-fed Pick when it asks for logprobs
        self._pending: collections.deque[int] = collections.deque()   # launched, uncollected slots
        self._launches = 0
        # multi-token forwards (speculative verify rounds): one graph per (tokens, argmax) key
        self._multi: dict[tuple[int, int], _MultiStep] = {}
        self._rows: Any = None          # engine/rows_graphs.py: the B-row decode rounds' graphs
        self._greedy: tuple[Any, Any, Any, Any, Any] | None = None   # argmax pick inputs, see _argmax_rows

    def _bind_calling_thread(self) -> None:
        from ..runtime._drv import check, driver

        check(driver().cuCtxSetCurrent(self._context))
        self._threads.add(threading.get_ident())

    def check_model(self, cfg: Any) -> None:
        """Refuse, before any weight goes up, a model whose shapes the kernels cannot run
        (ops/cuda.py unsupported_shapes: UnsupportedModelError naming each value). Pure: no
        device call, so it runs on any thread and without a GPU."""
        from ..ops.cuda import check_model

        check_model(cfg)

    @_on_calling_thread
    def begin_step(self) -> None:
        self.scratch.reset()

    @_on_calling_thread
    def decode_step(self, forward: Forward, token: int, position: int) -> np.ndarray:
        """One decode step by CUDA-graph replay; returns the logits row [V]. The first step runs
        eagerly on the persistent input buffers (compiling every kernel); the second captures
        `forward` once (capture records, it does not execute) and every step from then on is
        one replay. Token and position are written into device buffers the graph reads. With
        `pdl` (cc >= 9.0) the graph's kernels are captured as programmatic dependent launches:
        each kernel's blocks are scheduled while the one before it drains, instead of after it
        has completed."""
        logits, _ = self._step(forward, token, position)
        return self.to_host(logits)[-1]

    def _step(self, forward: Forward, token: int, position: int, pick: Pick = ARGMAX) -> tuple[Any, ...]:
        """(logits [1, V], the picked token [1] int32 or None[, logprobs [1, 21], ids [1, 20]])
        of one decode step on the device, its inputs written by the host: token, position and
        (pick_vocab > 0) the pick's (temperature, seed, offset, filters); temperature 0 is the
        argmax. A pick that asks for logprobs takes the graph's build that computes them."""
        from ..runtime.graph import CudaGraph
        from .device_pick import wants_logprobs

        if self._inputs is None:
            self._inputs = (self.ops.zeros((1,), np.int32, persistent=True),
                            self.ops.zeros((1,), np.int32, persistent=True))
        ids, pos = self._inputs
        ids.copy_from_numpy(np.array([token], np.int32), self.stream)
        pos.copy_from_numpy(np.array([position], np.int32), self.stream)
        lp = False
        if self._pick_vocab:
            self._device_picker().write([pick])
            lp = wants_logprobs([pick])
            self._masked = pick[3] is not None and pick[3].matcher is not None
        self.scratch.reset()
        if not self._warmed or (lp and not self._lp_warmed):
            self._warmed = True
            self._lp_warmed |= lp
            # no build of this kind to replay yet: nothing may be queued on this step
            self._graph, self._graph_out = self._graphs.get(lp, (None, (None, None)))
            return self._forward_argmax(forward, ids, pos, lp)()
        if self._masked:
            return self._split_step(forward, ids, pos, lp)
        if lp not in self._graphs:
            graph = CudaGraph(self.stream)
            with self.ops.programmatic_launches(self.pdl):
                out = graph.capture(self._forward_argmax(forward, ids, pos, lp))
            self._graphs[lp] = (graph, out)
        self._graph, self._graph_out = self._graphs[lp]
        self._graph.replay()
        return self._graph_out

    def _split_step(self, forward: Forward, ids: Any, pos: Any, lp: bool) -> tuple[Any, ...]:
        """A host-fed grammar step by the split build (captured on its first use: the forward,
        then the pick on the forward's logits, one scratch layout without a reset between)."""
        from ..runtime.graph import CudaGraph

        if lp not in self._split:
            fwd, pick = CudaGraph(self.stream), CudaGraph(self.stream)
            step = self._forward_argmax(forward, ids, pos, lp)
            with self.ops.programmatic_launches(self.pdl):      # each graph's first kernel: a plain edge
                logits = fwd.capture(lambda: step(pick_only=False))
            with self.ops.programmatic_launches(self.pdl):
                outs = pick.capture(lambda: step(pick_only=True, logits=logits))
            self._split[lp] = (fwd, pick, outs)
        fwd, pick, outs = self._split[lp]
        fwd.replay()
        pick.replay()
        return outs

    def _launch_deferred(self) -> None:
        """The pick of the device-fed grammar step whose forward was launched last: its bitmask
        from the grammar now (the host has observed the token before it), uploaded without a
        sync, then the pick graph and the copies of its token (and logprobs) into its slot."""
        slot, self._deferred = self._deferred, None
        assert slot is not None and self._mask_pick is not None
        pick = self._mask_pick
        self._device_picker().bufs.put_mask_async(0, pick.filters.matcher.allowed_tokens())
        lp = pick.filters.logprobs >= 0
        _, graph, outs = self._split[lp]
        graph.replay()
        self._device_picker().stepped(1)
        self._copy_back(slot, outs, pick if lp else None)

    def _device_picker(self) -> Any:
        if self._picker is None:
            from .device_pick import DevicePicker

            self._picker = DevicePicker(self.ops, 1, self._pick_vocab)
        return self._picker

    def _forward_argmax(self, forward: Forward, ids: Any, pos: Any, lp: bool = False) -> Callable[..., Any]:
        """forward, then (pick_vocab > 0) the token the graph's sampler picks from the last
        row's first pick_vocab logits with the pick's parameters (ops.sample_pick: argmax, or a
        sample with the pick's temperature, filters and penalties), fed back into ids / pos
        for a replay the host has not fed; lp: then its logprobs (ops.token_logprobs)."""
        from .device_pick import LOGPROBS_TOP

        vocab = self._pick_vocab

        def step(pick_only: bool | None = None, logits: Any = None) -> Any:
            """The whole step; pick_only False: the forward alone (its logits), True: the pick
            alone on `logits`."""
            if not pick_only:
                logits = forward(ids, pos)
            if pick_only is False:
                return logits
            if not vocab:
                return logits, None
            row = logits[logits.shape[0] - 1:]                          # [1, V]
            top = self.ops.sample_pick(row, vocab, self._device_picker().bufs, ids, pos)
            if not lp:
                return logits, top
            return (logits, top, *self.ops.token_logprobs(row, vocab, top, LOGPROBS_TOP))

        return step

    # --- decode steps queued ahead (the graph's token pick feeds the next step) -------------
    @property
    def token_pick_vocab(self) -> int:
        return self._pick_vocab

    def enable_token_pick(self, vocab: int) -> None:
        """The decode graph ends with the token pick over ids < vocab; before it is captured."""
        if self._warmed and vocab != self._pick_vocab:
            raise RuntimeError("enable_token_pick: the decode graph has already been built")
        self._pick_vocab = int(vocab)

    @property
    def graph_ready(self) -> bool:
        """The decode graph is captured: a step can be replayed on the inputs the last one fed
        (after a grammar's pick: its split build, whose pick waits for the next bitmask)."""
        if self._masked:
            return self._pick_vocab > 0 and (self._mask_pick.filters.logprobs >= 0) in self._split
        return self._graph is not None and self._pick_vocab > 0

    @_on_calling_thread
    def launch_token_step(self, forward: Forward, token: int | None, position: int,
                          pick: Pick = ARGMAX) -> None:
        """Enqueue one decode step that picks its next token on the device, and the copy of
        that token into a pinned slot; does not wait for it. token None: the step reads the
        token, position and pick offset the previous step left in the graph inputs (needs
        graph_ready), so it can be queued while that step still runs and the device never
        waits for the host between tokens. Else the host writes token, position and pick =
        (temperature, seed, offset) (this syncs the stream), and the step may be the eager
        warm-up or the capture. Collect each launch's token, in order, with collect_token."""
        from ..runtime.events import Event
        from ..runtime.pinned import PinnedBuffer
        from .device_pick import wants_logprobs

        if self._ring is None:
            self._ring = PinnedBuffer(4 * TOKEN_RING)
            self._ring_events = [Event(timing=False) for _ in range(TOKEN_RING)]
        if len(self._pending) >= TOKEN_RING:
            raise RuntimeError("launch_token_step: every token slot is in flight (collect first)")
        if token is None:
            if not self.graph_ready:
                raise RuntimeError("launch_token_step: a device-fed step needs the captured decode graph")
            if self._masked:                  # the step before it takes its pick now, this one its forward
                if self._deferred is not None:
                    self._launch_deferred()
                self._split[self._mask_pick.filters.logprobs >= 0][0].replay()
                slot = self._launches % TOKEN_RING
                self._launches += 1
                self._deferred = slot
                self._pending.append(slot)
                return
            self._graph.replay()
            self._device_picker().stepped(1)
            out = self._graph_out
        else:
            self._deferred = None
            out = self._step(forward, token, position, pick)
            if out[1] is None:
                raise RuntimeError("launch_token_step: enable_token_pick was not called before the first decode step")
            self._lp_pick = pick if wants_logprobs([pick]) else None
            self._mask_pick = pick if self._masked else None
        slot = self._launches % TOKEN_RING
        self._launches += 1
        self._copy_back(slot, out, self._lp_pick if len(out) > 2 else None)
        self._pending.append(slot)

    def _copy_back(self, slot: int, out: tuple[Any, ...], lp_pick: Any) -> None:
        """The step's token (and, lp_pick given, its logprobs) into ring slot `slot`, then the
        slot's event."""
        from ..runtime._drv import check, driver
        from ..runtime.pinned import PinnedBuffer

        check(driver().cuMemcpyDtoHAsync(self._ring.ptr + 4 * slot, out[1].ptr, 4, self.stream.cu))
        self._ring_picks[slot] = None
        if lp_pick is not None:                      # the build with logprobs: bring them too
            values, ids = out[2], out[3]
            if self._lp_ring is None:
                self._lp_ring = PinnedBuffer(TOKEN_RING * LP_SLOT)
            base = self._lp_ring.ptr + slot * LP_SLOT
            check(driver().cuMemcpyDtoHAsync(base, values.ptr, values.nbytes, self.stream.cu))
            check(driver().cuMemcpyDtoHAsync(base + values.nbytes, ids.ptr, ids.nbytes, self.stream.cu))
            self._ring_picks[slot] = lp_pick
        self._ring_events[slot].record(self.stream)

    @_on_calling_thread
    def collect_token(self) -> int:
        """The token of the oldest uncollected launch_token_step (waits for that step alone)."""
        from .device_pick import LOGPROBS_TOP, deliver_logprobs

        if self._pending and self._pending[0] == self._deferred:
            self._launch_deferred()           # its pick was waiting for this: the bitmask now
        slot = self._pending.popleft()
        self._ring_events[slot].synchronize()
        token = int(self._ring.array(4 * TOKEN_RING).view(np.int32)[slot])
        pick = self._ring_picks[slot]
        if pick is not None:                  # its logprobs: [1 + top] fp32, then [top] int32
            raw = self._lp_ring.array(TOKEN_RING * LP_SLOT)[slot * LP_SLOT:(slot + 1) * LP_SLOT]
            values = raw[: 4 * (1 + LOGPROBS_TOP)].view(np.float32).reshape(1, -1)
            ids = raw[4 * (1 + LOGPROBS_TOP):].view(np.int32).reshape(1, -1)
            deliver_logprobs([pick], np.array([token]), values, ids)
        return token

    def discard_tokens(self) -> None:
        """Forget uncollected launches (a run that stopped with a step ahead in flight: its
        token is not wanted; the stream orders everything after it; a grammar step waiting for
        its mask keeps its forward, fed, and never picks)."""
        self._pending.clear()
        self._deferred = None

    @_on_calling_thread
    def time_decode_steps(self, position: int, replays: int = 16) -> float | None:
        from ..runtime.events import Event

        if self._graph is None or self._inputs is None or not self.graph_ready:
            return None
        ids, pos = self._inputs
        ids.copy_from_numpy(np.array([1], np.int32), self.stream)
        pos.copy_from_numpy(np.array([position], np.int32), self.stream)
        self._graph.replay()                                     # warm
        e0 = Event().record(self.stream)
        for _ in range(replays):
            self._graph.replay()
        e1 = Event().record(self.stream)
        return float(e0.elapsed_ms(e1) * 1e3 / replays)

    # --- multi-token forwards: a speculative verify round (B = 1, n = K + 1 tokens) ------------
    @_on_calling_thread
    def verify_step(self, forward: Forward, tokens: list[int], position: int, vocab: int = 0) -> np.ndarray:
        """Feed `tokens` at positions position.. in one forward that returns logits at every
        one (`forward` must); vocab > 0: the argmax of each row over ids < vocab ([n] int32,
        lowest id on ties; n * 4 bytes come back), else the logits rows [n, V] fp32. By graph
        replay, one graph per (n, argmax or not): the first call of a key runs eagerly
        (compiles the n-token kernels), the second captures, later ones replay."""
        from ..runtime.graph import CudaGraph

        n = len(tokens)
        key = (n, int(vocab))
        step = self._multi.get(key)
        if step is None:
            step = self._multi[key] = _MultiStep(self.ops.zeros((n,), np.int32, persistent=True),
                                                 self.ops.zeros((n,), np.int32, persistent=True),
                                                 self.ops.zeros((n,), np.int32, persistent=True))
        step.ids.copy_from_numpy(np.asarray(tokens, np.int32), self.stream)
        step.pos.copy_from_numpy(np.arange(position, position + n, dtype=np.int32), self.stream)

        def run() -> Any:
            logits = forward(step.ids, step.pos)                            # [n, V]
            if vocab:
                self._argmax_rows(logits, vocab, step.picks)
                return step.picks
            return logits

        self.scratch.reset()
        if not step.warmed:
            step.warmed = True
            out = run()
        elif step.graph is None:
            graph = CudaGraph(self.stream)
            with self.ops.programmatic_launches(self.pdl):
                step.out = graph.capture(run)
            step.graph = graph
            graph.replay()
            out = step.out
        else:
            step.graph.replay()
            out = step.out
        return self.to_host(out)

    def _argmax_rows(self, logits: Any, vocab: int, picks: Any) -> None:
        """picks[i] := argmax of logits[i, :vocab] (the decode graph's pick kernel at temperature
        0, one launch per row; its feed-back writes the token into picks[i])."""
        if self._greedy is None:
            self._greedy = (self.ops.zeros((1,), np.float32, persistent=True),     # temperature 0
                            self.ops.zeros((1,), np.int64, persistent=True),       # seed (unread)
                            self.ops.zeros((1,), np.int64, persistent=True),       # offset (unread)
                            self.ops.zeros((1,), np.int32, persistent=True),       # block counter
                            self.ops.zeros((1,), np.int32, persistent=True))       # fed position (unread)
        temperature, seed, offset, counter, pos = self._greedy
        flat = logits.reshape(-1)
        v = logits.shape[1]
        for i in range(logits.shape[0]):
            row = flat[i * v : i * v + vocab].reshape(1, vocab)                 # [1, vocab]
            self.ops.pick_feed(row, temperature, seed, offset, counter, picks[i : i + 1], pos)

    @_on_calling_thread
    def time_verify_steps(self, n: int, vocab: int, replays: int = 16) -> float | None:
        """Device time (us) of the captured n-token verify graph replayed back to back at the
        inputs of its last call (it rewrites the caches at those positions); None if not
        captured yet."""
        from ..runtime.events import Event

        step = self._multi.get((n, int(vocab)))
        if step is None or step.graph is None:
            return None
        step.graph.replay()
        e0 = Event().record(self.stream)
        for _ in range(replays):
            step.graph.replay()
        e1 = Event().record(self.stream)
        return float(e0.elapsed_ms(e1) * 1e3 / replays)

    @_on_calling_thread
    def zeros(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        return self.ops.zeros(shape, dtype, persistent=True)

    def upload(self, weights: ModelWeights) -> ModelWeights:
        """Every weight into the arena in the storage engine/upload_policy.py gives it."""
        from .upload_policy import upload_weights

        out = upload_weights(weights, lambda a, dtype: self.ops.from_numpy(a, dtype))
        self.stream.synchronize()
        return out

    def random_weights(self, cfg: Any, seed: int = 0, weights: str | None = None) -> ModelWeights:
        """Random weights of a preset built directly in device memory (storage: upload_policy);
        `weights`: a quantized format (quant/formats.py) for the matrices quant/random.py names."""
        from ..kernels.random_fill import fill_uniform_bf16_kernel, fill_uniform_f32_kernel
        from ..models.presets import LINEAR_KINDS, random_weights
        from ..models.weights import DenseWeight, map_weights
        from ..quant.formats import quant_format
        from ..quant.random import group_scale, quantized_calls
        from ..runtime.tensor import bfloat16
        from .backend import random_scale
        from .upload_policy import random_storage

        counter = [seed * 1_000_003]
        fmt = quant_format(weights) if weights else None
        quantized = quantized_calls(cfg, fmt) if fmt is not None else frozenset()
        calls = [-1]

        def make(shape: tuple[int, ...], kind: str) -> Any:
            scale, offset = random_scale(shape, kind)
            calls[0] += 1
            if fmt is not None and calls[0] in quantized:
                counter[0] += 1
                return self._random_quantized(shape, fmt, group_scale(fmt, scale), counter[0])
            storage = random_storage(shape, kind)
            t = self.arena.empty(shape, bfloat16 if storage == "bf16" else np.float32)
            counter[0] += 1
            spec = fill_uniform_bf16_kernel if storage == "bf16" else fill_uniform_f32_kernel
            spec[1024, 256, self.stream.numba](t.reshape(-1), np.int64(counter[0]),
                                               np.float32(scale), np.float32(offset))
            return DenseWeight(t, storage) if kind in LINEAR_KINDS else t

        out = random_weights(cfg, make)
        # what presets computes rather than draws (the rotary table) is a host array: upload it
        out = map_weights(out, lambda w: w, lambda a: self.ops.from_numpy(a, np.float32)
                          if isinstance(a, np.ndarray) else a)
        self.stream.synchronize()
        return out

    def _random_quantized(self, shape: tuple[int, ...], fmt: Any, scale: float, seed: int) -> Any:
        """A random weight in `fmt` in device memory, in the tiled layout the kernels read
        (quant/random.py random_tiled): uniform random codes, every group's scale `scale`."""
        from ..kernels.linear.gemv_tiled import fp8_finite_codes_kernel
        from ..kernels.random_fill import fill_random_u32_kernel
        from ..quant.random import random_tiled

        def fill(codes: Any) -> None:
            words = codes.reshape(-1).view(np.uint32)
            fill_random_u32_kernel[1024, 256, self.stream.numba](words, np.int64(seed))
            if fmt.layout == "fp8-block":
                fp8_finite_codes_kernel[1024, 256, self.stream.numba](words)

        return random_tiled(shape, fmt, scale, self.arena.empty, fill, self.ops.from_numpy)

    @_on_calling_thread
    def ids(self, tokens: list[int], start: int) -> tuple[Any, Any]:
        from ..runtime.tensor import Tensor

        ids = np.asarray(tokens, dtype=np.int32)
        pos = np.arange(start, start + len(tokens), dtype=np.int32)
        ids_t = self.ops.from_numpy(ids, persistent=False)
        pos_t = self.ops.from_numpy(pos, persistent=False)
        if isinstance(pos_t, Tensor):
            pos_t.host = pos                   # sizes the prefill attention GEMMs (CudaOps)
        return ids_t, pos_t

    # --- decode rounds of several sequences: one graph per batch size (engine/rows_graphs.py) --
    @_on_calling_thread
    def array(self, x: np.ndarray) -> Any:
        return self.ops.from_numpy(np.ascontiguousarray(x, dtype=np.int32), persistent=False)

    def _rows_graphs(self) -> Any:
        if self._rows is None:
            from .rows_graphs import RowsGraphs

            self._rows = RowsGraphs(self.ops, self.stream, self.scratch, self.pdl)
        return self._rows

    @_on_calling_thread
    def decode_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                    slots: Sequence[int], page_table: np.ndarray) -> np.ndarray:
        return np.asarray(self._rows_graphs().run(forward, tokens, positions, slots, page_table), dtype=np.float32)

    @_on_calling_thread
    def pick_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                  slots: Sequence[int], page_table: np.ndarray, picks: Sequence[Pick]) -> list[int]:
        if not self._pick_vocab:
            raise RuntimeError("pick_rows: enable_token_pick was not called")
        out = self._rows_graphs().run(forward, tokens, positions, slots, page_table, picks, self._pick_vocab)
        return [int(x) for x in out]

    # rounds queued ahead: launch (host-fed), launch_rows_fed (on the picks the last one fed
    # back), collect_rows (the oldest launch's picks); engine/rows_graphs.py
    @_on_calling_thread
    def launch_rows(self, forward: RowsForward, tokens: Sequence[int], positions: Sequence[int],
                    slots: Sequence[int], page_table: np.ndarray, picks: Sequence[Pick]) -> None:
        if not self._pick_vocab:
            raise RuntimeError("launch_rows: enable_token_pick was not called")
        self._rows_graphs().launch(forward, tokens, positions, slots, page_table, picks, self._pick_vocab)

    def rows_ahead_ready(self) -> bool:
        return self._rows is not None and self._rows.ahead_ready()

    @_on_calling_thread
    def launch_rows_fed(self, page_table: np.ndarray) -> None:
        self._rows_graphs().launch_fed(page_table)

    @_on_calling_thread
    def collect_rows(self) -> list[int]:
        return [int(x) for x in self._rows_graphs().collect()]

    def discard_rows(self) -> None:
        if self._rows is not None:
            self._rows.discard()

    @_on_calling_thread
    def time_decode_rounds(self, batch: int, picked: bool = True, replays: int = 16) -> float | None:
        """Device time (us) of the captured B-row decode round replayed back to back; None if
        that round has not been captured."""
        return None if self._rows is None else self._rows.time_rounds(batch, picked, replays)

    @_on_calling_thread
    def to_host(self, x: Any) -> np.ndarray:
        return self.ops.to_numpy(x)

    @_on_calling_thread
    def copy_(self, dst: Any, src: Any) -> None:
        from ..runtime._drv import check, driver

        check(driver().cuMemcpyDtoDAsync(dst.ptr, src.ptr, src.nbytes, self.stream.cu))

    @_on_calling_thread
    def zero_(self, dst: Any) -> None:
        from ..runtime._drv import check, driver

        check(driver().cuMemsetD8Async(dst.ptr, 0, dst.nbytes, self.stream.cu))

    @_on_calling_thread
    def load_(self, dst: Any, host: np.ndarray) -> None:
        dst.copy_from_numpy(host, self.stream)        # waits for the stream's earlier steps

    def cache_budget(self) -> int | None:
        """What the persistent arena has left (the weights and earlier buffers are in it)."""
        return self.arena.capacity - self.arena.used

    def memory_info(self) -> tuple[int | None, int | None]:
        from ..runtime import device as dev

        free, total = dev.mem_info()
        return total - free, total
