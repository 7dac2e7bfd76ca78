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

Speculative decoding (spec="ngram", CPU / eager backends): a running request on the host
sampler path drafts up to `draft_tokens` tokens by prompt lookup (engine/spec/ngram.py); one
step then verifies them in one forward and returns every token it kept plus one
(engine/spec/verify.py), and the generator rolls the caches back past the rejected ones. No
draft: a plain step. Backends with decode graphs (CUDA) decode plainly: the verify has no
graph yet and has not been run on the GPU. Tokens after a stop token within a round stay in the
cache, like a queued-ahead step's.

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
from ..errors import ContextLengthExceededError, InvalidRequestError
from ..models.decoder import Decoder
from ..models.state import KVDtype
from .backends.base import Backend
from .generator import Generator
from .output_hooks import sampler_for
from .request import Request, RequestOutput, RequestStatus
from .sampler import Sampler
from .spec import Proposer
from .spec.ngram import NgramProposer
from .spec.stats import SpecStats
from .spec.verify import verify_drafts

SPEC_KINDS = ("off", "ngram")


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
                 decode: DecodeChoices | None = None, spec: str = "off", draft_tokens: int = 3) -> None:
        self.model_config = cfg
        self.backend = backend
        self.max_context = max_context
        self.valid_vocab = valid_vocab        # ids the sampler may produce (not the LM head's padding)
        self.eos_ids = eos_ids
        self.seed = seed
        self.decode = decode = decode or DecodeChoices()
        if decode.device_pick:
            backend.enable_token_pick(valid_vocab)                # before the first decode step
        if spec not in SPEC_KINDS:
            raise InvalidRequestError(f"spec must be one of {', '.join(SPEC_KINDS)}, got {spec!r}")
        if spec != "off" and draft_tokens < 1:
            raise InvalidRequestError(f"draft_tokens must be >= 1, got {draft_tokens}")
        # the proposer, when speculation runs here (None: plain decode; CUDA declines, see above)
        self.proposer: Proposer | None = NgramProposer() if spec == "ngram" and not backend.decode_graphs else None
        self.draft_tokens = draft_tokens
        self.spec_stats = SpecStats()
        self.generator = Generator(cfg, decoder, backend, max_context, prefill_chunk,
                                   use_graphs=use_graphs, kv_dtype=kv_dtype,
                                   verify_slot=self.proposer is not None)
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
        # logprobs / a thinking budget: a hooked host sampler (engine/output_hooks.py)
        sampler = sampler_for(request, p, self.valid_vocab, seed=self.seed, matcher=matcher)
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
            tokens = self._next_tokens(run)
            if tokens is None:                   # a prefill chunk, more to come
                return []
        except BaseException:
            self.generator.forget()              # the caches may be half-written
            self._finish(run, RequestStatus.FINISHED_ERROR)
            raise
        req.num_computed_tokens = len(self.generator.tokens)
        new: list[int] = []
        for token in tokens:
            req.output_ids.append(token)
            new.append(token)
            if token in run.stop_ids:
                return [self._finish(run, RequestStatus.FINISHED_STOPPED, new)]
            if len(req.output_ids) >= run.budget:
                return [self._finish(run, RequestStatus.FINISHED_LENGTH, new)]
        return [RequestOutput(req.request_id, new)]

    def _next_tokens(self, run: _Run) -> list[int] | None:
        """The next token(s), each observed by the request's sampler; None: a prefill chunk ran."""
        if (run.request.output_ids and self.proposer is not None and run.sampler.matcher is None
                and not getattr(run.sampler, "needs_rows", False)):
            tokens = self._speculate(run)
            if tokens:
                return tokens
            self.spec_stats.plain_steps += 1
        token = self._next_token(run)
        if token is not None:
            run.sampler.observe(token)
            return [token]
        return None

    def _speculate(self, run: _Run) -> list[int]:
        """One verify round: draft, verify [last, drafts] in one forward, keep the accepted
        prefix and one more token. [] when there is nothing to draft (the caller decodes)."""
        assert self.proposer is not None
        req, gen = run.request, self.generator
        room = min(run.budget - len(req.output_ids), self.max_context - len(gen.tokens)) - 1
        k = min(self.draft_tokens, room)
        drafts = self.proposer.propose(req.prompt_ids + req.output_ids, k) if k > 0 else []
        if not drafts:
            return []
        rows = gen.verify([req.output_ids[-1]] + drafts)
        tokens = verify_drafts(drafts, rows, run.sampler)
        gen.rollback(len(tokens))             # the last token and the accepted drafts
        self.spec_stats.record(len(drafts), len(tokens) - 1)
        return tokens

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
