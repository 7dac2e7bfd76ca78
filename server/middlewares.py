"""Request plumbing around every handler: request ids, traces, body limit, auth, CORS, errors.

The one place that turns an exception into an error response (in the route's protocol shape),
so no error can escape to aiohttp or touch another request. Header values arrive as str with
undecodable bytes as surrogates (aiohttp's surrogateescape), so keys are compared as the bytes
that were sent. While the server drains, every new request gets a 503. Knows no protocol fields.
"""
from __future__ import annotations

import asyncio
import hmac
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from ninfer_nb.errors import NinferError

from .errors import HttpError, error_response, protocol_for, to_api_error
from .sse import SSE_RESPONSE
from .state import REQUEST_ID, STATE, TRACE, new_id
from .telemetry import RequestTrace

log = logging.getLogger("ninfer.server")
UNAUTHENTICATED = ("/health",)


def _presented_key(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _check_request(request: web.Request) -> None:
    config = request.app[STATE].config
    length = request.content_length
    if length is not None and length > config.max_request_bytes:
        raise HttpError(
            413, f"request body of {length} bytes is over the limit of "
            f"{config.max_request_bytes} bytes", code="request_too_large",
        )
    if config.api_key and request.path not in UNAUTHENTICATED:
        key = _presented_key(request)
        if key is None:
            raise HttpError(401, "missing API key: send `Authorization: Bearer KEY` or "
                            "`x-api-key: KEY`", code="invalid_api_key")
        if not hmac.compare_digest(_wire_bytes(key), config.api_key.encode()):
            raise HttpError(401, "invalid API key", code="invalid_api_key")


def _wire_bytes(value: str) -> bytes:
    """A header value as the bytes on the wire (aiohttp decoded them with surrogateescape)."""
    return value.encode("utf-8", "surrogateescape")


def _refuse_while_draining(request: web.Request) -> None:
    state = request.app[STATE]
    if state.draining and request.path != "/health":
        raise state.shutting_down()


def _prepared(request: web.Request) -> web.StreamResponse | None:
    """The SSE response already sent to this client, if any."""
    return request.get(SSE_RESPONSE)


@web.middleware
async def handle_request(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    request_id = new_id("req_")
    request[REQUEST_ID] = request_id
    logged = request.path.startswith("/v1/")
    trace = RequestTrace(state.metrics, state.log if logged else None, request_id,
                         request.method, request.path, dict(request.headers))
    request[TRACE] = trace
    if request.method == "OPTIONS" and state.config.cors:
        trace.finished_plain(204)
        return web.Response(status=204)
    try:
        _refuse_while_draining(request)
        _check_request(request)
        response: web.StreamResponse = await handler(request)
    except asyncio.CancelledError:
        trace.aborted()
        raise
    except ConnectionError:
        trace.aborted()
        prepared = _prepared(request)
        return prepared if prepared is not None else web.Response(status=499)
    except Exception as exc:
        if not isinstance(exc, (NinferError, web.HTTPException)):
            log.exception("request %s failed", request_id)
        trace.failed(exc)
        prepared = _prepared(request)
        if prepared is not None:  # already streaming: the handler sent what it could
            return prepared
        return error_response(to_api_error(exc), protocol_for(request.path), request_id)
    trace.finished_plain(response.status)
    return response


async def on_response_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """Headers every response carries, streamed or not (middlewares run too late for SSE)."""
    request_id = request.get(REQUEST_ID)
    if request_id:
        response.headers["request-id"] = request_id
    if request.app[STATE].config.cors:
        response.headers["Access-Control-Allow-Origin"] = "*"
        if request.method == "OPTIONS":
            response.headers["Access-Control-Allow-Methods"] = "*"
            response.headers["Access-Control-Allow-Headers"] = "*"
            response.headers["Access-Control-Max-Age"] = "86400"
