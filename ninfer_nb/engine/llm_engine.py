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
(`finish`: the front door's stop strings). Knows nothing about text.

Several requests at once (`max_concurrency` > 1, engine/scheduler.py): each runs in a lane (a
`Generator` over one shared state: its GDN slots, its KV pages of one page pool). A step is
one decode round of every running request that has a token to feed (B rows in one forward:
`Backend.decode_rows`, or `pick_rows` when every row is picked where the logits are), then at
most one prefill chunk, the requests still prefilling taking turns, so a long prompt delays the
others by one chunk per step and another prompt's first token by one chunk. Each row keeps
its own position, sampler and budget.
Requests wait for a lane and the pages their prompt needs; a shortage of pages preempts the
latest admitted request, which is recomputed later. With one lane and no page budget the
engine is the one-sequence path it always was: contiguous KV, decode graphs with the pick and
the next step queued ahead (CUDA), one request runs and the others wait in arrival order.

Speculative decoding (spec="ngram"): a running request without a constraint drafts up to
`draft_tokens` tokens by prompt lookup (engine/spec/ngram.py); one step then verifies them in
one forward (on CUDA a graph per K + 1; greedy requests get the K + 1 argmax ids back, others
the rows for the host sampler) and returns every token it kept plus one (engine/spec/verify.py),
and the generator rolls the caches back past the rejected ones. No draft: a plain step (not
queued ahead). Tokens after a stop token within a round stay in the cache, like a
queued-ahead step's.

Queued-ahead stop semantics (Generator.decode_token): a request that stops with a step queued
ahead leaves that step's token fed to the cache too; the next prompt reuses it or diverges
before it.
"""
from __future__ import annotations

import time
from typing import Callable, NoReturn

import numpy as np

from ..config import DecodeChoices, ModelConfig
from ..errors import ContextLengthExceededError, InvalidRequestError
from ..models.decoder import Decoder
from ..models.state import KVDtype, new_state
from .backends.base import Backend, Pick, RowsForward
from .batch import ForwardBatch
from .faults import request_error
from .generator import Generator, draft_ring_size, lane_slots
from .kv_pages import PageAllocator, PageTable, pages_for
from .output_hooks import HookedSampler, sampler_for
from .prefix_cache import HostTier, PrefixCache
from .request import Request, RequestOutput, RequestStatus
from .sampler import gumbel_max_pick
from .scheduler import Run, Scheduler
from .spec import Proposer
from .spec.adaptive import AdaptiveK
from .spec.mtp import MTPProposer, mtp_drafting
from .spec.ngram import NgramProposer
from .spec.stats import SpecStats
from .spec.verify import accept_greedy, verify_drafts
from .state_slots import StateSlots

SPEC_KINDS = ("off", "ngram", "mtp")


_Run = Run                  # the engine's side of a request (engine/scheduler.py)


def _whole_round(rows: list[_Run], picks: list[Pick]) -> bool:
    """A round that cannot be queued ahead: a row asks for logprobs, has a grammar, or its
    sampler must see each token before the next is picked (a hooked sampler)."""
    return (any(p[3] is not None and (p[3].logprobs >= 0 or p[3].matcher is not None) for p in picks)
            or any(run.sampler.matcher is not None or isinstance(run.sampler, HookedSampler) for run in rows))


class LLMEngine:
    def __init__(self, cfg: ModelConfig, decoder: Decoder, backend: Backend, *, max_context: int,
                 prefill_chunk: int, valid_vocab: int, eos_ids: frozenset[int], use_graphs: bool = True,
                 kv_dtype: KVDtype = "fp32", seed: int | None = None,
                 decode: DecodeChoices | None = None, spec: str = "off", draft_tokens: int = 3,
                 max_concurrency: int = 1, kv_pages: int | None = None, prefix_cache: bool = True,
                 adaptive_draft: bool = False, prefix_snapshots: int | None = None,
                 host_cache_mib: int = 0) -> None:
        """max_concurrency: lanes (requests decoding at once); kv_pages: the KV page pool (None:
        every lane's full context). One lane without kv_pages: the contiguous one-sequence path.
        prefix_cache (paged lanes): prefixes shared by every request (engine/prefix_cache.py)
        with `prefix_snapshots` GDN snapshot slots (None: 2 per lane + 4), and `host_cache_mib`
        MiB of host memory that evicted pages and snapshots move to (0: none)."""
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
        # the proposer, when speculation runs (None: plain decode)
        self.proposer: Proposer | None = NgramProposer() if spec == "ngram" else None
        if spec == "mtp":            # the checkpoint's MTP head; the decoder gains its hidden tap
            decoder, self.proposer = mtp_drafting(cfg, decoder, backend, max_context, valid_vocab)
        self.draft_tokens = draft_tokens
        # K from the measured acceptance, up to draft_tokens (engine/spec/adaptive.py); None: fixed K
        self.adaptive: AdaptiveK | None = AdaptiveK(draft_tokens) if adaptive_draft and spec != "off" else None
        self.spec_stats = SpecStats()
        if max_concurrency < 1:
            raise InvalidRequestError(f"max_concurrency must be >= 1, got {max_concurrency}")
        verify_slot = self.proposer is not None
        self.paged = max_concurrency > 1 or kv_pages is not None
        allocator: PageAllocator | None = None
        cache: PrefixCache | None = None
        if not self.paged:
            lanes = [Generator(cfg, decoder, backend, max_context, prefill_chunk, use_graphs=use_graphs,
                               kv_dtype=kv_dtype, verify_slot=verify_slot,
                               draft_slots=draft_ring_size(max(draft_tokens, 3)) if verify_slot else 0)]
        else:
            hybrid = any(not cfg.is_full_attention(i) for i in range(cfg.num_layers))
            snaps = 0 if not prefix_cache else (prefix_snapshots if prefix_snapshots is not None
                                                else 2 * max_concurrency + 4)
            cached = prefix_cache and (snaps > 0 or not hybrid)
            per_lane, table_pages = lane_slots(verify_slot, cached), pages_for(max_context)
            allocator = PageAllocator(kv_pages if kv_pages is not None else max_concurrency * table_pages)
            base = max_concurrency * per_lane
            # the first lane's per-token snapshot ring (it speculates while a request runs alone)
            ring, ring_base = (draft_ring_size(max(draft_tokens, 3)) if verify_slot else 0), base + (snaps if cached else 0)
            state = new_state(cfg, max_context, backend.zeros, kv_dtype,
                              gdn_slots=ring_base + ring, num_pages=allocator.num_pages)
            host = HostTier(state, backend, host_cache_mib << 20) if cached and host_cache_mib > 0 else None
            cache = (PrefixCache(allocator, range(base, base + snaps), StateSlots(state, backend).copy, hybrid,
                                 host) if cached else None)
            lanes = [Generator(cfg, decoder, backend, max_context, prefill_chunk, use_graphs=use_graphs,
                               kv_dtype=kv_dtype, verify_slot=verify_slot, state=state, slot_base=i * per_lane,
                               pages=PageTable(allocator, table_pages), cache=cache,
                               draft_slots=ring if i == 0 else 0, ring_base=ring_base if i == 0 else None)
                     for i in range(max_concurrency)]
        self.scheduler = Scheduler(lanes, allocator, cache)
        self.prefix_cache = cache
        self.prefill_tokens = 0                  # prompt tokens prefill chunks computed (not reused)
        self._prefill_turns = 0
        self.generator = lanes[0]                 # the first lane (the only one on the one-sequence path)
        # decode rounds pick where the logits are (the CUDA graph's pick kernel) when every row can
        self._round_picks = use_graphs and backend.decode_graphs and self.paged
        # a graph backend told not to use graphs (--no-cuda-graph): rounds run eagerly here
        self._eager_rounds = backend.decode_graphs and not use_graphs
        self._errors: list[RequestOutput] = []   # requests a failed round ended, reported next step
        # paged lanes: the rounds queue ahead where the backend can (CUDA: engine/rows_graphs.py)
        self._rows_ahead = self._round_picks and decode.decode_ahead
        # the round in flight whose picks are not read yet: its rows and each one's admission
        # (a row whose run left its lane since is not this round's any more)
        self._inflight: list[tuple[_Run, int]] | None = None
        self.batch_sizes: dict[int, int] = {}    # decode round size -> rounds run (metrics, bench)

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
        sampler = sampler_for(request, p, self.valid_vocab, seed=self.seed, matcher=matcher,
                              prompt_ids=request.prompt_ids)
        # the decode graph's sampler (filters, penalties and a constraint's mask too:
        # Sampler.device_sample)
        pick = sampler.device_sample() if self.decode.device_pick else None
        if pick is not None and (pick.temperature > 0.0 or pick.filters is not None) and not self.picks_on_device:
            pick = None                          # no decode graph to sample in (CPU): the host samples
        budget = min(p.max_tokens, self.max_context - n)
        self.scheduler.check_fits(n, budget)
        request.timings.prompt_tokens = n
        self.scheduler.add(_Run(request, sampler, pick, frozenset(stop_ids), budget))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work() or bool(self._errors)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Cancel a waiting or running request now; its final output (None if it is not here)."""
        return self.finish(request_id, RequestStatus.FINISHED_ABORTED)

    def finish(self, request_id: str, status: RequestStatus) -> RequestOutput | None:
        """End a request with `status` (the front door's stop string: FINISHED_STOPPED)."""
        run = self.scheduler.find(request_id)
        return None if run is None else self._finish(run, status)

    # --- the step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine step: cancelled requests end, waiting ones are admitted, every running
        request with a token to feed gets its next token(s) (one decode round), then one
        prefill chunk runs (of the request still prefilling that waited longest for a chunk;
        its first token after its last chunk). [] when no
        request got a token or finished."""
        outs, self._errors = self._errors, []
        sched = self.scheduler
        for run in [*sched.running, *sched.waiting]:
            if run.request.cancel.is_set():
                outs.append(self._finish(run, RequestStatus.FINISHED_ABORTED))
        sched.admit()
        try:
            decoding = [run for run in sched.running if run.decoding]
            if not self.paged:
                if decoding:
                    outs += self._steps(decoding, self._next_tokens)
            elif decoding or self._inflight is not None:
                outs += self._decode_round(decoding)
            # prefill chunks take turns: a long prompt delays another's first token by one chunk
            prefilling = [run for run in sched.running if not run.decoding]
            if prefilling:
                prefill = min(prefilling, key=lambda r: (r.prefill_turn, r.order))
                self._prefill_turns += 1
                prefill.prefill_turn = self._prefill_turns
                outs += self._steps([prefill], self._prefill_step)
        except BaseException:
            # a failed model call ends its own requests (_raise_failed); what this step already
            # produced for the others (tokens, cancels) comes with the next step, not lost
            self._errors[:0] = outs
            raise
        return outs

    def _steps(self, runs: list[_Run], fn: Callable[[_Run], list[int] | None]) -> list[RequestOutput]:
        """fn(run) for each run (its new tokens, None: none yet), as outputs; a failure ends the
        run with an error (its caches dropped) and is raised."""
        outs = []
        for run in runs:
            if run.lane is None:                 # preempted by an earlier run's reservation
                continue
            try:
                tokens = fn(run)
            except BaseException as exc:
                self._raise_failed([run], exc)
            if tokens is not None:
                outs.append(self._emit(run, tokens))
        return outs

    def _raise_failed(self, runs: list[_Run], exc: BaseException) -> NoReturn:
        """A model call of `runs` failed: they end FINISHED_ERROR (their caches dropped: they
        may be half-written; the other requests keep running, told at the next step) and the
        error is raised, typed when it is a device fault of the request (engine/faults.py)."""
        typed = request_error(exc)
        for run in runs:
            if run.lane is not None:
                run.lane.forget()
            out = self._finish(run, RequestStatus.FINISHED_ERROR)
            out.error = typed or exc
            self._errors.append(out)
        if typed is not None:
            raise typed from exc
        raise exc

    def _emit(self, run: _Run, tokens: list[int]) -> RequestOutput:
        """The output of `run`'s new tokens: it finishes on a stop token or its budget."""
        req = run.request
        if run.lane is not None:
            req.num_computed_tokens = len(run.lane.tokens)
        new: list[int] = []
        for token in tokens:
            req.output_ids.append(token)
            new.append(token)
            if token in run.stop_ids:
                return self._finish(run, RequestStatus.FINISHED_STOPPED, new)
            if len(req.output_ids) >= run.budget:
                return self._finish(run, RequestStatus.FINISHED_LENGTH, new)
        return RequestOutput(req.request_id, new)

    def _decode_round(self, runs: list[_Run]) -> list[RequestOutput]:
        """Paged lanes: speculating requests verify on their own; the rest feed one token each
        in one forward of B rows, each row sampled by its own request. A round whose rows all
        pick on the device queues the next round of the same rows before its picks are read
        (`_collect`); the next step then only collects, while the set of rows is unchanged."""
        if self._inflight is not None:
            return self._continue_round(runs)
        sched, outs = self.scheduler, []
        plain = []
        for run in runs:
            if run.lane is None:
                continue
            if self._can_speculate(run):
                try:
                    drafted = self._verify_round(run)
                except BaseException as exc:
                    self._raise_failed([run], exc)
                if drafted is None:              # preempted
                    continue
                if drafted:
                    outs.append(self._emit(run, drafted))
                    continue
                self.spec_stats.plain_steps += 1   # nothing to draft: a row of the round
            assert run.lane is not None
            sched.reserve(run, len(run.lane.tokens) + 1)
            plain.append(run)
        rows = [run for run in plain if run.lane is not None]      # reservations may preempt
        if not rows:
            return outs
        lanes = [run.lane for run in rows if run.lane is not None]
        try:
            tokens = [run.request.output_ids[-1] for run in rows]
            positions = [lane.feed_row(token) for lane, token in zip(lanes, tokens)]
            slots = [lane.running_slot for lane in lanes]
            table = np.stack([lane.pages.row for lane in lanes if lane.pages is not None])   # [B, P]
            forward = self._rows_forward(lanes[0])
            self.batch_sizes[len(rows)] = self.batch_sizes.get(len(rows), 0) + 1
            picks = [run.pick.at(len(run.request.output_ids)) for run in rows if run.pick is not None]
            if self._rows_ahead and len(picks) == len(rows) and not _whole_round(rows, picks):
                self.backend.launch_rows(forward, tokens, positions, slots, table, picks)
                picked = self._collect(rows, ahead=True)
            elif self._round_picks and len(picks) == len(rows):
                picked = self.backend.pick_rows(forward, tokens, positions, slots, table, picks)
            else:
                logits = (self._eager_round(forward, tokens, positions, slots, table) if self._eager_rounds
                          else self.backend.decode_rows(forward, tokens, positions, slots, table))
                picked = [self._pick(run, row) for run, row in zip(rows, logits)]
        except BaseException as exc:
            self._raise_failed(rows, exc)
        for run, token in zip(rows, picked):
            run.sampler.observe(token)
            outs.append(self._emit(run, [token]))
        return outs

    def _continue_round(self, runs: list[_Run]) -> list[RequestOutput]:
        """A round is in flight (queued by the last step): its picks, and the next round of the
        same rows queued first when every row still decodes and nothing joined; else, once
        its picks are read, a round of the rows decoding now (a row may get two tokens)."""
        rows, self._inflight = self._inflight or [], None
        alive = [run for run, order in rows if run.lane is not None and run.order == order and run.decoding]
        if not alive:                            # every row finished: nobody reads its picks
            self.backend.discard_rows()
            return []
        same = len(alive) == len(rows) == len(runs) and all(a is b for a, b in zip(alive, runs))
        try:
            picked = self._collect([run for run, _ in rows], ahead=same)
        except BaseException as exc:
            self._raise_failed(alive, exc)
        outs = []
        for (run, order), token in zip(rows, picked):
            if run.lane is not None and run.order == order and run.decoding:
                run.sampler.observe(token)
                outs.append(self._emit(run, [token]))
        if not same:                             # the new set's round now: the device is idle
            decoding = [run for run in self.scheduler.running if run.decoding]
            if decoding:
                outs += self._decode_round(decoding)
        return outs

    def _collect(self, rows: list[_Run], ahead: bool) -> list[int]:
        """The picks of the round in flight; before reading them, the next round of the same
        rows is queued (fed on the device by these picks) when `ahead` and every row allows
        it: then each lane counts its pick as fed and the new round is in flight."""
        queue = ahead and self._can_queue(rows)
        if queue:
            for run in rows:
                assert run.lane is not None
                self.scheduler.reserve(run, len(run.lane.tokens) + 1)      # free pages: no preemption
            lanes = [run.lane for run in rows if run.lane is not None]
            self.backend.launch_rows_fed(np.stack([lane.pages.row for lane in lanes
                                                   if lane.pages is not None]))
            self.batch_sizes[len(rows)] = self.batch_sizes.get(len(rows), 0) + 1
        try:
            picked = self.backend.collect_rows()
        except BaseException:
            self.backend.discard_rows()
            raise
        if queue:
            for run, token in zip(rows, picked):
                assert run.lane is not None
                run.lane.tokens.append(token)
            self._inflight = [(run, run.order) for run in rows]
        return picked

    def _can_queue(self, rows: list[_Run]) -> bool:
        """The round after the one in flight can be queued now: the backend has its graph,
        no row's pick in flight is its last token or fills the context, no row speculates,
        and the pages it writes are free (no eviction or preemption behind a round in flight)."""
        if not self.backend.rows_ahead_ready():
            return False
        need = 0
        for run in rows:
            lane = run.lane
            if (lane is None or len(run.request.output_ids) + 1 >= run.budget
                    or len(lane.tokens) >= self.max_context or self._can_speculate(run)):
                return False
            need += lane.pages_needed(len(lane.tokens) + 1)
        allocator = self.scheduler.allocator
        return allocator is None or need <= allocator.num_free

    def _eager_round(self, forward: RowsForward, tokens: list[int], positions: list[int], slots: list[int],
                     table: np.ndarray) -> np.ndarray:
        """One round's logits [B, V] without the backend's round graphs (its arrays, one forward)."""
        b = self.backend
        b.begin_step()
        arrays = (b.array(np.asarray(x, np.int32)) for x in (tokens, positions, slots, table))
        return np.asarray(b.to_host(forward(*arrays)), dtype=np.float32)

    def _pick(self, run: _Run, row: np.ndarray) -> int:
        """The next token from a logits row: the device pick's rule on the host, or the sampler."""
        if run.pick is not None:
            return gumbel_max_pick(row[: self.valid_vocab], *run.pick.at(len(run.request.output_ids)))
        return run.sampler.sample(row)

    def _rows_forward(self, lane: Generator) -> RowsForward:
        ops, decoder, state = self.backend.ops, lane.decoder, lane.state
        return lambda ids, pos, slots, table: decoder.forward(ops, ForwardBatch.rows(ids, pos, slots, table), state)

    def _can_speculate(self, run: _Run) -> bool:
        # logprobs / a thinking budget (a hooked sampler) need every row: no speculation. Paged
        # lanes on a backend with graphs: drafts but MTP's, only while the request runs alone in
        # the first lane (the verify graphs, one per K + 1, are that lane's: its slots and table)
        return (self.proposer is not None and bool(run.request.output_ids) and run.sampler.matcher is None
                and not isinstance(run.sampler, HookedSampler) and run.request.params.speculative
                and (not (self.paged and self.backend.decode_graphs)
                     or (not isinstance(self.proposer, MTPProposer) and run.lane is self.scheduler.lanes[0]
                         and len(self.scheduler.running) == 1)))

    def _verify_round(self, run: _Run) -> list[int] | None:
        """A paged lane's speculative round (pages for the drafts reserved first): the tokens
        it kept, [] when there was nothing to draft (the request joins the decode round), None
        when the reservation preempted it."""
        assert run.lane is not None
        k = min(self.draft_tokens, run.budget - len(run.request.output_ids) - 1)
        self.scheduler.reserve(run, len(run.lane.tokens) + max(k, 0) + 1)
        if run.lane is None:                     # preempted: it was the latest admitted
            return None
        return self._speculate(run)

    def _prefill_step(self, run: _Run) -> list[int] | None:
        """One prefill chunk of `run` (pages reserved first); its first token after the last
        chunk (none after a preempted request's refill: it continues decoding)."""
        lane, req = run.lane, run.request
        assert lane is not None
        if not run.prefilling:
            cached = lane.start_prefill(run.fill, req.turn_start if not run.resumed else None)
            if not run.resumed:
                req.num_cached_tokens = req.timings.cached_tokens = cached
            run.prefilling = True
        self.scheduler.reserve(run, lane.next_chunk_end())
        if run.lane is None:                     # preempted: the pool cannot hold it now
            return None
        before = len(lane.tokens)
        logits = lane.prefill_step()
        self.prefill_tokens += len(lane.tokens) - before
        req.num_computed_tokens = len(lane.tokens)
        if logits is None:
            return None
        run.prefilling = False
        if run.resumed:                          # its next token is known: back to the rounds
            run.resumed = False
            return None
        req.timings.prefill_s = time.perf_counter() - req.arrival_time
        token = run.sampler.sample(logits)
        run.sampler.observe(token)
        req.first_token_time = time.perf_counter()            # decode time runs from here
        req.timings.ttft_s = req.first_token_time - req.arrival_time
        return [token]

    def _next_tokens(self, run: _Run) -> list[int] | None:
        """The next token(s), each observed by the request's sampler; None: a prefill chunk ran."""
        if self._can_speculate(run):
            tokens = self._speculate(run)
            if tokens:
                return tokens
            self.spec_stats.plain_steps += 1
        token = self._next_token(run)
        if token is not None:
            run.sampler.observe(token)
            return [token]
        return None                              # (a paged lane's round: preempted)

    def _speculate(self, run: _Run) -> list[int]:
        """One verify round: draft, verify [last, drafts] in one forward, keep the accepted
        prefix and one more token. [] when there is nothing to draft (the caller decodes)."""
        assert self.proposer is not None
        req, gen = run.request, run.lane
        assert gen is not None
        room = min(run.budget - len(req.output_ids), self.max_context - len(gen.tokens)) - 1
        k = min(self.adaptive.next_k() if self.adaptive is not None else self.draft_tokens, room)
        drafts = self.proposer.propose(req.prompt_ids + req.output_ids, k) if k > 0 else []
        if not drafts:
            return []
        if run.pick is not None and run.pick.temperature == 0.0 and run.pick.filters is None:   # the argmax ids come back
            picks = gen.verify([req.output_ids[-1]] + drafts, self.valid_vocab)
            tokens = accept_greedy(drafts, [int(t) for t in picks])
            for token in tokens:
                run.sampler.observe(token)
        else:
            tokens = verify_drafts(drafts, gen.verify([req.output_ids[-1]] + drafts), run.sampler)
        gen.rollback(len(tokens))             # the last token and the accepted drafts
        if isinstance(self.proposer, MTPProposer):     # it reads the kept positions' hiddens back
            self.proposer.settle(len(gen.tokens) - len(tokens), len(tokens), gen.last_forward_rows)
        self.spec_stats.record(len(drafts), len(tokens) - 1)
        if self.adaptive is not None:
            self.adaptive.record(len(drafts), len(tokens) - 1)
        return tokens

    def _next_token(self, run: _Run) -> int | None:
        """The next token of a decoding request on the one-sequence path."""
        req, gen = run.request, run.lane
        assert gen is not None
        n = len(req.output_ids)
        last = req.output_ids[-1]
        if run.pick is not None:   # the step after the next token queued too, unless that token is the last
            temperature, seed, filters = run.pick
            # no step queued ahead while speculating: the next round's verify feeds the caches
            ahead = self.decode.decode_ahead and n + 1 < run.budget and not self._can_speculate(run)
            return gen.decode_token(last, self.valid_vocab, ahead=ahead,
                                    temperature=temperature, seed=seed, offset=n, filters=filters)
        return run.sampler.sample(gen.decode(last))

    def _finish(self, run: _Run, status: RequestStatus, tokens: list[int] | None = None) -> RequestOutput:
        req = run.request
        self.scheduler.finish(run)
        req.status = status
        t = req.timings
        t.completion_tokens = n = len(req.output_ids)
        t.decode_s = time.perf_counter() - req.first_token_time if n > 1 and req.first_token_time else 0.0
        return RequestOutput(req.request_id, tokens or [], finished=True, finish_reason=status.finish_reason,
                             timings=t)

    # --- the cached sequence ----------------------------------------------------------------
    @property
    def picks_on_device(self) -> bool:
        """Decode steps pick their token in the decode graph (device_pick on a backend with graphs)."""
        if self.paged:
            return self._round_picks and self.backend.token_pick_vocab == self.valid_vocab
        return self.generator.picks_on_device(self.valid_vocab)

    @property
    def context_tokens(self) -> int:
        """Tokens in the caches of the one sequence (one lane), else of the longest running
        request, else of the last one that ran (its cached prefix)."""
        if not self.paged:
            return len(self.generator.tokens)
        running = [len(run.lane.tokens) for run in self.scheduler.running if run.lane is not None]
        return max(running) if running else self.scheduler.last_tokens

    def forget(self) -> None:
        """Drop the cached prefixes of idle lanes (the next prompt starts from an empty cache)."""
        self.scheduler.forget_idle()

    def logits_all(self, token_ids: list[int]) -> np.ndarray:
        """Logits at every position of token_ids ([T, V]) from an empty cache (an idle lane's)."""
        if not self.paged:
            return self.generator.logits_all(token_ids)
        lane = self.scheduler.idle_lane(len(token_ids))
        try:
            return lane.logits_all(token_ids)
        finally:
            if self.prefix_cache is not None:        # an idle lane over the cache holds nothing
                lane.forget()
