"""LLMEngine: requests in, token ids out, one `step()` at a time.

`add_request` queues a `Request`; each `step()` advances the engine by one model call and
returns a `RequestOutput` per request that got a token or finished: a waiting request is
prefilled one chunk per step (after reusing the longest cached prefix) and gets its first token
from the host sampler after its last chunk; a running one gets its next token, picked in the decode graph when the request allows it (greedy, or
temperature alone: `Sampler.device_pick`), with the step after it queued ahead on the device
(`DecodeChoices.decode_ahead`), else sampled on the host from the logits row. A request with
a constraint (structured output) always samples on the host, its grammar masking each row, and
ends on EOS where the grammar may end (even with ignore_eos). A request
finishes on a stop token, on its token budget (max_tokens, or the context is full), when its
cancel flag is set (checked before its next token), or when the caller finishes it
(`finish`: the front door's stop strings). One request runs at a time; the others wait in
arrival order. Knows nothing about text.

Queued-ahead stop semantics (Generator.decode_token): a request that stops with a step queued
ahead leaves that step's token fed to the cache too; the next prompt reuses it or diverges
before it.
"""
from __future__ import annotations

import collections
import time
from dataclasses import dataclass

import numpy as np

from ..config import DecodeChoices, ModelConfig
from ..errors import ContextLengthExceededError
from ..models.decoder import Decoder
from ..models.state import KVDtype
from .backends.base import Backend
from .generator import Generator
from .request import Request, RequestOutput, RequestStatus
from .sampler import Sampler


@dataclass
class _Run:
    """The engine's side of a request: its sampler, its device pick, its stop ids and budget."""

    request: Request
    sampler: Sampler
    pick: tuple[float, int] | None         # (temperature, seed) picked on the device, or None
    stop_ids: frozenset[int]
    budget: int                            # tokens it may generate
    prefilling: bool = False               # its prefill started and has chunks left


class LLMEngine:
    def __init__(self, cfg: ModelConfig, decoder: Decoder, backend: Backend, *, max_context: int,
                 prefill_chunk: int, valid_vocab: int, eos_ids: frozenset[int], use_graphs: bool = True,
                 kv_dtype: KVDtype = "fp32", seed: int | None = None,
                 decode: DecodeChoices | None = None) -> None:
        self.model_config = cfg
        self.backend = backend
        self.max_context = max_context
        self.valid_vocab = valid_vocab        # ids the sampler may produce (not the LM head's padding)
        self.eos_ids = eos_ids
        self.seed = seed
        self.decode = decode = decode or DecodeChoices()
        if decode.device_pick:
            backend.enable_token_pick(valid_vocab)                # before the first decode step
        self.generator = Generator(cfg, decoder, backend, max_context, prefill_chunk,
                                   use_graphs=use_graphs, kv_dtype=kv_dtype)
        self._waiting: collections.deque[_Run] = collections.deque()
        self._running: _Run | None = None

    # --- requests ------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request (WAITING). Its prompt must leave room for one generated token."""
        n = len(request.prompt_ids)
        if n == 0 or n >= self.max_context:
            raise ContextLengthExceededError(
                f"prompt has {n} tokens; the context holds {self.max_context} "
                f"(including at least one generated token)")
        p = request.params.validate()
        matcher = request.constraint.matcher() if request.constraint is not None else None
        # a constrained request ends on EOS, which its grammar allows exactly where it may end
        stop_ids = set(p.stop_token_ids) | (set() if p.ignore_eos and matcher is None else set(self.eos_ids))
        sampler = Sampler(p, self.valid_vocab, seed=self.seed, matcher=matcher)
        # the pick kernel reads no token mask yet: a constrained request samples on the host
        pick = sampler.device_pick() if self.decode.device_pick and matcher is None else None
        if pick is not None and pick[0] > 0.0 and not self.generator.picks_on_device(self.valid_vocab):
            pick = None                          # no decode graph to sample in (CPU): the host samples
        request.status = RequestStatus.WAITING
        request.timings.prompt_tokens = n
        self._waiting.append(_Run(request, sampler, pick, frozenset(stop_ids),
                                  min(p.max_tokens, self.max_context - n)))

    def has_unfinished_requests(self) -> bool:
        return self._running is not None or bool(self._waiting)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Cancel a waiting or running request now; its final output (None if it is not here)."""
        return self.finish(request_id, RequestStatus.FINISHED_ABORTED)

    def finish(self, request_id: str, status: RequestStatus) -> RequestOutput | None:
        """End a request with `status` (the front door's stop string: FINISHED_STOPPED)."""
        if self._running is not None and self._running.request.request_id == request_id:
            return self._finish(self._running, status)
        for run in self._waiting:
            if run.request.request_id == request_id:
                self._waiting.remove(run)
                return self._finish(run, status)
        return None

    # --- the step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One model call: the running request's next token, or a prefill chunk of the next
        waiting one (its first token after the last chunk). [] when no request got a token."""
        run = self._running
        if run is None:
            if not self._waiting:
                return []
            run = self._running = self._waiting.popleft()
            run.request.status = RequestStatus.RUNNING
        req = run.request
        if req.cancel.is_set():
            return [self._finish(run, RequestStatus.FINISHED_ABORTED)]
        try:
            token = self._next_token(run)
            if token is None:                    # a prefill chunk, more to come
                return []
        except BaseException:
            self.generator.forget()              # the caches may be half-written
            self._finish(run, RequestStatus.FINISHED_ERROR)
            raise
        run.sampler.observe(token)
        req.output_ids.append(token)
        req.num_computed_tokens = len(self.generator.tokens)
        if token in run.stop_ids:
            return [self._finish(run, RequestStatus.FINISHED_STOPPED, [token])]
        if len(req.output_ids) >= run.budget:
            return [self._finish(run, RequestStatus.FINISHED_LENGTH, [token])]
        return [RequestOutput(req.request_id, [token])]

    def _next_token(self, run: _Run) -> int | None:
        req, gen = run.request, self.generator
        n = len(req.output_ids)
        if n == 0:
            if not run.prefilling:
                cached = gen.start_prefill(req.prompt_ids, req.turn_start)
                req.num_cached_tokens = req.timings.cached_tokens = cached
                run.prefilling = True
            logits = gen.prefill_step()
            req.num_computed_tokens = len(gen.tokens)
            if logits is None:
                return None
            run.prefilling = False
            req.timings.prefill_s = time.perf_counter() - req.arrival_time
            token = run.sampler.sample(logits)
            req.first_token_time = time.perf_counter()            # decode time runs from here
            req.timings.ttft_s = req.first_token_time - req.arrival_time
            return token
        last = req.output_ids[-1]
        if run.pick is not None:   # the step after the next token queued too, unless that token is the last
            temperature, seed = run.pick
            return gen.decode_token(last, self.valid_vocab, ahead=self.decode.decode_ahead and n + 1 < run.budget,
                                    temperature=temperature, seed=seed, offset=n)
        return run.sampler.sample(gen.decode(last))

    def _finish(self, run: _Run, status: RequestStatus, tokens: list[int] | None = None) -> RequestOutput:
        req = run.request
        req.status = status
        if self._running is run:
            self._running = None
        t = req.timings
        t.completion_tokens = n = len(req.output_ids)
        t.decode_s = time.perf_counter() - req.first_token_time if n > 1 and req.first_token_time else 0.0
        return RequestOutput(req.request_id, tokens or [], finished=True, finish_reason=status.finish_reason,
                             timings=t)

    # --- the cached sequence ----------------------------------------------------------------
    @property
    def picks_on_device(self) -> bool:
        """Decode steps pick their token in the decode graph (device_pick on a backend with graphs)."""
        return self.generator.picks_on_device(self.valid_vocab)

    @property
    def context_tokens(self) -> int:
        """Tokens whose effects are in the caches (the cached prefix)."""
        return len(self.generator.tokens)

    def forget(self) -> None:
        """Drop the cached prefix (the next prompt starts from an empty cache)."""
        self.generator.forget()

    def logits_all(self, token_ids: list[int]) -> np.ndarray:
        """Logits at every position of token_ids ([T, V]) from an empty cache."""
        return self.generator.logits_all(token_ids)
