"""`ninfer-serve` / `python -m ninfer_nb.server`: load the model, warm up, listen, drain on SIGINT/SIGTERM.

Start-up order: parse flags → load (with progress) → one short warm-up generation → bind and
print the URL. On a signal the listener closes, in-flight requests finish (up to
`shutdown_timeout_s`), the engine thread drains and the process exits 0.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Sequence

from aiohttp import web

from ninfer_nb.errors import NinferError
from ninfer_nb.params import SamplingParams

from .app import create_app
from .cli import parse_args
from .config import ServerConfig
from .drain import drain
from .engine import ChatEngine

log = logging.getLogger("ninfer.server")


def load_engine(config: ServerConfig) -> ChatEngine:
    from ninfer_nb import LLM

    t0 = time.perf_counter()
    llm = LLM(config.model, device=config.device, max_context=config.max_context,
              prefill_chunk=config.prefill_chunk, enable_thinking=config.enable_thinking,
              kv_cache=config.kv_cache,
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


async def serve(engine: ChatEngine, config: ServerConfig) -> None:
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
    try:
        await stop.wait()
        print("ninfer-serve: shutting down, finishing in-flight requests…",
              file=sys.stderr, flush=True)
        await drain(app, config.shutdown_timeout_s)  # listener open: new requests get 503
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        engine = load_engine(config)
    except NinferError as exc:
        print(f"ninfer-serve: error: {exc.message}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(engine, config))
    except OSError as exc:  # the port is taken, or the host does not resolve
        print(f"ninfer-serve: error: cannot listen on {config.host}:{config.port}: {exc}",
              file=sys.stderr)
        return 2
    print("ninfer-serve: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
