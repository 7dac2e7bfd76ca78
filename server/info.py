"""GET /health, /v1/models, /v1/models/{id} and /metrics: what the server is and how it is doing.

Knows the engine only through `ChatEngine` (stats, model metadata) and runs nothing heavy.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from ninfer_nb.errors import ModelNotFoundError

from .engine import model_meta
from .metrics import CONTENT_TYPE, Gauges
from .state import STATE, ServerState

log = logging.getLogger("ninfer.server")


async def health(request: web.Request) -> web.Response:
    """200 while serving; 503 while draining, so a load balancer stops sending work here, and
    after an unrecoverable device fault (the engine serves nothing more; the process exits
    non-zero so a supervisor restarts it), with the fault's message."""
    state = request.app[STATE]
    fault = state.worker.fault
    if fault is not None:
        return web.json_response({"status": "faulted", "error": {"code": fault.code, "message": fault.message}},
                                 status=503, headers={"Retry-After": "1"})
    if state.draining:
        return web.json_response({"status": "draining"}, status=503, headers={"Retry-After": "1"})
    return web.json_response({"status": "ok"})


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.model_id, "object": "model", "created": int(state.started_at),
        "owned_by": "ninfer", "max_model_len": state.engine.max_context,
        "meta": model_meta(state.engine),
    }


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"object": "list", "data": [_model_card(state)]})


async def get_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    model_id = request.match_info["model_id"]
    if model_id != state.model_id:
        raise ModelNotFoundError(f"the model {model_id!r} does not exist")
    return web.json_response(_model_card(state))


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    usage, capacity = 0.0, state.engine.max_context
    spec: tuple[int, int, int, tuple[int, ...]] = (0, 0, 0, ())
    batch_sizes: dict[int, int] = {}
    try:  # between two decode steps; a stuck engine must not hang the scrape
        stats = await asyncio.wait_for(state.worker.call(state.engine.stats), 2.0)
        total = float(stats.get("kv_cache_bytes") or 0)
        usage = float(stats.get("kv_cache_used_bytes") or 0) / total if total else 0.0
        capacity = int(stats.get("max_context") or capacity)
        spec = (int(stats.get("spec_drafts", 0)), int(stats.get("spec_draft_tokens", 0)),
                int(stats.get("spec_accepted_tokens", 0)),
                tuple(int(x) for x in stats.get("spec_accepted_per_pos", ())))
        batch_sizes = {int(b): int(n) for b, n in dict(stats.get("decode_batch_sizes") or {}).items()}
    except Exception as exc:  # a scrape without engine stats is still useful
        log.warning("engine stats unavailable for /metrics: %s", exc)
    gauges = Gauges(running=state.worker.num_running, waiting=state.worker.num_waiting,
                    kv_cache_usage=usage, kv_capacity_tokens=capacity, spec=spec, batch_sizes=batch_sizes)
    return web.Response(body=state.metrics.render(gauges),
                        headers={"Content-Type": CONTENT_TYPE})
