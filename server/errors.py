"""Maps exceptions to HTTP error bodies in each protocol's shape (OpenAI or Anthropic).

Knows the status → type tables of serving-api.md §9 and which statuses carry `Retry-After`
(429 / 503 / 529); knows nothing about handlers or routes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from ninfer_nb.errors import InvalidRequestError, NinferError

Protocol = Literal["openai", "anthropic"]


class BadRequest(InvalidRequestError):
    """A 400 naming the offending request field (`param`)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.param = param


class HttpError(NinferError):
    """An error with an explicit status, for conditions that are not engine errors."""

    def __init__(self, status: int, message: str, *, code: str,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message, code=code)
        self.http_status = status
        self.retry_after_s = retry_after_s


RETRY_STATUSES = (429, 503, 529)   # every one of these tells the client when to come back
DEFAULT_RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ApiError:
    status: int
    message: str
    code: str | None
    param: str | None = None
    retry_after_s: int | None = None   # seconds, sent as `Retry-After` on 429 / 503 / 529

    def openai_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": _openai_type(self.status),
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_status(self) -> int:
        return 529 if self.status == 429 else 504 if self.status == 408 else self.status

    def anthropic_body(self, request_id: str | None) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {"type": _anthropic_type(self.anthropic_status()), "message": self.message},
            "request_id": request_id,
        }


def _openai_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    return "server_error" if status >= 500 or status == 429 else "invalid_request_error"


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    504: "timeout_error",
    529: "overloaded_error",
}


def _anthropic_type(status: int) -> str:
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


def to_api_error(exc: BaseException) -> ApiError:
    """The error a client sees for `exc`; unknown exceptions become a 500 without details."""
    if isinstance(exc, NinferError):
        code = "server_overloaded" if exc.http_status == 429 else exc.code
        return ApiError(exc.http_status, exc.message, code, getattr(exc, "param", None),
                        getattr(exc, "retry_after_s", None))
    if isinstance(exc, web.HTTPException):
        status = exc.status
        message = exc.reason if status != 413 else "request body is too large"
        return ApiError(status, message, _HTTP_CODES.get(status, f"http_{status}"))
    return ApiError(500, "internal server error", "internal_error")


def protocol_for(path: str) -> Protocol:
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def error_response(err: ApiError, protocol: Protocol, request_id: str | None) -> web.Response:
    if protocol == "anthropic":
        body = err.anthropic_body(request_id)
        status = err.anthropic_status()
    else:
        body, status = err.openai_body(), err.status
    headers = {}
    if status in RETRY_STATUSES:
        headers["Retry-After"] = str(err.retry_after_s or DEFAULT_RETRY_AFTER_S)
    return web.Response(status=status, text=json.dumps(body), content_type="application/json",
                        headers=headers)


def failure_reason(status: int) -> str:
    """The metrics label of a rejected request (serving-api.md §11)."""
    if status in (429, 529):
        return "overload"
    if status == 503:
        return "unavailable"
    if status in (408, 504):
        return "timeout"
    return "client_input" if 400 <= status < 500 else "internal"
