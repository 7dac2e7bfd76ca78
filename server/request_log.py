"""RequestLog: one JSON object per line per request event (start, done, error), keys redacted.

Writes from the event loop thread only. Text that UTF-8 cannot encode (a header's undecodable
bytes, kept by aiohttp as surrogates) is written as `\\udcXX` escapes, never an exception.
Knows nothing about protocols; callers pass plain dicts.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import IO, Any

SCHEMA = 1
_SECRET_HEADERS = ("authorization", "x-api-key", "proxy-authorization", "cookie")
_BEARER = re.compile(r"(?i)\b(bearer)\s+\S+")


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    """Headers with every credential replaced by "[redacted]"."""
    return {
        k: "[redacted]" if k.lower() in _SECRET_HEADERS else _BEARER.sub(r"\1 [redacted]", v)
        for k, v in headers.items()
    }


class RequestLog:
    def __init__(self, path: str | Path, *, secrets: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._secrets = tuple(s for s in secrets if s)
        self._file: IO[str] | None = self.path.open(
            "a", encoding="utf-8", errors="backslashreplace")

    def write(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        record = {"schema": SCHEMA, "event": event, "time": time.time(), **fields}
        line = json.dumps(record, ensure_ascii=False, default=str)
        for secret in self._secrets:  # belt and braces: a key echoed anywhere never lands on disk
            line = line.replace(secret, "[redacted]")
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
