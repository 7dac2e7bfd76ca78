"""Reading a JSON request body and its fields with typed checks.

Every failure is a BadRequest naming the field, so it becomes a 400 in the caller's protocol.
A body is refused as a whole when it is not UTF-8 JSON, nests deeper than MAX_DEPTH, holds a
lone UTF-16 surrogate, NaN / Infinity or an integer too long for Python to parse: every later
step (templates, logs, SSE) may then assume valid, shallow, encodable data.
Knows nothing about any particular protocol.
"""
from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from .errors import BadRequest

MAX_DEPTH = 64                 # arrays / objects inside each other (tool schemas need ~10)
MAX_INT = 2**63 - 1            # integer fields beyond int64 are refused, not passed on
MAX_SEED = 2**64 - 1           # seeds are u64 (serving-api.md §3)
_SURROGATE = re.compile("[\ud800-\udfff]")


async def read_json(request: web.Request) -> dict[str, Any]:
    return parse_json(await request.read())


def _no_constant(name: str) -> Any:
    raise BadRequest(f"request body is not valid JSON: {name} is not a JSON number",
                     code="invalid_json")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a BadRequest saying why not."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid UTF-8", code="invalid_json") from None
    except RecursionError:  # json's C scanner stops near 1000 levels
        raise BadRequest(f"request body nests deeper than {MAX_DEPTH} levels",
                         code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    _check_tree(body)
    return body


def _check_tree(body: dict[str, Any]) -> None:
    """Refuse nesting beyond MAX_DEPTH and lone surrogates (UTF-8 cannot encode them)."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                raise BadRequest("request body holds a lone UTF-16 surrogate escape "
                                 "(\\ud800-\\udfff without its pair)", code="invalid_json")
            continue
        if not isinstance(v, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise BadRequest(f"request body nests deeper than {MAX_DEPTH} levels",
                             code="invalid_json")
        items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
        stack.extend((item, depth + 1) for item in items if isinstance(item, (str, dict, list)))


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
            dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


class Fields:
    """Typed accessors over one JSON object; `prefix` names nested objects in messages."""

    def __init__(self, obj: dict[str, Any], prefix: str = "") -> None:
        self.obj = obj
        self.prefix = prefix

    def _bad(self, key: str, want: str) -> BadRequest:
        got = _type_name(self.obj[key])
        return BadRequest(f"{self.prefix}{key} must be {want}, got {got}", param=self.prefix + key)

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def raw(self, key: str) -> Any:
        return self.obj.get(key)

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        if not self.has(key):
            if required:
                raise BadRequest(f"{self.prefix}{key} is required", param=self.prefix + key)
            return default
        v = self.obj[key]
        if not isinstance(v, str):
            raise self._bad(key, "a string")
        return v

    def boolean(self, key: str, default: bool | None = None) -> bool | None:
        if not self.has(key):
            return default
        v = self.obj[key]
        if not isinstance(v, bool):
            raise self._bad(key, "a boolean")
        return v

    def integer(
        self, key: str, default: int | None = None, *, minimum: int | None = None,
        maximum: int = MAX_INT,
    ) -> int | None:
        if not self.has(key):
            return default
        v = self.obj[key]
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._bad(key, "an integer")
        if minimum is not None and v < minimum:
            raise BadRequest(f"{self.prefix}{key} must be >= {minimum}, got {v}",
                             param=self.prefix + key)
        if v > maximum or v < -MAX_INT:
            raise BadRequest(f"{self.prefix}{key} must be <= {maximum}", param=self.prefix + key)
        return v

    def number(self, key: str, default: float | None = None, *,
               lo: float | None = None, hi: float | None = None) -> float | None:
        if not self.has(key):
            return default
        v = self.obj[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self._bad(key, "a number")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise BadRequest(f"{self.prefix}{key} must be in [{lo}, {hi}], got {v}",
                             param=self.prefix + key)
        return float(v)

    def array(self, key: str, *, required: bool = False) -> list[Any] | None:
        if not self.has(key):
            if required:
                raise BadRequest(f"{self.prefix}{key} is required", param=self.prefix + key)
            return None
        v = self.obj[key]
        if not isinstance(v, list):
            raise self._bad(key, "an array")
        return v

    def object(self, key: str) -> dict[str, Any] | None:
        if not self.has(key):
            return None
        v = self.obj[key]
        if not isinstance(v, dict):
            raise self._bad(key, "an object")
        return v

    def stop(self, key: str) -> tuple[str, ...]:
        """A stop field: a string or an array of strings."""
        v = self.obj.get(key)
        if v is None:
            return ()
        if isinstance(v, str):
            return (v,) if v else ()
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            return tuple(s for s in v if s)
        raise self._bad(key, "a string or an array of strings")


def as_object(value: Any, where: str) -> Fields:
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object, got {_type_name(value)}", param=where)
    return Fields(value, where + ".")
