"""`python -m tests.server.drain_server TOKENIZER_DIR SHUTDOWN_TIMEOUT_S`: ninfer-serve's own
`serve()` over a slow ScriptedEngine (20 ms a token) on a free loopback port, so the drain tests
send a real signal to a real process without loading a model. Prints the URL line as
`ninfer-serve` does and exits 0 once drained."""
from __future__ import annotations

import asyncio
import sys

from ninfer_nb.chat import Tokenizer
from ninfer_nb.server import ServerConfig
from ninfer_nb.server.__main__ import serve
from tests.server.scripted_engine import ScriptedEngine

MODEL_ID = "tiny-qwen"
TOKEN_DELAY_S = 0.02


def main(argv: list[str]) -> int:
    tokenizer = Tokenizer.from_dir(argv[0])
    engine = ScriptedEngine(tokenizer, "word " * 1000, model_id=MODEL_ID,
                            token_delay_s=TOKEN_DELAY_S, enable_thinking=False)
    config = ServerConfig(port=0, model_id=MODEL_ID, shutdown_timeout_s=float(argv[1]),
                          default_max_tokens=1000, keepalive_s=60.0, enable_thinking=False)
    asyncio.run(serve(engine, config))
    print("drain_server: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
