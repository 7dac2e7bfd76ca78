"""Device faults at the server's edge (issue 30 item 4), on the CPU with an engine double.

The ScriptedEngine stands in for the model; its "device" raises what the CUDA backend raises:
the scratch arena's ArenaFull (an out-of-memory in one request's step), a CUDA driver error
after which the device still synchronizes (an error the request alone pays for), and a
sticky one (illegal address: the device's stream no longer synchronizes). Wanted: the
out-of-memory request gets a 503 `device_out_of_memory` with Retry-After and the next request
is served; after a sticky fault every request (running, queued, new) gets a 503
`engine_fault`, /health reports "faulted", and `ninfer-serve`'s serve() ends on its own with
the exit status 3. The GPU side (a real
out-of-memory by shrinking the scratch arena) is tests/engine/test_device_faults_gpu.py.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from ninfer_nb.chat import Tokenizer
from ninfer_nb.engine.faults import (
    EXIT_DEVICE_FAULT,
    DeviceOutOfMemoryError,
    EngineFaultError,
    fatal_fault,
    request_error,
)
from ninfer_nb.runtime._drv import CudaDriverError
from ninfer_nb.runtime.arena import ArenaFull
from ninfer_nb.server.state import STATE
from tests.server.conftest import API_KEY, MODEL_ID, base_config
from tests.server.harness import LiveServer
from tests.server.scripted_engine import ScriptedEngine

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


class FakeStream:
    def __init__(self) -> None:
        self.broken = False

    def synchronize(self) -> None:
        if self.broken:
            raise CudaDriverError("CUDA driver error CUDA_ERROR_ILLEGAL_ADDRESS")


class FaultyDevice:
    """What the engine's backend exposes to the fault check: a stream to synchronize."""

    def __init__(self) -> None:
        self.stream = FakeStream()


def faulty_reply(device: FaultyDevice, gate: threading.Event | None = None) -> Any:
    """The scripted reply; the user's message picks a fault, raised on the engine thread."""

    def reply(messages: list[dict[str, Any]], prompt: str) -> str:
        text = str(messages[-1]["content"])
        if text == "oom":
            raise ArenaFull("scratch: need 805306368 B at offset 0, capacity 268435456 B")
        if text == "glitch":
            raise CudaDriverError("CUDA driver error CUDA_ERROR_INVALID_VALUE")
        if text == "crash":
            if gate is not None:
                gate.wait(10)            # hold the engine thread until a request is queued behind
            device.stream.broken = True
            raise CudaDriverError("CUDA driver error CUDA_ERROR_ILLEGAL_ADDRESS")
        return "fine"

    return reply


def chat(srv: LiveServer, text: str, stream: bool = False) -> httpx.Response:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": text}], "max_tokens": 4,
            "stream": stream}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, headers=HEADERS, timeout=30)


@pytest.fixture()
def faulty(qwen_tokenizer: Tokenizer):
    device = FaultyDevice()
    gate = threading.Event()
    engine = ScriptedEngine(qwen_tokenizer, faulty_reply(device, gate), model_id=MODEL_ID,
                            enable_thinking=False)
    engine.backend = device                            # type: ignore[attr-defined]
    with LiveServer(engine, base_config()) as srv:
        yield srv, device, gate


def test_classification() -> None:
    device = FaultyDevice()
    oom = request_error(ArenaFull("scratch: need 1 B"))
    assert isinstance(oom, DeviceOutOfMemoryError) and oom.http_status == 503
    assert isinstance(request_error(CudaDriverError("CUDA driver error CUDA_ERROR_OUT_OF_MEMORY")),
                      DeviceOutOfMemoryError)
    assert request_error(RuntimeError("a bug")) is None
    assert request_error(CudaDriverError("CUDA driver error CUDA_ERROR_INVALID_VALUE")) is None
    for exc in (ArenaFull("x"), RuntimeError("x"), CudaDriverError("CUDA driver error CUDA_ERROR_INVALID_VALUE")):
        assert fatal_fault(exc, device) is None                 # the device still answers
    device.stream.broken = True
    fault = fatal_fault(CudaDriverError("CUDA driver error CUDA_ERROR_ILLEGAL_ADDRESS"), device)
    assert isinstance(fault, EngineFaultError) and "ILLEGAL_ADDRESS" in fault.message
    assert fatal_fault(ArenaFull("x"), device) is None          # out of memory is the request's
    assert fatal_fault(CudaDriverError("CUDA driver error CUDA_ERROR_LAUNCH_FAILED"), None) is None


def test_out_of_memory_fails_one_request_and_the_server_goes_on(faulty) -> None:
    srv, _, _ = faulty
    r = chat(srv, "oom")
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    err = r.json()["error"]
    assert err["code"] == "device_out_of_memory" and "out of memory" in err["message"]
    r = chat(srv, "glitch")                            # a driver error the device survives
    assert r.status_code == 500
    assert chat(srv, "hello").status_code == 200
    health = httpx.get(srv.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok"}


def test_sticky_fault_stops_the_engine_and_health_reports_it(faulty) -> None:
    srv, _, gate = faulty
    results: dict[str, httpx.Response] = {}
    crash = threading.Thread(target=lambda: results.__setitem__("crash", chat(srv, "crash")))
    crash.start()
    deadline = time.monotonic() + 10
    while srv.app is not None and srv.app[STATE].worker.num_running == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    queued = threading.Thread(target=lambda: results.__setitem__("queued", chat(srv, "hello", stream=True)))
    queued.start()
    deadline = time.monotonic() + 10
    while srv.app is not None and srv.app[STATE].worker.num_waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    crash.join(30)
    queued.join(30)
    for name in ("crash", "queued"):
        r = results[name]
        text = r.text
        assert r.status_code == 503 or "engine_fault" in text, (name, r.status_code, text)
        assert "engine_fault" in text and "ILLEGAL_ADDRESS" in text, text
    after = chat(srv, "hello")
    assert after.status_code == 503 and after.json()["error"]["code"] == "engine_fault"
    assert "Retry-After" in after.headers
    health = httpx.get(srv.url + "/health", timeout=10)
    assert health.status_code == 503
    assert health.json()["status"] == "faulted" and "ILLEGAL_ADDRESS" in health.json()["error"]["message"]


def test_serve_exits_non_zero_after_a_sticky_fault(qwen_tokenizer: Tokenizer) -> None:
    """ninfer-serve's serve() (here on the test's own event loop, on the main thread as in the
    command): after the fault it shuts down by itself and returns EXIT_DEVICE_FAULT, the
    process's exit status, so a supervisor restarts it."""
    import asyncio
    import socket

    import aiohttp

    from ninfer_nb.server.__main__ import serve

    device = FaultyDevice()
    engine = ScriptedEngine(qwen_tokenizer, faulty_reply(device), model_id=MODEL_ID, enable_thinking=False)
    engine.backend = device                            # type: ignore[attr-defined]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = base_config(host="127.0.0.1", port=port, api_key=None)
    url = f"http://127.0.0.1:{port}"

    async def scenario() -> int:
        served = asyncio.create_task(serve(engine, config))
        async with aiohttp.ClientSession() as session:
            for _ in range(200):                       # until it listens
                try:
                    async with session.get(url + "/health") as r:
                        assert r.status == 200
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.02)
            body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "crash"}], "max_tokens": 4}
            async with session.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 503 and (await r.json())["error"]["code"] == "engine_fault"
        return await asyncio.wait_for(served, 20)

    assert asyncio.run(scenario()) == EXIT_DEVICE_FAULT
