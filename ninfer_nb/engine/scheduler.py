"""Scheduler: which requests run, in which lane, with which KV pages; who waits, who is preempted.

A lane is a `Generator` (engine/generator.py): one sequence's caches, i.e. its GDN slots and, on
the paged path, its KV pages of the shared pool. There are `max_concurrency` lanes. A request
runs in a lane from admission to its finish; a finished request's lane goes idle and keeps its
cache, which the next admitted prompt reuses when it shares a prefix (admission picks the idle
lane that serves the longest prefix, else the least recently used one).

Admission (`admit`, FIFO): a waiting request gets an idle lane when the pages its prompt still
needs fit in the free pages plus what idle lanes hold (their cached prefixes are evicted, least
recently used first). Before each model call the engine asks `reserve` for the pages that call
writes; when the pool runs short, idle caches are evicted first, then the most recently
admitted running request is preempted: its lane's cache is dropped and it goes back to the
front of the queue (PREEMPTED), to be recomputed from its prompt and the tokens it already has
(`Run.fill`). A request that could never fit (its prompt plus budget needs more pages than the
pool has) is refused when it is added. Knows nothing about sampling, logits or text; the engine
(engine/llm_engine.py) makes the model calls.

With a prefix cache (engine/prefix_cache.py) lanes hold nothing while idle: a lane that goes
idle (its request finished or was preempted) hands its pages and a GDN snapshot to the cache,
and an admitted request starts from the longest prefix the cache serves, whichever lane it
gets. Pages the cache alone holds are evicted (least recently used first) before anyone is
preempted. A waiting request whose prompt is the prompt of a request still prefilling waits
for that prefill (then the cache serves all of it: n completions of one prompt prefill once).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import InvalidRequestError
from ..models.state import PAGE_SIZE
from .kv_pages import PageAllocator, pages_for
from .prefix_cache import Hit, PrefixCache
from .request import Request, RequestStatus

EVICT_BATCH = 8                             # pages the prefix cache frees at least, when it must

if TYPE_CHECKING:
    from .generator import Generator
    from .sampler import DevicePick, Sampler


@dataclass(eq=False)
class Run:
    """The engine's side of a request: its sampler, its device pick, its stop ids and budget,
    and where it runs."""

    request: Request
    sampler: Sampler
    pick: DevicePick | None                # how the decode graph's sampler picks, or None (the host)
    stop_ids: frozenset[int]
    budget: int                            # tokens it may generate
    prefilling: bool = False               # its prefill started and has chunks left
    lane: Generator | None = None          # while it runs
    order: int = 0                         # admission order (the latest is preempted first)
    resumed: bool = field(default=False)   # preempted after its first token: refilling, no sample
    prefill_turn: int = 0                  # when it last got a prefill chunk (turns: least recent first)

    @property
    def fill(self) -> list[int]:
        """The tokens a prefill must bring into the caches: the prompt, and after a preemption
        the generated tokens but the last (the next decode step feeds that one)."""
        out = self.request.output_ids
        return self.request.prompt_ids + out[:-1] if out else self.request.prompt_ids

    @property
    def decoding(self) -> bool:
        """In the decode rounds: its caches hold fill and it has a token to feed."""
        return self.lane is not None and bool(self.request.output_ids) and not self.prefilling and not self.resumed


class Scheduler:
    def __init__(self, lanes: list[Generator], allocator: PageAllocator | None,
                 cache: PrefixCache | None = None) -> None:
        self.lanes = lanes
        self.allocator = allocator          # None: one lane with its own contiguous KV cache
        self.cache = cache                  # shared prefixes (paged lanes), or None: idle lanes keep theirs
        self.idle: list[Generator] = list(lanes)           # least recently used first
        self.waiting: collections.deque[Run] = collections.deque()
        self.running: list[Run] = []                       # in admission order
        self.preemptions = 0
        self.last_tokens = 0                # tokens in the caches of the lane that went idle last
        self._admitted = 0

    @property
    def max_concurrency(self) -> int:
        return len(self.lanes)

    # --- queue ---------------------------------------------------------------------------
    def check_fits(self, prompt_tokens: int, budget: int) -> None:
        """Refuse a request the page pool could never hold (prompt + budget - 1 tokens cached)."""
        if self.allocator is None:
            return
        need = pages_for(prompt_tokens + budget - 1)
        if need > self.allocator.num_pages:
            raise InvalidRequestError(
                f"the request needs {need} KV pages ({prompt_tokens} prompt + {budget} generated "
                f"tokens) but the pool has {self.allocator.num_pages}; lower max_tokens or raise "
                f"the KV page budget")

    def add(self, run: Run) -> None:
        run.request.status = RequestStatus.WAITING
        self.waiting.append(run)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def find(self, request_id: str) -> Run | None:
        for run in (*self.running, *self.waiting):
            if run.request.request_id == request_id:
                return run
        return None

    # --- admission -----------------------------------------------------------------------
    def admit(self) -> list[Run]:
        """Give idle lanes to waiting requests in arrival order while their pages fit; the
        runs admitted now."""
        if self.cache is not None:
            return self._admit_cached()
        admitted = []
        while self.waiting and self.idle:
            run = self.waiting[0]
            fill = run.fill
            lane = max(self.idle, key=lambda g: g.reusable(fill))   # first (least recent) on ties
            if not self._prompt_fits(lane, len(fill)):
                break
            self.waiting.popleft()
            self._start(run, lane)
            admitted.append(run)
        return admitted

    def _start(self, run: Run, lane: Generator) -> None:
        self.idle.remove(lane)
        run.lane = lane
        self._admitted += 1
        run.order = self._admitted
        run.request.status = RequestStatus.RUNNING
        run.request.slot_id = lane.running_slot
        self.running.append(run)

    def _admit_cached(self) -> list[Run]:
        """Admission over the prefix cache: in arrival order while pages fit; a request whose
        prompt is being prefilled by another waits for that prefill (its turn is kept)."""
        assert self.cache is not None and self.allocator is not None
        admitted: list[Run] = []
        filling = [r.fill for r in self.running if not r.decoding]
        for run in list(self.waiting):
            if not self.idle:
                break
            fill = run.fill
            if fill in filling:
                continue
            hit = self.cache.match(fill)
            # idle lanes hold nothing: the first lane when it is idle (speculation runs there)
            lane = self.lanes[0] if self.lanes[0] in self.idle else self.idle[0]
            assert lane.pages is not None
            # a shared partial page is copied before the first write, unless the cache can let
            # its leaf go (then the request takes the page over)
            copy = hit.node is not None and hit.length % PAGE_SIZE != 0 and bool(hit.node.children)
            need = pages_for(len(fill) + 1) - len(hit.pages) + hit.missing + int(copy)
            if need > self.allocator.num_free and need > self.allocator.num_free + self.cache.evictable(hit.node):
                break
            self.waiting.remove(run)
            if not run.resumed:
                self.cache.use(hit, len(fill))
            elif hit.node is not None:
                self.cache.use(Hit(node=hit.node), 0)      # touched, not counted
            if hit.missing:                                # pages in the host tier come back
                short = hit.missing - self.allocator.num_free
                if short > 0:
                    self.cache.evict(short, keep=hit.node)
                self.cache.load(hit)
            lane.adopt(fill, hit)
            self._start(run, lane)
            admitted.append(run)
            filling.append(fill)
        return admitted

    def _prompt_fits(self, lane: Generator, tokens: int) -> bool:
        if self.allocator is None or lane.pages is None:
            return True
        need = lane.pages.missing(tokens + 1)
        spare = self.allocator.num_free + sum(len(g.pages.pages) for g in self.idle
                                              if g is not lane and g.pages is not None)
        return need <= spare

    # --- pages -----------------------------------------------------------------------------
    def reserve(self, run: Run, tokens: int) -> list[Run]:
        """Hold pages for `run`'s first `tokens` positions: evict idle caches, then preempt the
        latest admitted running requests (possibly `run` itself: then it is not reserved).
        Returns the runs preempted."""
        lane = run.lane
        assert lane is not None
        if self.allocator is None or lane.pages is None:
            return []
        preempted: list[Run] = []
        while lane.pages_needed(tokens) > self.allocator.num_free:
            short = lane.pages_needed(tokens) - self.allocator.num_free
            if self.cache is not None and (self.cache.evict(max(short, EVICT_BATCH)) > 0
                                           or lane.unshare_write_page()):
                continue                                   # pages only the cache held go first
            holder = next((g for g in self.idle if g.pages is not None and g.pages.pages), None)
            if holder is not None:
                holder.forget()                            # an idle cached prefix goes first
                continue
            holders = [r for r in self.running
                       if r is run or (r.lane is not None and r.lane.pages is not None and r.lane.pages.pages)]
            victim = max(holders, key=lambda r: r.order)
            self.preempt(victim)
            preempted.append(victim)
            if victim is run:
                return preempted
        lane.reserve(tokens)
        run.request.page_ids = list(lane.pages.pages)
        return preempted

    def preempt(self, run: Run) -> None:
        """Drop `run`'s caches and queue it first, to be recomputed from its tokens."""
        lane = run.lane
        assert lane is not None
        if self.cache is None:
            lane.forget()
        self._release_lane(run)                            # with a cache: it may serve the refill
        run.prefilling = False
        run.resumed = bool(run.request.output_ids)
        run.request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(run)
        self.preemptions += 1

    # --- the end ---------------------------------------------------------------------------
    def finish(self, run: Run) -> None:
        """`run` leaves the scheduler; its lane goes idle with its cache (a prefix to reuse)."""
        if run in self.running:
            self._release_lane(run)
        elif run in self.waiting:
            self.waiting.remove(run)

    def _release_lane(self, run: Run) -> None:
        lane = run.lane
        assert lane is not None
        self.last_tokens = len(lane.tokens)
        if self.cache is not None:
            lane.retire()                                  # its caches go to the prefix cache
        self.running.remove(run)
        self.idle.append(lane)                             # the most recently used
        run.lane = None
        run.request.slot_id = None
        run.request.page_ids = []

    def forget_idle(self) -> None:
        """Drop every idle lane's cached prefix and the prefix cache."""
        for lane in self.idle:
            lane.forget()
        if self.cache is not None:
            self.cache.clear()

    def idle_lane(self, tokens: int) -> Generator:
        """An idle lane with pages for `tokens` tokens from an empty cache (LLM.logits): the
        other idle lanes' caches are evicted as needed. RuntimeError when none is idle."""
        if not self.idle:
            raise RuntimeError("every lane runs a request")
        lane = self.idle[-1]
        lane.forget()
        if self.allocator is not None and lane.pages is not None:
            if self.cache is not None and pages_for(tokens) > self.allocator.num_free:
                self.cache.evict(pages_for(tokens) - self.allocator.num_free)
            for other in self.idle:
                if pages_for(tokens) <= self.allocator.num_free:
                    break
                other.forget()
            if pages_for(tokens) > self.allocator.num_free:
                raise InvalidRequestError(f"{tokens} tokens need more KV pages than are free")
        return lane

    # --- introspection -----------------------------------------------------------------------
    def pages_in_use(self) -> int:
        return 0 if self.allocator is None else self.allocator.num_used

    def usage(self) -> float:
        """Fraction of the KV page pool requests hold (vllm:kv_cache_usage_perc; pages only the
        prefix cache holds count as free, as vLLM counts its cached free blocks; 0 without a pool)."""
        if self.allocator is None:
            return 0.0
        cached = self.cache.sole_pages() if self.cache is not None else 0
        return (self.allocator.num_used - cached) / self.allocator.num_pages
