"""--url mode against a real `ninfer-serve` on loopback (tiny checkpoint, CPU), and against
a server that is not there. The server runs as a subprocess, exactly as users start it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ninfer_nb.tui.http_client import HttpClient
from ninfer_nb.tui.settings import ChatSettings
from ninfer_nb.tui.widgets.messages import AssistantMessage, NoteMessage, UserMessage
from ninfer_nb.tui.widgets.perf import PerfPanel, perf_rows
from ninfer_nb.tui.widgets.prompt import PromptArea

from .conftest import MakeApp
from .helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
SIZE = (80, 24)
pytestmark = pytest.mark.skipif(
    not (ROOT / "server" / "__main__.py").exists(), reason="server/ (ninfer-serve) is absent"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's output goes to a file: a pipe nobody reads fills up and blocks it."""
    port = _free_port()
    cmd = [sys.executable, "-m", "ninfer_nb.server", str(tiny_model_dir), "--device", "cpu",
           "--port", str(port), "--max-context", "256", "--no-warmup", "--api-key", "sekrit"]
    log_path = tmp_path_factory.mktemp("serve") / "server.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ninfer-serve exited early:\n{log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("ninfer-serve did not come up within 120 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(f"--- ninfer-serve log (last 3000 chars) ---\n{log_path.read_text()[-3000:]}")


GREEDY = ChatSettings(temperature=0.0, seed=0, max_tokens=16)


async def test_url_mode_chats_and_reads_metrics(make_app: MakeApp, server_url: str) -> None:
    client = HttpClient(server_url, api_key="sekrit")
    app = make_app(client, chat=GREEDY, perf_interval_s=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        assert app.info is not None and app.info.backend == server_url
        assert app.info.max_context == 256
        for n, text in enumerate(["hello server", "and once more"], start=1):
            app.query_one(PromptArea).insert(text)
            await pilot.press("enter")
            await wait_for(pilot, lambda n=n: len(app.conversation.messages) == 2 * n)
        answer = app.conversation.messages[3]
        assert (answer.reasoning + answer.content).strip()
        widget = app.query(AssistantMessage).last()
        assert widget.content == answer.content and widget.reasoning == answer.reasoning
        last = app.query_one(PerfPanel).view.last
        assert last is not None and last.completion_tokens == 16
        assert last.prompt_tokens and last.ttft_s is not None and last.decode_tok_s
        panel = app.query_one(PerfPanel)
        await wait_for(pilot, lambda: panel.view.engine.kv_usage is not None)
        rows = dict(perf_rows(panel.view))
        assert rows["KV cache"].endswith("% used") and rows["spec acc"] == "off"
        assert "server" in rows["GPU"]


async def test_url_mode_shows_server_errors(make_app: MakeApp, server_url: str) -> None:
    app = make_app(HttpClient(server_url, api_key="wrong"), chat=GREEDY)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.query(NoteMessage)) == 1)
        assert "HTTP 401" in app.query_one(NoteMessage).text
    app = make_app(HttpClient(server_url, api_key="sekrit"), chat=GREEDY)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.info is not None)
        prompt = app.query_one(PromptArea)
        prompt.insert("word " * 400)                      # over the server's 256-token context
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.state.startswith("error"))
        assert "HTTP 400" in app.state
        assert app.conversation.messages == [] and prompt.text.startswith("word word")
        prompt.clear()
        prompt.insert("short")
        assert app.focused is prompt
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.messages) == 2)


async def test_server_not_there(make_app: MakeApp) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    app = make_app(HttpClient(url), chat=GREEDY)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.query(NoteMessage)) == 1)
        note = app.query_one(NoteMessage)
        assert f"cannot reach the server at {url}" in note.text and note.has_class("error")
        assert app.state == "offline"
        prompt = app.query_one(PromptArea)
        prompt.insert("hello?")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.query(NoteMessage)) == 2)
        assert prompt.text == "hello?" and app.conversation.messages == []
        assert app.query_one(UserMessage).has_class("not-sent")
        prompt.clear()
        prompt.insert("/temp 0.2")                        # still usable
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.settings.temperature == 0.2)


async def test_lost_connection_mid_stream(make_app: MakeApp) -> None:
    """A server that dies after two chunks: the partial answer stays, the error is explained."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "flaky", "max_model_len": 512}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"content":"Partial "}}]}\n\n')
        await resp.write(b'data: {"choices":[{"delta":{"content":"answer"}}]}\n\n')
        assert request.transport is not None
        request.transport.close()                          # the server goes away mid-answer
        return resp

    app_ = web.Application()
    app_.router.add_get("/v1/models", models)
    app_.router.add_post("/v1/chat/completions", chat)
    server = TestServer(app_, host="127.0.0.1")
    await server.start_server()
    try:
        url = f"http://127.0.0.1:{server.port}"
        app = make_app(HttpClient(url), chat=GREEDY)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.info is not None)
            app.query_one(PromptArea).insert("hi")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.state.startswith("error"))
            assert "lost the connection" in app.state
            widget = app.query_one(AssistantMessage)
            assert widget.content == "Partial answer"
            # what the user saw is kept, with the error attached
            assert [m.content for m in app.conversation.messages] == ["hi", "Partial answer"]
            assert "lost the connection" in app.conversation.messages[1].footer
    finally:
        await server.close()
