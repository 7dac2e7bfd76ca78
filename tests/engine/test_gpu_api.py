"""The API features that leave the device pick for the host sampler, on the GPU backend:
logprobs (chat, completions with echo), n choices and a thinking budget, over real HTTP (httpx:
the GPU image has no openai / anthropic SDK). Each reply must equal the CPU backend's (greedy;
fp32 KV cache) and the logprobs agree within 2e-3. The checkpoint is test_gpu_model.py's tiny
Qwen3.5 (GDN head dims of 32)."""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from ninfer_nb.server import ServerConfig
from tests.engine.test_gpu_model import gpu_checkpoint
from tests.server.harness import LiveServer

pytestmark = pytest.mark.gpu


def serve_requests(llm: Any) -> dict[str, Any]:
    """Logprobs / n / echo / budget requests against `llm`; their JSON bodies by name."""
    config = ServerConfig(model_id="tiny-qwen", max_context=384, default_max_tokens=8,
                          shutdown_timeout_s=10.0)
    bodies = {
        "chat": ("/v1/chat/completions", {
            "model": "tiny-qwen", "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": 6, "temperature": 0.0, "n": 2, "logprobs": True, "top_logprobs": 3,
            "ignore_eos": True}),
        "echo": ("/v1/completions", {
            "model": "tiny-qwen", "prompt": "The quick brown fox", "max_tokens": 4, "echo": True,
            "logprobs": 2, "temperature": 0.0, "ignore_eos": True}),
        "budget": ("/v1/messages", {
            "model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.0,
            "thinking": {"type": "enabled", "budget_tokens": 3}}),
    }
    out = {}
    with LiveServer(llm, config) as srv:
        for name, (path, body) in bodies.items():
            r = httpx.post(srv.url + path, json=body, timeout=120)
            assert r.status_code == 200, (name, r.text)
            out[name] = r.json()
    return out


def compare(cpu: dict[str, Any], gpu: dict[str, Any]) -> None:
    for a, b in zip(cpu["chat"]["choices"], gpu["chat"]["choices"]):
        assert a["message"] == b["message"]
        la, lb = a["logprobs"]["content"], b["logprobs"]["content"]
        assert [e["token"] for e in la] == [e["token"] for e in lb] and len(la) == 6
        for ea, eb in zip(la, lb):
            assert ea["logprob"] == pytest.approx(eb["logprob"], abs=2e-3)
    a, b = cpu["echo"]["choices"][0], gpu["echo"]["choices"][0]
    assert a["text"] == b["text"] and a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
    for x, y in zip(a["logprobs"]["token_logprobs"][1:], b["logprobs"]["token_logprobs"][1:]):
        assert x == pytest.approx(y, abs=2e-3)
    assert cpu["budget"]["content"] == gpu["budget"]["content"]
    assert [blk["type"] for blk in gpu["budget"]["content"]][0] == "thinking"


def test_gpu_logprobs_n_echo_budget_match_cpu(tiny_checkpoints) -> None:
    from ninfer_nb import LLM

    path = gpu_checkpoint(tiny_checkpoints, "qwen35")
    cpu = LLM(str(path), device="cpu", max_context=384, kv_cache="fp32")
    gpu = LLM(str(path), device="cuda", max_context=384, kv_cache="fp32")
    compare(serve_requests(cpu), serve_requests(gpu))
