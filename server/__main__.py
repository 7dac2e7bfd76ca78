"""`ninfer-serve` / `python -m ninfer_nb.server`: load the model, warm up, listen, drain on SIGINT/SIGTERM.

Start-up order: parse flags → load (with progress) → one short warm-up generation → bind and
print the URL. On a signal the listener closes, in-flight requests finish (up to
`shutdown_timeout_s`), the engine thread drains and the process exits 0. After a device fault
the engine cannot recover from (engine/faults.py: the worker stops, /health says "faulted") the
server shuts down the same way and exits with EXIT_DEVICE_FAULT (3), so a supervisor restarts it.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Sequence

from aiohttp import web

from ninfer_nb.engine.faults import EXIT_DEVICE_FAULT
from ninfer_nb.errors import NinferError
from ninfer_nb.params import SamplingParams

from .app import create_app
from .cli import parse_args
from .config import ServerConfig
from .drain import drain
from .engine import ChatEngine
from .state import STATE

log = logging.getLogger("ninfer.server")
FAULT_POLL_S = 0.2


def load_engine(config: ServerConfig) -> ChatEngine:
    from ninfer_nb import LLM

    t0 = time.perf_counter()
    llm = LLM(config.model, device=config.device, max_context=config.max_context,
              prefill_chunk=config.prefill_chunk, enable_thinking=config.enable_thinking,
              kv_cache=config.kv_cache, max_concurrency=config.max_concurrency,
              spec=config.spec, draft_tokens=config.draft_tokens, prefix_cache=config.prefix_cache,
              host_cache_mib=config.host_cache_mib, kv_cache_fraction=config.kv_cache_fraction,
              show_progress=True)
    print(f"ninfer-serve: loaded {llm.model_id} on {llm.device_name} "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    if config.warmup:
        t0 = time.perf_counter()
        for _ in llm.chat_stream([{"role": "user", "content": "hi"}],
                                 params=SamplingParams(max_tokens=4, temperature=0.0)):
            pass
        print(f"ninfer-serve: warm-up done in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
    engine: ChatEngine = llm
    return engine


async def _stop_on_fault(app: web.Application, stop: asyncio.Event) -> None:
    """Set `stop` once the engine worker has recorded an unrecoverable fault."""
    worker = app[STATE].worker
    while worker.fault is None:
        await asyncio.sleep(FAULT_POLL_S)
    print(f"ninfer-serve: error: {worker.fault.message}; shutting down", file=sys.stderr, flush=True)
    stop.set()


async def serve(engine: ChatEngine, config: ServerConfig) -> int:
    """Serve until SIGINT / SIGTERM (returns 0) or an unrecoverable engine fault (returns
    EXIT_DEVICE_FAULT)."""
    app = create_app(engine, config)
    runner = web.AppRunner(app, handler_cancellation=True,
                           shutdown_timeout=config.shutdown_timeout_s, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host, port = runner.addresses[0][:2]
    model_id = config.model_id or engine.model_id
    print(f"ninfer-serve: serving {model_id!r} at http://{host}:{port}/v1 "
          "(Ctrl+C to stop)", flush=True)
    watch = asyncio.create_task(_stop_on_fault(app, stop))
    try:
        await stop.wait()
        print("ninfer-serve: shutting down, finishing in-flight requests…",
              file=sys.stderr, flush=True)
        await drain(app, config.shutdown_timeout_s)  # listener open: new requests get 503
    finally:
        watch.cancel()
        await runner.cleanup()
    return EXIT_DEVICE_FAULT if app[STATE].worker.fault is not None else 0


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        engine = load_engine(config)
    except NinferError as exc:
        print(f"ninfer-serve: error: {exc.message}", file=sys.stderr)
        return 2
    try:
        status = asyncio.run(serve(engine, config))
    except OSError as exc:  # the port is taken, or the host does not resolve
        print(f"ninfer-serve: error: cannot listen on {config.host}:{config.port}: {exc}",
              file=sys.stderr)
        return 2
    print("ninfer-serve: stopped" + (" after an engine fault" if status else ""), file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
