"""Fixtures for the server tests: the real tiny engine, the scripted double, live servers, SDKs.

The real engine is the lead's tiny random Qwen3.5 checkpoint on the CPU backend; one LLM is
loaded per session and served by at most one live server at a time (it is single-threaded).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from ninfer_nb.chat import Tokenizer
from ninfer_nb.server import ServerConfig
from tests.server.harness import LiveServer
from tests.server.scripted_engine import ScriptedEngine

API_KEY = "sk-test-secret-123"
MODEL_ID = "tiny-qwen"


@pytest.fixture(scope="session")
def real_llm(tiny_qwen35_dir: Path) -> Any:
    from ninfer_nb import LLM

    return LLM(str(tiny_qwen35_dir), device="cpu", max_context=384)


def base_config(**changes: Any) -> ServerConfig:
    defaults: dict[str, Any] = dict(model_id=MODEL_ID, api_key=API_KEY, max_context=384,
                                    default_max_tokens=8, keepalive_s=0.5,
                                    shutdown_timeout_s=10.0,
                                    max_request_bytes=256 * 1024)
    defaults.update(changes)
    return ServerConfig(**defaults)


@pytest.fixture(scope="module")
def real_server(real_llm: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    log = tmp_path_factory.mktemp("log") / "requests.jsonl"
    with LiveServer(real_llm, base_config(request_log=str(log))) as srv:
        yield srv


@pytest.fixture(scope="session")
def qwen_tokenizer(tiny_qwen35_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_qwen35_dir)


@pytest.fixture()
def scripted(qwen_tokenizer: Tokenizer) -> Iterator[Callable[..., LiveServer]]:
    """Factory: a live server over a ScriptedEngine replaying `reply` (closed after the test)."""
    servers: list[LiveServer] = []

    def make(reply: Any, *, engine_kw: dict[str, Any] | None = None,
             **config: Any) -> LiveServer:
        engine = ScriptedEngine(qwen_tokenizer, reply, model_id=MODEL_ID,
                                **(engine_kw or {}))
        srv = LiveServer(engine, base_config(**config)).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


def openai_client(srv: LiveServer, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=60)


def anthropic_client(srv: LiveServer, key: str = API_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key=key, max_retries=0, timeout=60)
