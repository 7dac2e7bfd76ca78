"""create_app: the aiohttp Application for one engine — routes, middlewares, lifecycle.

The engine is injected (the real `ninfer_nb.LLM` or a test double); the worker thread that
owns it and the prompt threads start here. Shutdown drains (server/drain.py) before aiohttp
closes the connections, then stops the threads. Knows nothing about argument parsing.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from ninfer_nb.engine.faults import fatal_fault
from ninfer_nb.engine.worker import EngineWorker

from . import anthropic, completions, info, openai_chat, responses
from .config import ServerConfig
from .drain import drain
from .engine import ChatEngine
from .metrics import Metrics
from .middlewares import handle_request, on_response_prepare
from .prompt import PromptBuilder
from .request_log import RequestLog
from .response_store import ResponseStore
from .state import STATE, ServerState

ENGINE_STOP_S = 5.0   # after the drain: the engine thread's last (cancelled) step


async def _drain_on_shutdown(app: web.Application) -> None:
    """A no-op when `ninfer-serve` already drained with the listener still open."""
    await drain(app, app[STATE].config.shutdown_timeout_s)


def setup_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/health", info.health)
    r.add_get("/metrics", info.metrics)
    r.add_get("/v1/models", info.list_models)
    r.add_get("/v1/models/{model_id:.+}", info.get_model)
    r.add_post("/v1/chat/completions", openai_chat.chat_completions)
    r.add_post("/v1/completions", completions.completions)
    r.add_post("/tokenize", completions.tokenize)
    r.add_post("/detokenize", completions.detokenize)
    r.add_get("/tokenizer_info", completions.tokenizer_info)
    r.add_post("/v1/responses", responses.create_response)
    r.add_post("/v1/responses/input_tokens", responses.input_tokens)
    r.add_get("/v1/responses/{response_id}", responses.get_response)
    r.add_delete("/v1/responses/{response_id}", responses.delete_response)
    r.add_get("/v1/responses/{response_id}/input_items", responses.get_input_items)
    r.add_post("/v1/responses/{response_id}/cancel", responses.cancel_response)
    r.add_post("/v1/messages", anthropic.messages)
    r.add_post("/v1/messages/count_tokens", anthropic.count_tokens)


def create_app(
    engine: ChatEngine, config: ServerConfig, *, worker: EngineWorker | None = None
) -> web.Application:
    model_id = config.model_id or engine.model_id
    state = ServerState(
        config=config,
        engine=engine,
        worker=worker or EngineWorker(
            max_pending=config.max_pending,
            # as many generations take turns as the engine decodes at once
            max_active=getattr(engine, "max_concurrency", 1),
            # a device fault the engine cannot recover from stops the worker (/health, exit 3)
            fault_check=lambda exc: fatal_fault(exc, getattr(engine, "backend", None))),
        model_id=model_id,
        metrics=Metrics(model_id, engine.max_context),
        log=RequestLog(config.request_log, secrets=(config.api_key or "",))
        if config.request_log else None,
        responses=ResponseStore(config.response_store_max),
        prompts=PromptBuilder(engine),
    )
    # +1: a body exactly at the limit is allowed; the middleware checks Content-Length first.
    app = web.Application(middlewares=[handle_request],
                          client_max_size=config.max_request_bytes + 1)
    app[STATE] = state
    app.on_response_prepare.append(on_response_prepare)
    app.on_shutdown.append(_drain_on_shutdown)
    app.cleanup_ctx.append(_lifecycle)
    setup_routes(app)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    if state.log is not None:
        state.log.write("server_start", model_id=state.model_id,
                        max_context=state.engine.max_context,
                        max_pending=state.config.max_pending)
    yield
    # The drain has ended every generation: the engine thread has at most a cancelled step left.
    await asyncio.get_running_loop().run_in_executor(
        None, state.worker.close, ENGINE_STOP_S
    )
    state.prompts.close()
    if state.log is not None:
        state.log.write("server_stop", model_id=state.model_id)
        state.log.close()
