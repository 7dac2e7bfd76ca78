"""POST /v1/messages and /v1/messages/count_tokens: Anthropic Messages (serving-api.md §5).

Translates generation events into a `message` object or its SSE event sequence (thinking,
text and tool_use blocks, message_delta, message_stop). Request parsing is in anthropic_input.py.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from .anthropic_input import parse_messages, parse_messages_request, parse_tools, thinking_enabled
from .errors import to_api_error
from .fields import Fields, read_json
from .generation import ChatJob, Delta, Finished, Generation, KeepAlive, Started, ToolCallOut, collect
from .messages import dump_arguments
from .route_fields import check_fields
from .sse import SSEWriter
from .state import REQUEST_ID, STATE, new_id, trace_of


def stop_reason(fin: Finished) -> str:
    if fin.reason == "tool_calls":
        return "tool_use"
    if fin.reason == "length":
        return "max_tokens"
    return "stop_sequence" if fin.stop_sequence else "end_turn"


def usage(fin: Finished) -> dict[str, Any]:
    return {"input_tokens": fin.prompt_tokens, "output_tokens": fin.completion_tokens,
            "cache_read_input_tokens": fin.cached_tokens, "cache_creation_input_tokens": None}


def tool_use(call: ToolCallOut) -> dict[str, Any]:
    return {"type": "tool_use", "id": new_id("toolu_"), "name": call.name,
            "input": call.arguments}


async def messages(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    job, options = parse_messages_request(state, await read_json(request))
    trace_of(request).note(protocol="anthropic", model=options.model, stream=options.stream)
    message_id = new_id("msg_")
    gen = await state.generate(request, job)
    async with gen:
        if options.stream:
            return await _stream(request, gen, message_id, options.model)
        out = await collect(gen)
    content: list[dict[str, Any]] = []
    if out.reasoning:
        content.append({"type": "thinking", "thinking": out.reasoning, "signature": ""})
    if out.content or not (out.reasoning or out.tool_calls):
        content.append({"type": "text", "text": out.content})
    content.extend(tool_use(c) for c in out.tool_calls)
    return web.json_response({
        "id": message_id, "type": "message", "role": "assistant", "model": options.model,
        "content": content, "stop_reason": stop_reason(out.finished),
        "stop_sequence": out.finished.stop_sequence, "usage": usage(out.finished),
    })


class _Blocks:
    """Opens and closes content blocks in order; one block per run of one kind."""

    def __init__(self, sse: SSEWriter) -> None:
        self.sse = sse
        self.index = -1
        self.open_kind: str | None = None

    async def open(self, kind: str, block: dict[str, Any]) -> None:
        await self.close()
        self.index += 1
        self.open_kind = kind
        await self.sse.send({"type": "content_block_start", "index": self.index,
                             "content_block": block}, "content_block_start")

    async def delta(self, delta: dict[str, Any]) -> None:
        await self.sse.send({"type": "content_block_delta", "index": self.index, "delta": delta},
                            "content_block_delta")

    async def close(self) -> None:
        if self.open_kind is None:
            return
        if self.open_kind == "reasoning":
            await self.delta({"type": "signature_delta", "signature": ""})
        await self.sse.send({"type": "content_block_stop", "index": self.index},
                            "content_block_stop")
        self.open_kind = None


async def _stream(
    request: web.Request, gen: Generation, message_id: str, model: str
) -> web.StreamResponse:
    sse = SSEWriter(request)
    blocks = _Blocks(sse)
    try:
        async for ev in gen.events():
            if isinstance(ev, KeepAlive):
                await sse.comment()
            elif isinstance(ev, Started):
                await sse.send({"type": "message_start", "message": {
                    "id": message_id, "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": ev.prompt_tokens, "output_tokens": 0}}},
                    "message_start")
            elif isinstance(ev, Delta) and ev.tool_call is not None:
                block = tool_use(ev.tool_call)     # each call as soon as it is parsed whole
                await blocks.open("tool_use", {**block, "input": {}})
                await blocks.delta({"type": "input_json_delta",
                                    "partial_json": dump_arguments(ev.tool_call.arguments)})
            elif isinstance(ev, Delta):
                if blocks.open_kind != ev.kind:
                    empty = ({"type": "thinking", "thinking": "", "signature": ""}
                             if ev.kind == "reasoning" else {"type": "text", "text": ""})
                    await blocks.open(ev.kind, empty)
                await blocks.delta({"type": "thinking_delta", "thinking": ev.text}
                                   if ev.kind == "reasoning" else
                                   {"type": "text_delta", "text": ev.text})
            elif isinstance(ev, Finished):
                await blocks.close()
                await sse.send({"type": "message_delta",
                                "delta": {"stop_reason": stop_reason(ev),
                                          "stop_sequence": ev.stop_sequence},
                                "usage": {"output_tokens": ev.completion_tokens}},
                               "message_delta")
                await sse.send({"type": "message_stop"}, "message_stop")
    except ConnectionError:
        raise
    except Exception as exc:
        if not sse.prepared:
            raise
        trace_of(request).failed(exc)
        err = to_api_error(exc)
        await sse.send(err.anthropic_body(request.get(REQUEST_ID)), "error")
    return await sse.close()


async def count_tokens(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await read_json(request)
    check_fields("/v1/messages/count_tokens", body)
    f = Fields(body)
    f.string("model", required=True)
    job = ChatJob(parse_messages(f), parse_tools(f), state.sampling(1),
                  thinking_enabled(state, f))
    return web.json_response({"input_tokens": await state.count_tokens(job)})
