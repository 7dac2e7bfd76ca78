"""One chat generation as the protocols see it: Started, Delta…, Finished (plus KeepAlive ticks).

The job body runs on the engine thread (`chat_job`): it counts the prompt, runs
`engine.chat_stream` and turns its ChatDelta / final StreamEvent into protocol-neutral events.
`Generation` is the asyncio side: it waits with keep-alive ticks, cancels the job when the client
goes away and reports the outcome to the telemetry. Knows no protocol shapes and no HTTP.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ninfer_nb.engine.worker import EngineWorker, JobStream
from ninfer_nb.errors import ContextLengthExceededError, InvalidRequestError
from ninfer_nb.outputs import StreamEvent, Timings
from ninfer_nb.params import SamplingParams

from .engine import ChatEngine, Message, Tool
from .telemetry import RequestTrace

FinishReason = Literal["stop", "length", "cancelled", "tool_calls"]


@dataclass(frozen=True)
class ChatJob:
    messages: list[Message]
    tools: list[Tool] | None
    params: SamplingParams
    enable_thinking: bool


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


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    stop_sequence: str | None = None
    timings: Timings | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class KeepAlive:
    """Nothing happened for `keepalive_s`: streaming handlers send an SSE comment."""


KEEPALIVE = KeepAlive()
Event = Started | Delta | Finished


def chat_job(engine: ChatEngine, job: ChatJob) -> Callable[[threading.Event], Iterator[Event]]:
    """The engine-thread body of one chat request."""

    def run(cancel: threading.Event) -> Iterator[Event]:
        prompt_tokens = engine.count_tokens(
            job.messages, job.tools, enable_thinking=job.enable_thinking
        )
        if prompt_tokens >= engine.max_context:
            raise ContextLengthExceededError(
                f"the prompt is {prompt_tokens} tokens, over the context of "
                f"{engine.max_context} tokens"
            )
        room = max(1, engine.max_context - prompt_tokens)
        params = job.params.replace(max_tokens=min(job.params.max_tokens, room))
        stream = engine.chat_stream(
            job.messages, job.tools, params, enable_thinking=job.enable_thinking, cancel=cancel
        )
        started = False
        final: StreamEvent | None = None
        tail: list[int] = []  # the last generated ids, to name a matched stop string
        reasoning: list[str] = []
        n_calls = 0
        for ev in stream:
            if not started:  # after the first step: context errors surface before Started
                started = True
                yield Started(prompt_tokens)
            if isinstance(ev, StreamEvent):
                if ev.finished:
                    final = ev
                elif ev.token_id is not None:
                    tail = [*tail[-63:], ev.token_id]
                continue
            if ev.kind == "reasoning":
                reasoning.append(ev.text)
            if ev.kind == "tool_call" and ev.tool_call is not None:
                n_calls += 1
                call = ev.tool_call
                yield Delta("tool_call", "", ToolCallOut(call.name, dict(call.arguments)))
            elif ev.text:
                yield Delta(ev.kind, ev.text)
        if not started:
            yield Started(prompt_tokens)
        yield _finished(
            engine, params, prompt_tokens, final, tail, "".join(reasoning), n_calls
        )

    return run


def _finished(
    engine: ChatEngine,
    params: SamplingParams,
    prompt_tokens: int,
    final: StreamEvent | None,
    tail: list[int],
    reasoning: str,
    n_calls: int,
) -> Finished:
    reason = (final.finish_reason if final else None) or "stop"
    if reason not in ("stop", "length", "cancelled"):
        raise RuntimeError(f"generation ended with {reason!r}")
    timings = final.timings if final else None
    completion = timings.completion_tokens if timings else 0
    stop_sequence = None
    if reason == "stop" and final is not None:
        stop_sequence = _matched_stop(engine, params, tail)
    return Finished(
        reason="tool_calls" if n_calls and reason == "stop" else reason,
        prompt_tokens=timings.prompt_tokens if timings and timings.prompt_tokens else prompt_tokens,
        completion_tokens=completion,
        reasoning_tokens=len(engine.tokenizer.encode(reasoning)) if reasoning else 0,
        cached_tokens=timings.cached_tokens if timings else 0,
        stop_sequence=stop_sequence,
        timings=timings,
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


@dataclass
class Generation:
    """The asyncio side of one chat job. Use `async with` so a client that leaves cancels it."""

    stream: JobStream[Event]
    trace: RequestTrace
    keepalive_s: float
    is_disconnected: Callable[[], bool]
    first_token_at: float | None = None
    finished: Finished | None = None

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: Any
    ) -> None:
        self.stream.cancel()
        if e is not None and not isinstance(e, (ConnectionError, asyncio.CancelledError)):
            self.trace.failed(e)
        elif self.finished is None:
            self.trace.aborted(self.stream)

    async def events(self) -> AsyncIterator[Event | KeepAlive]:
        poll = min(0.5, self.keepalive_s)
        idle_since = time.monotonic()
        while True:
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
    trace: RequestTrace,
    *,
    keepalive_s: float,
    is_disconnected: Callable[[], bool],
) -> Generation:
    """Queue `job` (EngineOverloadedError when the queue is full)."""
    if not job.messages:
        raise InvalidRequestError("messages must not be empty")
    stream = worker.submit_stream(chat_job(engine, job))
    return Generation(stream, trace, keepalive_s, is_disconnected)


@dataclass(frozen=True)
class Collected:
    reasoning: str
    content: str
    tool_calls: list[ToolCallOut]
    finished: Finished


async def collect(gen: Generation) -> Collected:
    """Run a generation to its end (non-streaming responses)."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[ToolCallOut] = []
    async for ev in gen.events():
        if isinstance(ev, Delta):
            if ev.kind == "tool_call" and ev.tool_call is not None:
                calls.append(ev.tool_call)
            else:
                (reasoning if ev.kind == "reasoning" else content).append(ev.text)
    if gen.finished is None:
        raise RuntimeError("the generation ended without a final event")
    return Collected("".join(reasoning), "".join(content), calls, gen.finished)
