"""ServerState: what every handler needs (config, engine, worker, metrics, log, stores).

Stored once in the app under the typed key `STATE`. `generate` queues one chat job for a request
and wires it to that request's trace and disconnect check. Knows no protocol shapes.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web

from ninfer_nb.engine.worker import EngineWorker
from ninfer_nb.errors import ModelNotFoundError
from ninfer_nb.params import SamplingParams

from .config import ServerConfig
from .engine import ChatEngine
from .errors import BadRequest
from .generation import ChatJob, Generation, start_generation
from .metrics import Metrics
from .request_log import RequestLog
from .response_store import ResponseStore
from .telemetry import RequestTrace

TRACE = web.RequestKey("ninfer_trace", RequestTrace)
REQUEST_ID = web.RequestKey("ninfer_request_id", str)


@dataclass
class ServerState:
    config: ServerConfig
    engine: ChatEngine
    worker: EngineWorker
    model_id: str
    metrics: Metrics
    log: RequestLog | None
    responses: ResponseStore
    started_at: float = field(default_factory=time.time)

    def generate(self, request: web.Request, job: ChatJob) -> Generation:
        def gone() -> bool:
            transport = request.transport
            return transport is None or transport.is_closing()

        return start_generation(
            self.worker, self.engine, job, request[TRACE],
            keepalive_s=self.config.keepalive_s, is_disconnected=gone,
        )

    def sampling(
        self,
        max_tokens: int | None,
        *,
        stop: tuple[str, ...] = (),
        **overrides: float | int | None,
    ) -> SamplingParams:
        """Server defaults, then the request's fields (None = not given), validated."""
        base = self.config.sampling.params(max_tokens or self.config.default_max_tokens)
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            params = base.replace(stop=stop, **given)
        except TypeError as exc:  # an unknown field name is a server bug, not a client error
            raise RuntimeError(str(exc)) from exc
        params.validate()
        return params

    def check_model(self, model: str | None, *, param: str = "model") -> None:
        if model is not None and model != self.model_id:
            raise ModelNotFoundError(
                f"the model {model!r} does not exist; this server serves {self.model_id!r}"
            )
        if model is None:
            raise BadRequest("model is required", param=param)


STATE = web.AppKey("ninfer_state", ServerState)


def new_id(prefix: str, hex_chars: int = 16) -> str:
    return f"{prefix}{secrets.token_hex(hex_chars // 2)}"


def trace_of(request: web.Request) -> RequestTrace:
    return request[TRACE]
