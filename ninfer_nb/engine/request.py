"""Request: one generation the engine runs, in token ids, from arrival to its finish.

Holds the prompt and output ids, the sampling parameters, the output constraint (a grammar),
the status, how many tokens' effects are in the caches, the cancel flag, and where its state
lives while it runs (its lane's GDN state slot; its KV pages on the paged path). `RequestOutput` is what one engine step reports for one request. Knows
nothing about text: stop strings and detokenizing are the front door's (llm.py).
"""
from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..outputs import FinishReason, Timings
from ..params import SamplingParams

if TYPE_CHECKING:
    from ..structured import Constraint
    from .logprobs import TokenLogprobs


class RequestStatus(enum.Enum):
    WAITING = "waiting"                    # added, not yet prefilled
    RUNNING = "running"                    # has a lane: prefilling, or one token per engine step
    PREEMPTED = "preempted"                # lost its caches to a shortage of KV pages; waits to recompute
    FINISHED_STOPPED = "stopped"           # a stop token, or the front door's stop string
    FINISHED_LENGTH = "length"             # max_tokens or the context is used up
    FINISHED_ABORTED = "aborted"           # cancelled by its caller
    FINISHED_ERROR = "error"               # the engine failed while running it

    @property
    def finished(self) -> bool:
        return self not in (RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED)

    @property
    def finish_reason(self) -> FinishReason | None:
        return _REASONS.get(self)


_REASONS: dict[RequestStatus, FinishReason] = {
    RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "cancelled", RequestStatus.FINISHED_ERROR: "error"}


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    # a prefix length the next request is likely to share (the last chat turn's start): the
    # engine keeps a GDN state snapshot there
    turn_start: int | None = None
    # the grammar its output must follow (structured output, enforced tool calls); None: free text
    constraint: Constraint | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    arrival_time: float = field(default_factory=time.perf_counter)
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0           # tokens whose effects are in the caches
    num_cached_tokens: int = 0             # prompt tokens the prefix cache served
    slot_id: int | None = None             # its GDN state slot while it runs
    page_ids: list[int] = field(default_factory=list)   # its KV pages while it runs (paged KV)
    timings: Timings = field(default_factory=Timings)
    first_token_time: float | None = None
    # one per output token when params.logprobs is set (engine/output_hooks.py records them)
    logprobs: list[TokenLogprobs] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status.finished


@dataclass
class RequestOutput:
    """One request's news from one engine step (or from abort / finish). A step that finishes
    a request with reason "stop" and new tokens ends on the stop token (no text for it)."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: FinishReason | None = None
    timings: Timings | None = None         # on the finishing output
    # finish_reason "error": what ended it (raised to whichever caller ran that step, and to
    # this request's own stream; engine/faults.py types a device out-of-memory)
    error: BaseException | None = None
