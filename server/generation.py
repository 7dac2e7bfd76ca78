"""One chat generation as the protocols see it: Started, Delta…, Finished (plus KeepAlive ticks).

The job body runs on the engine thread (`chat_job`): given the prompt already rendered and
tokenized (server/prompt.py), it runs the engine and turns its ChatDelta / final StreamEvent into
protocol-neutral events. `Generation` is the asyncio side: it waits with keep-alive ticks, cancels
the job when the client goes away or the server aborts it (drain), and reports the outcome to the
telemetry. Knows no protocol shapes and no HTTP.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ninfer_nb.chat import ChatDelta, ChatStreamParser, prompt_opens_reasoning
from ninfer_nb.engine.logprobs import TokenLogprobs
from ninfer_nb.engine.worker import EngineWorker, JobStream
from ninfer_nb.errors import ContextLengthExceededError, InvalidRequestError
from ninfer_nb.outputs import StreamEvent, Timings
from ninfer_nb.params import SamplingParams
from ninfer_nb.structured import Constraint

from .constraints import OutputRequest
from .engine import ChatEngine, Message, Tool
from .prompt import Prompt
from .reasoning import CLOSE_THINKING
from .telemetry import RequestTrace

FinishReason = Literal["stop", "length", "cancelled", "tool_calls"]


@dataclass(frozen=True)
class ChatJob:
    messages: list[Message]
    tools: list[Tool] | None
    params: SamplingParams
    enable_thinking: bool
    output: OutputRequest | None = None  # structured output / enforced tool calls, compiled later
    n: int = 1                           # choices, each its own engine request on one prompt
    thinking_budget: int | None = None   # thinking tokens before </think> is forced


@dataclass(frozen=True)
class ToolCallOut:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Started:
    prompt_tokens: int


@dataclass(frozen=True)
class Delta:
    kind: Literal["reasoning", "content", "tool_call"]
    text: str = ""
    tool_call: ToolCallOut | None = None
    index: int = 0                                   # the choice (n > 1, several prompts)
    # the generated tokens' logprobs up to this delta's text (params.logprobs set)
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True)
class ChoiceEnd:
    """One choice finished (sent as it happens; every choice's is also in Finished.choices).
    `logprobs`: those of its tokens no delta carried (a withheld stop token, held-back text)."""

    index: int
    reason: FinishReason
    completion_tokens: int
    stop_sequence: str | None = None
    timings: Timings | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True)
class Finished:
    """The whole job's end: choice 0's outcome, usage summed over the choices."""

    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    stop_sequence: str | None = None
    timings: Timings | None = None
    choices: tuple[ChoiceEnd, ...] = ()

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class KeepAlive:
    """Nothing happened for `keepalive_s`: streaming handlers send an SSE comment."""


KEEPALIVE = KeepAlive()
Event = Started | Delta | ChoiceEnd | Finished


def check_context(engine: ChatEngine, prompt: Prompt) -> None:
    if len(prompt) >= engine.max_context:
        raise ContextLengthExceededError(
            f"the prompt is {len(prompt)} tokens, over the context of "
            f"{engine.max_context} tokens"
        )


def _engine_stream(engine: ChatEngine, job: ChatJob, prompt: Prompt, params: SamplingParams,
                   cancel: threading.Event,
                   constraint: Constraint | None) -> Iterator[ChatDelta | StreamEvent]:
    """The engine's chat events for the prompt, from its ids when the engine takes them."""
    stream_ids = getattr(engine, "stream", None)
    if stream_ids is None:
        if constraint is not None:  # compile_output refuses these requests with a 400 first
            raise RuntimeError("this engine takes no output constraint (it has no stream())")
        return iter(engine.chat_stream(job.messages, job.tools, params,
                                       enable_thinking=job.enable_thinking, cancel=cancel))
    parser = ChatStreamParser(starts_in_reasoning=prompt_opens_reasoning(prompt.text),
                              tools=job.tools, dialect=engine.tokenizer.tool_dialect)
    extra = {"constraint": constraint} if constraint is not None else {}
    return _chat_events(stream_ids(prompt.ids, params, cancel=cancel, **extra), parser)


def _chat_events(events: Iterator[StreamEvent],
                 parser: ChatStreamParser) -> Iterator[ChatDelta | StreamEvent]:
    """Token events in, the parser's reasoning / content / tool-call deltas interleaved (each
    token's event before its text's deltas, so its logprobs go with that text)."""
    for ev in events:
        if not ev.finished:
            yield ev
        if ev.text:
            yield from parser.push(ev.text)
        if ev.finished:
            yield from parser.finish()
            yield ev


def text_events(events: Iterator[StreamEvent]) -> Iterator[ChatDelta | StreamEvent]:
    """Token events of a plain completion (no chat parsing): all text is content."""
    for ev in events:
        if not ev.finished:
            yield ev
        if ev.text:
            yield ChatDelta("content", ev.text)
        if ev.finished:
            yield ev


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice `index`'s parameters: a given seed moves by the index (vLLM's rule), so seeded
    choices differ and each is reproducible."""
    return params if index == 0 or params.seed is None else params.replace(seed=params.seed + index)


def chat_job(engine: ChatEngine, job: ChatJob, prompt: Prompt,
             constraint: Constraint | None = None) -> Callable[[threading.Event], Iterator[Event]]:
    """The engine-thread body of one chat request (`constraint`: job.output compiled)."""

    def run(cancel: threading.Event) -> Iterator[Event]:
        prompt_tokens = len(prompt)
        room = max(1, engine.max_context - prompt_tokens)
        params = job.params.replace(max_tokens=min(job.params.max_tokens, room))
        if job.thinking_budget is not None and prompt_opens_reasoning(prompt.text):
            params = params.replace(thinking_budget=job.thinking_budget, thinking_end_ids=tuple(
                engine.tokenizer.encode(CLOSE_THINKING)))
        choices = [(params_i, _engine_stream(engine, job, prompt, params_i, cancel, constraint))
                   for params_i in (choice_params(params, i) for i in range(job.n))]
        yield from run_choices(engine, choices, prompt_tokens)

    return run


@dataclass
class _Choice:
    """What one choice has produced so far (run_choices)."""

    params: SamplingParams
    events: Iterator[ChatDelta | StreamEvent]
    final: StreamEvent | None = None
    tail: list[int] | None = None          # the last generated ids, to name a matched stop string
    reasoning: str = ""
    n_calls: int = 0
    pending: list[TokenLogprobs] | None = None    # logprobs not yet sent with a delta


def run_choices(engine: ChatEngine,
                choices: list[tuple[SamplingParams, Iterator[ChatDelta | StreamEvent]]],
                prompt_tokens: int, *, first: int = 0) -> Iterator[Event]:
    """Drive the choices' engine streams in turn, one item each (the engine steps them as it
    schedules them), and turn them into Started, Delta (with `index` = first + position),
    ChoiceEnd as each ends, and one Finished with the usage of all."""
    state = [_Choice(p, it, tail=[], pending=[]) for p, it in choices]
    live = list(range(len(state)))
    started = False
    ends: list[ChoiceEnd] = []
    try:
        while live:
            for i in list(live):
                c = state[i]
                try:
                    ev = next(c.events)
                except StopIteration:
                    live.remove(i)
                    if not started:
                        started = True
                        yield Started(prompt_tokens)
                    ends.append(_choice_end(engine, c, first + i))
                    yield ends[-1]
                    continue
                if not started:  # after the first step: context errors surface before Started
                    started = True
                    yield Started(prompt_tokens)
                yield from _choice_event(c, ev, first + i)
    finally:
        for c in state:
            close = getattr(c.events, "close", None)
            if close is not None:
                close()
    if not started:
        yield Started(prompt_tokens)
    ends.sort(key=lambda e: e.index)
    yield _finished(engine, state, prompt_tokens, ends)


def _choice_event(c: _Choice, ev: ChatDelta | StreamEvent, index: int) -> Iterator[Delta]:
    assert c.tail is not None and c.pending is not None
    if isinstance(ev, StreamEvent):
        if ev.finished:
            c.final = ev
        elif ev.token_id is not None:
            c.tail = [*c.tail[-63:], ev.token_id]
            if ev.logprobs is not None:
                c.pending.append(ev.logprobs)
        return
    if ev.kind == "reasoning":
        c.reasoning += ev.text
    if ev.kind == "tool_call" and ev.tool_call is not None:
        c.n_calls += 1
        call = ev.tool_call
        yield Delta("tool_call", "", ToolCallOut(call.name, dict(call.arguments)), index)
    elif ev.text:
        lps, c.pending = tuple(c.pending), []
        yield Delta(ev.kind, ev.text, index=index, logprobs=lps)


def _choice_end(engine: ChatEngine, c: _Choice, index: int) -> ChoiceEnd:
    final = c.final
    reason = (final.finish_reason if final else None) or "stop"
    if reason not in ("stop", "length", "cancelled"):
        raise RuntimeError(f"generation ended with {reason!r}")
    timings = final.timings if final else None
    stop_sequence = None
    if reason == "stop" and final is not None and c.tail is not None:
        stop_sequence = _matched_stop(engine, c.params, c.tail)
    return ChoiceEnd(index, "tool_calls" if c.n_calls and reason == "stop" else reason,
                     timings.completion_tokens if timings else 0, stop_sequence, timings,
                     tuple(c.pending or ()))


def _finished(engine: ChatEngine, state: list[_Choice], prompt_tokens: int,
              ends: list[ChoiceEnd]) -> Finished:
    head = ends[0]
    timings = head.timings
    reasoning = sum(len(engine.tokenizer.encode(c.reasoning)) for c in state if c.reasoning)
    return Finished(
        reason=head.reason,
        prompt_tokens=timings.prompt_tokens if len(ends) == 1 and timings and timings.prompt_tokens
        else prompt_tokens,
        completion_tokens=sum(e.completion_tokens for e in ends),
        reasoning_tokens=reasoning,
        cached_tokens=timings.cached_tokens if timings else 0,
        stop_sequence=head.stop_sequence,
        timings=timings,
        choices=tuple(ends),
    )


def _matched_stop(engine: ChatEngine, params: SamplingParams, tail: list[int]) -> str | None:
    """Which stop string ended the output. Its text is withheld, so decode the last tokens:
    the first stop found there is the one that fired (an earlier hit would have fired first)."""
    if not params.stop or not tail:
        return None
    if tail[-1] in engine.tokenizer.eos_token_ids or tail[-1] in params.stop_token_ids:
        return None
    window = max(len(s) for s in params.stop) + 2  # every token holds >= 1 character
    text = engine.tokenizer.decode(tail[-window:])
    hits = [(text.find(s), i) for i, s in enumerate(params.stop) if s in text]
    return params.stop[min(hits)[1]] if hits else params.stop[0]


@dataclass(eq=False)  # hashed by identity: the drain keeps a set of them
class Generation:
    """The asyncio side of one chat job. Use `async with` so a client that leaves cancels it."""

    stream: JobStream[Event]
    trace: RequestTrace
    keepalive_s: float
    is_disconnected: Callable[[], bool]
    on_exit: Callable[[Generation], None] = lambda _gen: None
    first_token_at: float | None = None
    finished: Finished | None = None
    abort_error: Exception | None = None

    @property
    def started(self) -> bool:
        """The engine has begun this job (it has left the queue)."""
        return self.stream.started_at is not None or self.stream.finished

    def abort(self, error: Exception) -> None:
        """End this generation with `error` (raised from `events()` within one poll)."""
        if self.abort_error is None and self.finished is None:
            self.abort_error = error
            self.stream.cancel()

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: Any
    ) -> None:
        self.stream.cancel()
        self.on_exit(self)
        if e is not None and not isinstance(e, (ConnectionError, asyncio.CancelledError)):
            self.trace.failed(e)
        elif self.finished is None:
            self.trace.aborted(self.stream)

    async def events(self) -> AsyncIterator[Event | KeepAlive]:
        poll = min(0.5, self.keepalive_s)
        idle_since = time.monotonic()
        while True:
            if self.abort_error is not None:
                raise self.abort_error
            try:
                ev = await self.stream.next(timeout=poll)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if self.is_disconnected():
                    self.stream.cancel()
                    raise ConnectionResetError("client disconnected") from None
                if time.monotonic() - idle_since >= self.keepalive_s:
                    idle_since = time.monotonic()
                    yield KEEPALIVE
                continue
            except Exception as exc:
                self.trace.failed(exc)
                raise
            idle_since = time.monotonic()
            if isinstance(ev, Started):  # sent after the first token is sampled
                self.first_token_at = time.monotonic()
            if isinstance(ev, Finished):
                self.finished = ev
                self.trace.done(self.stream, ev, self.first_token_at)
            yield ev


def start_generation(
    worker: EngineWorker,
    engine: ChatEngine,
    job: ChatJob,
    prompt: Prompt,
    trace: RequestTrace,
    *,
    keepalive_s: float,
    is_disconnected: Callable[[], bool],
    on_exit: Callable[[Generation], None] = lambda _gen: None,
    constraint: Constraint | None = None,
) -> Generation:
    """Queue `job` (EngineOverloadedError when the queue is full)."""
    if not job.messages:
        raise InvalidRequestError("messages must not be empty")
    check_context(engine, prompt)
    stream = worker.submit_stream(chat_job(engine, job, prompt, constraint))
    return Generation(stream, trace, keepalive_s, is_disconnected, on_exit)


@dataclass
class CollectedChoice:
    index: int
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallOut] | None = None
    logprobs: list[TokenLogprobs] | None = None
    end: ChoiceEnd | None = None


@dataclass(frozen=True)
class Collected:
    reasoning: str
    content: str
    tool_calls: list[ToolCallOut]
    finished: Finished
    choices: list[CollectedChoice]       # by index (choice 0 is also the fields above)


async def collect(gen: Generation) -> Collected:
    """Run a generation to its end (non-streaming responses)."""
    by_index: dict[int, CollectedChoice] = {}

    def choice(i: int) -> CollectedChoice:
        if i not in by_index:
            by_index[i] = CollectedChoice(i, tool_calls=[], logprobs=[])
        return by_index[i]

    async for ev in gen.events():
        if isinstance(ev, Delta):
            c = choice(ev.index)
            assert c.tool_calls is not None and c.logprobs is not None
            c.logprobs.extend(ev.logprobs)
            if ev.kind == "tool_call" and ev.tool_call is not None:
                c.tool_calls.append(ev.tool_call)
            elif ev.kind == "reasoning":
                c.reasoning += ev.text
            else:
                c.content += ev.text
        elif isinstance(ev, ChoiceEnd):
            c = choice(ev.index)
            assert c.logprobs is not None
            c.logprobs.extend(ev.logprobs)
            c.end = ev
    if gen.finished is None:
        raise RuntimeError("the generation ended without a final event")
    for end in gen.finished.choices:
        choice(end.index).end = end
    ordered = [by_index[i] for i in sorted(by_index)] or [choice(0)]
    head = ordered[0]
    return Collected(head.reasoning, head.content, list(head.tool_calls or []), gen.finished,
                     ordered)
