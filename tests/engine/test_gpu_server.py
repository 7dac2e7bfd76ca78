"""The server on the GPU backend: the engine is built on this (the test's) thread and the
requests run on the server's engine worker thread, so the backend must bind its CUDA context
there (CudaBackend._on_calling_thread). A greedy chat completion over real HTTP (httpx: the GPU
machine's image has no openai / anthropic SDK, which tests/server's fixtures import) must
match the same request served from the CPU backend. The checkpoint is test_gpu_model.py's
tiny Qwen3.5 with GDN head dims of 32 (the CUDA gated delta rule needs multiples of 32; the
default tiny checkpoint's 16 is refused at load on the CUDA backend)."""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from ninfer_nb.server import ServerConfig
from tests.engine.test_gpu_model import gpu_checkpoint
from tests.server.harness import LiveServer

pytestmark = pytest.mark.gpu


def _greedy_reply(llm: Any) -> str:
    config = ServerConfig(model_id="tiny-qwen", max_context=384, default_max_tokens=8,
                          shutdown_timeout_s=10.0)
    with LiveServer(llm, config) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny-qwen", "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 8, "temperature": 0.0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] in ("length", "stop")
    assert 0 < body["usage"]["completion_tokens"] <= 8
    msg = body["choices"][0]["message"]
    text = (msg.get("reasoning_content") or "") + "|" + (msg.get("content") or "")
    assert len(text) > 1                   # the tiny random model thinks: its 8 tokens are reasoning
    return text


def test_gpu_engine_serves_from_the_worker_thread(tiny_checkpoints) -> None:
    from ninfer_nb import LLM

    path = gpu_checkpoint(tiny_checkpoints, "qwen35")
    cpu = LLM(str(path), device="cpu", max_context=384, kv_cache="fp32")
    gpu = LLM(str(path), device="cuda", max_context=384, kv_cache="fp32")
    assert _greedy_reply(gpu) == _greedy_reply(cpu)
