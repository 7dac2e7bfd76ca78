"""RequestTrace: records one HTTP request's outcome exactly once, in the metrics and the log.

The middleware opens a trace per request; generations report to it (queued, done, failed,
aborted); whatever ends first is the request's single terminal record. Knows no protocol shapes.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .errors import failure_reason, to_api_error
from .metrics import Metrics
from .request_log import RequestLog, redact_headers

if TYPE_CHECKING:
    from ninfer_nb.engine.worker import JobStream

    from .generation import Finished

_METRIC_REASON = {"stop": "stop", "tool_calls": "stop", "length": "length", "cancelled": "abort"}


class RequestTrace:
    def __init__(
        self,
        metrics: Metrics,
        log: RequestLog | None,
        request_id: str,
        method: str,
        path: str,
        headers: dict[str, str],
    ) -> None:
        self.metrics = metrics
        self.log = log
        self.request_id = request_id
        self.t0 = time.monotonic()
        self.terminal = False
        self.notes: dict[str, Any] = {}
        if log is not None:
            log.write(
                "request_start", request_id=request_id, method=method, path=path,
                headers=redact_headers(headers),
            )

    def note(self, **fields: Any) -> None:
        """Request facts (model, stream, …) repeated in the terminal record."""
        self.notes.update(fields)

    def done(self, stream: JobStream[Any], fin: Finished, first_token_at: float | None) -> None:
        if self.terminal:
            return
        self.terminal = True
        now = time.monotonic()
        started = stream.started_at or stream.submitted_at
        t = fin.timings
        decode_s = t.decode_s if t else (now - first_token_at if first_token_at else 0.0)
        prefill_s = t.prefill_s if t else ((first_token_at or now) - started)
        ttft_s = (first_token_at - self.t0) if first_token_at else None
        queue_s, e2e_s = started - stream.submitted_at, now - self.t0
        self.metrics.observe_success(
            _METRIC_REASON[fin.reason], prompt_tokens=fin.prompt_tokens,
            cached_tokens=fin.cached_tokens, completion_tokens=fin.completion_tokens,
            queue_s=queue_s, ttft_s=ttft_s, prefill_s=prefill_s, decode_s=decode_s, e2e_s=e2e_s,
        )
        if self.log is not None:
            self.log.write(
                "request_done", request_id=self.request_id, status=200, **self.notes,
                finish_reason=fin.reason, prompt_tokens=fin.prompt_tokens,
                completion_tokens=fin.completion_tokens, reasoning_tokens=fin.reasoning_tokens,
                cached_tokens=fin.cached_tokens, queue_s=queue_s, ttft_s=ttft_s,
                prefill_s=prefill_s, decode_s=decode_s, e2e_s=e2e_s,
            )

    def aborted(self, stream: JobStream[Any] | None = None) -> None:
        """The client went away before the end (metrics: client_disconnected)."""
        if self.terminal:
            return
        self.terminal = True
        self.metrics.observe_failure("client_disconnected")
        if self.log is not None:
            self.log.write("request_error", request_id=self.request_id, status=499,
                           code="client_disconnected", message="client disconnected",
                           e2e_s=time.monotonic() - self.t0, **self.notes)

    def failed(self, exc: BaseException) -> None:
        if self.terminal:
            return
        self.terminal = True
        err = to_api_error(exc)
        self.metrics.observe_failure(failure_reason(err.status))
        if self.log is not None:
            self.log.write("request_error", request_id=self.request_id, status=err.status,
                           code=err.code, message=err.message,
                           e2e_s=time.monotonic() - self.t0, **self.notes)

    def finished_plain(self, status: int) -> None:
        """A request without generation (models, count_tokens, …) answered with `status`."""
        if self.terminal:
            return
        self.terminal = True
        if self.log is not None:
            self.log.write("request_done", request_id=self.request_id, status=status,
                           e2e_s=time.monotonic() - self.t0, **self.notes)
