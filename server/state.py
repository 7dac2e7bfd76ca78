"""ServerState: what every handler needs (config, engine, worker, metrics, log, stores).

Stored once in the app under the typed key `STATE`. `generate` renders and tokenizes a request's
prompt off the engine thread, queues its chat job and wires it to the request's trace and
disconnect check; the live generations are kept so that a drain can end them. Knows no protocol
shapes.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ninfer_nb.engine.worker import EngineWorker, JobFn
from ninfer_nb.errors import ModelNotFoundError
from ninfer_nb.params import SamplingParams

from .config import ServerConfig
from .engine import ChatEngine
from .errors import BadRequest, HttpError
from .generation import ChatJob, Generation, start_generation
from .metrics import Metrics
from .prompt import PromptBuilder
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
    prompts: PromptBuilder
    started_at: float = field(default_factory=time.time)
    draining: bool = False                  # set once on SIGINT / SIGTERM; never cleared
    generations: set[Generation] = field(default_factory=set)

    def shutting_down(self) -> HttpError:
        return HttpError(503, "the server is shutting down; retry on another instance",
                         code="server_shutting_down",
                         retry_after_s=max(1, round(self.config.shutdown_timeout_s)))

    async def generate(self, request: web.Request, job: ChatJob) -> Generation:
        def gone() -> bool:
            transport = request.transport
            return transport is None or transport.is_closing()

        prompt = await self.prompts.build(job.messages, job.tools, job.enable_thinking)
        constraint = await self.prompts.constraint(job.output, prompt) if job.output else None
        if self.draining:  # the drain began while the prompt was being tokenized
            raise self.shutting_down()
        gen = start_generation(
            self.worker, self.engine, job, prompt, request[TRACE],
            keepalive_s=self.config.keepalive_s, is_disconnected=gone,
            on_exit=self.generations.discard, constraint=constraint,
        )
        self.generations.add(gen)
        return gen

    def start_job(self, request: web.Request, fn: JobFn[Any]) -> Generation:
        """Queue an engine-thread job of generation events (completions) like `generate`."""
        def gone() -> bool:
            transport = request.transport
            return transport is None or transport.is_closing()

        if self.draining:
            raise self.shutting_down()
        gen = Generation(self.worker.submit_stream(fn), request[TRACE], self.config.keepalive_s,
                         gone, self.generations.discard)
        self.generations.add(gen)
        return gen

    async def count_tokens(self, job: ChatJob) -> int:
        """The prompt's tokens, counted off the engine thread."""
        return await self.prompts.count(job.messages, job.tools, job.enable_thinking)

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
