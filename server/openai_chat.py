"""POST /v1/chat/completions: OpenAI Chat Completions, streamed (SSE chunks) or not.

Translates generation events into `chat.completion` / `chat.completion.chunk` objects
(serving-api.md §3.1–3.2). Request parsing lives in openai_input.py.
"""
from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from ninfer_nb.engine.logprobs import TokenLogprobs

from .errors import to_api_error
from .fields import read_json
from .generation import (
    ChoiceEnd,
    Delta,
    Finished,
    Generation,
    KeepAlive,
    Started,
    ToolCallOut,
    collect,
)
from .logprobs_json import TokenTexts, chat_logprobs
from .messages import dump_arguments
from .openai_input import ChatOptions, parse_chat_request
from .sse import SSEWriter
from .state import STATE, new_id, trace_of

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "cancelled": "stop"}


def usage(fin: Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.total_tokens,
        "completion_tokens_details": {"reasoning_tokens": fin.reasoning_tokens},
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
    }


def timings_json(fin: Finished) -> dict[str, Any] | None:
    """Engine-side timings (extension, llama.cpp style): network time not included."""
    return fin.timings.as_dict() if fin.timings is not None else None


def tool_calls_json(calls: list[ToolCallOut]) -> list[dict[str, Any]]:
    return [
        {"index": i, "id": new_id("call_"), "type": "function",
         "function": {"name": c.name, "arguments": dump_arguments(c.arguments)}}
        for i, c in enumerate(calls)
    ]


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    job, options = parse_chat_request(state, await read_json(request))
    trace_of(request).note(protocol="openai.chat", model=options.model, stream=options.stream)
    gen = await state.generate(request, job)
    texts = TokenTexts(state.engine.tokenizer)
    async with gen:
        if options.stream:
            return await _stream(request, gen, options, texts)
        out = await collect(gen)
    choices = []
    for c in out.choices:
        calls = tool_calls_json(c.tool_calls or [])
        for call in calls:
            del call["index"]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": c.content if c.content or not calls else None,
            "reasoning_content": c.reasoning or None,
        }
        if calls:
            message["tool_calls"] = calls
        reason = c.end.reason if c.end is not None else out.finished.reason
        choices.append({"index": c.index, "message": message,
                        "logprobs": chat_logprobs(c.logprobs or [], texts)
                        if options.logprobs else None,
                        "finish_reason": _FINISH[reason]})
    body = {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": options.model,
        "choices": choices,
        "usage": usage(out.finished),
    }
    if (timings := timings_json(out.finished)) is not None:
        body["timings"] = timings
    return web.json_response(body)


async def _stream(
    request: web.Request, gen: Generation, options: ChatOptions, texts: TokenTexts
) -> web.StreamResponse:
    sse = SSEWriter(request)
    head = {"id": new_id("chatcmpl-"), "object": "chat.completion.chunk",
            "created": int(time.time()), "model": options.model}

    def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0,
              lps: tuple[TokenLogprobs, ...] = ()) -> dict[str, Any]:
        logprobs = chat_logprobs(lps, texts) if options.logprobs and lps else None
        body = {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish}]}
        if options.include_usage:
            body["usage"] = None
        return body

    calls: dict[int, list[ToolCallOut]] = {}
    try:
        async for ev in gen.events():
            if isinstance(ev, KeepAlive):
                await sse.comment()
            elif isinstance(ev, Started):
                for i in range(options.n):
                    await sse.send(chunk({"role": "assistant", "content": ""}, index=i))
            elif isinstance(ev, Delta):
                if ev.kind == "tool_call" and ev.tool_call is not None:
                    # each call as soon as the parser has it whole, numbered per choice
                    done = calls.setdefault(ev.index, [])
                    done.append(ev.tool_call)
                    body = tool_calls_json([ev.tool_call])
                    body[0]["index"] = len(done) - 1
                    await sse.send(chunk({"tool_calls": body}, index=ev.index))
                else:
                    key = "reasoning_content" if ev.kind == "reasoning" else "content"
                    await sse.send(chunk({key: ev.text}, index=ev.index, lps=ev.logprobs))
            elif isinstance(ev, ChoiceEnd):
                final = chunk({}, _FINISH[ev.reason], ev.index, ev.logprobs)
                if ev.timings is not None:
                    final["timings"] = ev.timings.as_dict()
                await sse.send(final)
            elif isinstance(ev, Finished):
                if options.include_usage:
                    await sse.send({**head, "choices": [], "usage": usage(ev)})
    except ConnectionError:
        raise
    except Exception as exc:
        if not sse.prepared:
            raise  # nothing sent yet: a normal HTTP error
        trace_of(request).failed(exc)
        await end_stream_with_error(sse, exc)
        return await sse.close()
    await sse.done()
    return await sse.close()


async def end_stream_with_error(sse: SSEWriter, exc: BaseException) -> None:
    """A failure after the stream began: the error event, then `[DONE]` (the stream's end)."""
    try:
        await sse.send(to_api_error(exc).openai_body())
        await sse.done()
    except ConnectionError:
        pass  # the client is gone
