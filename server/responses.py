"""OpenAI Responses routes: POST /v1/responses (+ /input_tokens), GET/DELETE /v1/responses/{id}.

Chains `previous_response_id` through the in-memory ResponseStore; output shaping is in
responses_output.py and request parsing in responses_input.py.
"""
from __future__ import annotations

from typing import Any

from aiohttp import web

from . import messages as m
from .engine import Message
from .errors import BadRequest, HttpError, to_api_error
from .fields import read_json
from .generation import ChatJob, Delta, Finished, KeepAlive, Started
from .logprobs_json import TokenTexts, chat_entry
from .response_store import StoredResponse
from .responses_input import ResponsesRequest, leading_system, parse_responses_request
from .responses_output import ResponseBuilder
from .sse import SSEWriter
from .state import STATE, ServerState, new_id, trace_of


def _conversation(state: ServerState, req: ResponsesRequest) -> list[Message]:
    prior: list[Message] = []
    if req.previous_response_id:
        stored = state.responses.get(req.previous_response_id)
        if stored is None:
            raise HttpError(404, f"previous response {req.previous_response_id!r} not found",
                            code="previous_response_not_found")
        prior = stored.conversation
    return [*prior, *req.input_messages]


def _job(req: ResponsesRequest, conversation: list[Message]) -> ChatJob:
    head = [m.system(req.instructions)] if req.instructions else []
    msgs = leading_system([*head, *conversation])
    if not any(msg["role"] != "system" for msg in msgs):
        raise BadRequest("input must contain at least one message", param="input")
    return ChatJob(msgs, req.tools, req.params, req.enable_thinking, req.output,
                   thinking_budget=req.thinking_budget)


def _store(state: ServerState, req: ResponsesRequest, conversation: list[Message],
           builder: ResponseBuilder) -> None:
    if not req.store or builder.status not in ("completed", "incomplete"):
        return
    calls = [m.tool_call(c["call_id"], c["name"], m.parse_arguments(c["arguments"], "arguments"))
             for c in builder.calls]
    turn = m.assistant(builder.content, builder.reasoning or None, calls)
    state.responses.put(builder.id, StoredResponse(builder.snapshot(), req.input_items,
                                                   [*conversation, turn]))


async def create_response(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = parse_responses_request(state, await read_json(request))
    trace_of(request).note(protocol="openai.responses", model=req.model, stream=req.stream)
    conversation = _conversation(state, req)
    builder = ResponseBuilder(new_id("resp_", 32), req)
    gen = await state.generate(request, _job(req, conversation))
    sse = SSEWriter(request) if req.stream else None
    texts = TokenTexts(state.engine.tokenizer)

    async def emit(events: list[dict[str, Any]]) -> None:
        if sse is not None:
            for ev in events:
                await sse.send(ev, ev["type"])

    async with gen:
        try:
            async for ev in gen.events():
                if isinstance(ev, KeepAlive):
                    if sse is not None:
                        await sse.comment()
                elif isinstance(ev, Started):
                    await emit(builder.start())
                elif isinstance(ev, Delta) and ev.tool_call is not None:
                    await emit(builder.call(ev.tool_call))   # as soon as it is parsed whole
                elif isinstance(ev, Delta):
                    lps = [chat_entry(lp, texts) for lp in ev.logprobs] if ev.logprobs else None
                    await emit(builder.delta(ev.kind, ev.text, lps))
                elif isinstance(ev, Finished):
                    await emit(builder.finish(ev, []))
        except ConnectionError:
            raise
        except Exception as exc:
            if sse is None or not sse.prepared:
                raise
            trace_of(request).failed(exc)
            await emit(builder.fail(to_api_error(exc)))
            return await sse.close()
    _store(state, req, conversation, builder)
    if sse is not None:
        return await sse.close()
    return web.json_response(builder.snapshot())


def _stored(request: web.Request) -> tuple[ServerState, str, StoredResponse]:
    state = request.app[STATE]
    response_id = request.match_info["response_id"]
    stored = state.responses.get(response_id)
    if stored is None:
        raise HttpError(404, f"response {response_id!r} not found", code="not_found")
    return state, response_id, stored


async def get_response(request: web.Request) -> web.Response:
    return web.json_response(_stored(request)[2].response)


async def get_input_items(request: web.Request) -> web.Response:
    items = _stored(request)[2].input_items
    return web.json_response({"object": "list", "data": items, "has_more": False,
                              "first_id": None, "last_id": None})


async def delete_response(request: web.Request) -> web.Response:
    state, response_id, _ = _stored(request)
    state.responses.delete(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


async def cancel_response(request: web.Request) -> web.Response:
    _stored(request)
    raise BadRequest("only background responses can be cancelled; this server has none",
                     code="unsupported")


async def input_tokens(request: web.Request) -> web.Response:
    state = request.app[STATE]
    req = parse_responses_request(state, await read_json(request))
    n = await state.count_tokens(_job(req, _conversation(state, req)))
    return web.json_response({"object": "response.input_tokens", "input_tokens": n})
