"""POST /v1/chat/completions: OpenAI Chat Completions, streamed (SSE chunks) or not.

Translates generation events into `chat.completion` / `chat.completion.chunk` objects
(serving-api.md §3.1–3.2). Request parsing lives in openai_input.py.
"""
from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from .errors import to_api_error
from .fields import read_json
from .generation import Delta, Finished, Generation, KeepAlive, Started, ToolCallOut, collect
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
    async with gen:
        if options.stream:
            return await _stream(request, gen, options)
        out = await collect(gen)
    calls = tool_calls_json(out.tool_calls)
    for c in calls:
        del c["index"]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": out.content if out.content or not calls else None,
        "reasoning_content": out.reasoning or None,
    }
    if calls:
        message["tool_calls"] = calls
    body = {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": options.model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": _FINISH[out.finished.reason]}],
        "usage": usage(out.finished),
    }
    if (timings := timings_json(out.finished)) is not None:
        body["timings"] = timings
    return web.json_response(body)


async def _stream(
    request: web.Request, gen: Generation, options: ChatOptions
) -> web.StreamResponse:
    sse = SSEWriter(request)
    head = {"id": new_id("chatcmpl-"), "object": "chat.completion.chunk",
            "created": int(time.time()), "model": options.model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        body = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                     "finish_reason": finish}]}
        if options.include_usage:
            body["usage"] = None
        return body

    calls: list[ToolCallOut] = []
    try:
        async for ev in gen.events():
            if isinstance(ev, KeepAlive):
                await sse.comment()
            elif isinstance(ev, Started):
                await sse.send(chunk({"role": "assistant", "content": ""}))
            elif isinstance(ev, Delta):
                if ev.kind == "tool_call" and ev.tool_call is not None:
                    calls.append(ev.tool_call)
                else:
                    key = "reasoning_content" if ev.kind == "reasoning" else "content"
                    await sse.send(chunk({key: ev.text}))
            elif isinstance(ev, Finished):
                if calls:
                    await sse.send(chunk({"tool_calls": tool_calls_json(calls)}))
                final = chunk({}, _FINISH[ev.reason])
                if (timings := timings_json(ev)) is not None:
                    final["timings"] = timings
                await sse.send(final)
                if options.include_usage:
                    await sse.send({**head, "choices": [], "usage": usage(ev)})
    except ConnectionError:
        raise
    except Exception as exc:
        if not sse.prepared:
            raise  # nothing sent yet: a normal HTTP error
        trace_of(request).failed(exc)
        await sse.send(to_api_error(exc).openai_body())
        return await sse.close()
    await sse.done()
    return await sse.close()
