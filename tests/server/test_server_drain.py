"""Graceful drain on SIGTERM / SIGINT (issue 30, item 3), against a real process.

The server (tests/server/drain_server.py: `serve()` over a slow scripted engine) gets a real
signal. Wanted: new requests get 503 + Retry-After while the listener is still open, a queued
request is never started (a clean 503), a running stream finishes if it can within
--shutdown-timeout and otherwise ends with its protocol's error event, and the process exits 0
within the timeout plus a few seconds.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL_ID = "tiny-qwen"
USER = [{"role": "user", "content": "go"}]
EXIT_GRACE_S = 5.0


class Served:
    def __init__(self, tokenizer_dir: Path, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.server.drain_server", str(tokenizer_dir),
             str(timeout_s)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert self.proc.stdout is not None
        self.url = ""
        deadline = time.monotonic() + 120
        while not self.url and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                break
            match = re.search(r"(http://[\d.]+:\d+)/v1", line)
            self.url = match.group(1) if match else ""
        if not self.url:
            self.proc.kill()
            pytest.fail(f"server did not start: {self.proc.communicate()[1]}")

    def signal(self, sig: int) -> float:
        self.proc.send_signal(sig)
        return time.monotonic()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture()
def served(tiny_qwen35_dir: Path) -> Iterator[Any]:
    started: list[Served] = []

    def make(timeout_s: float) -> Served:
        started.append(Served(tiny_qwen35_dir, timeout_s))
        return started[-1]

    yield make
    for srv in started:
        srv.close()


def stream_lines(url: str, path: str, body: dict[str, Any], out: list[str],
                 first: threading.Event) -> None:
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        out.append(f"status {r.status_code}")
        for line in r.iter_lines():
            out.append(line)
            first.set()
    out.append("eof")


def in_thread(fn: Any, *args: Any) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def test_sigterm_refuses_new_and_queued_work_and_cuts_streams_at_the_deadline(served: Any) -> None:
    srv = served(4.0)
    running: list[str] = []
    first = threading.Event()
    long_stream = {"model": "m", "stream": True, "max_tokens": 1000, "messages": USER}
    t_running = in_thread(stream_lines, srv.url, "/v1/messages", long_stream, running, first)
    assert first.wait(30)
    queued: list[tuple[httpx.Response, float]] = []

    def queue_one() -> None:
        r = httpx.post(srv.url + "/v1/chat/completions",
                       json={"model": MODEL_ID, "messages": USER}, timeout=60)
        queued.append((r, time.monotonic()))

    t_queued = in_thread(queue_one)
    time.sleep(0.5)  # queued behind the running stream
    t_signal = srv.signal(signal.SIGTERM)

    time.sleep(0.2)  # the listener is still open during the drain: new work gets a 503
    fresh = httpx.post(srv.url + "/v1/chat/completions",
                       json={"model": MODEL_ID, "messages": USER}, timeout=10)
    assert fresh.status_code == 503 and int(fresh.headers["Retry-After"]) >= 1
    fresh = httpx.post(srv.url + "/v1/messages", json=long_stream, timeout=10)
    assert fresh.status_code == 503 and fresh.json()["type"] == "error"
    assert "Retry-After" in fresh.headers
    health = httpx.get(srv.url + "/health", timeout=10)
    assert health.status_code == 503 and health.json() == {"status": "draining"}

    t_queued.join(5)
    r, answered_at = queued[0]
    assert answered_at - t_signal < srv.timeout_s / 2  # refused at once, not run nor cut
    assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["code"] == "server_shutting_down"

    t_running.join(srv.timeout_s + EXIT_GRACE_S)
    assert running[0] == "status 200" and running[-1] == "eof"
    events = [line for line in running if line.startswith("event: ")]
    assert events[-1] == "event: error" and "event: message_stop" not in events, events[-3:]
    error = json.loads(running[running.index("event: error") + 1][6:])
    assert error["type"] == "error" and "shut down" in error["error"]["message"]
    assert srv.proc.wait(srv.timeout_s + EXIT_GRACE_S) == 0
    assert time.monotonic() - t_signal < srv.timeout_s + EXIT_GRACE_S


def test_sigint_lets_a_running_stream_finish_and_exits_without_waiting_out_the_timeout(
        served: Any) -> None:
    srv = served(20.0)
    lines: list[str] = []
    first = threading.Event()
    body = {"model": MODEL_ID, "stream": True, "max_tokens": 60, "messages": USER,
            "stream_options": {"include_usage": True}}
    t = in_thread(stream_lines, srv.url, "/v1/chat/completions", body, lines, first)
    assert first.wait(30)
    t_signal = srv.signal(signal.SIGINT)
    t.join(30)
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    usage = json.loads(data[-2])["usage"]
    assert usage["completion_tokens"] == 60
    assert srv.proc.wait(EXIT_GRACE_S + 5) == 0
    assert time.monotonic() - t_signal < 60 * 0.02 + EXIT_GRACE_S  # not the 20 s timeout
    assert "stopped" in srv.proc.communicate()[1]


def test_drain_ends_every_protocol_stream_with_its_error_event(scripted: Any) -> None:
    """In-process: one running stream cut at the deadline, two queued streams (keep-alives
    already sent, so their 200 is out) ended at once; each with its protocol's error event."""
    from ninfer_nb.server.drain import drain

    srv = scripted("word " * 1000, engine_kw={"token_delay_s": 0.02}, keepalive_s=0.2,
                   default_max_tokens=1000, enable_thinking=False)
    auth = {"Authorization": "Bearer sk-test-secret-123"}
    bodies = {"/v1/chat/completions": {"model": MODEL_ID, "stream": True, "messages": USER},
              "/v1/messages": {"model": "m", "stream": True, "max_tokens": 1000,
                               "messages": USER},
              "/v1/responses": {"model": MODEL_ID, "stream": True, "input": "go"}}
    out: dict[str, list[str]] = {path: [] for path in bodies}

    def read(path: str) -> None:
        with httpx.stream("POST", srv.url + path, json=bodies[path], headers=auth,
                          timeout=30) as r:
            out[path] = [f"status {r.status_code}", *r.iter_lines()]

    threads = []
    for path in bodies:  # in this order: the chat stream runs, the others wait behind it
        threads.append(in_thread(read, path))
        time.sleep(0.3)
    t0 = time.monotonic()
    srv._run(drain(srv.app, 1.0))
    assert time.monotonic() - t0 < 1.0 + 3.0
    for t in threads:
        t.join(10)
    chat = [line[6:] for line in out["/v1/chat/completions"] if line.startswith("data: ")]
    assert out["/v1/chat/completions"][0] == "status 200"
    assert chat[-1] == "[DONE]"  # after the error event
    assert json.loads(chat[-2])["error"]["code"] == "server_shutdown"
    assert len(chat) > 10  # it ran until the deadline
    events = [line for line in out["/v1/messages"] if line.startswith("event: ")]
    assert out["/v1/messages"][0] == "status 200" and events == ["event: error"]
    assert ": keep-alive" in out["/v1/messages"]
    events = [line for line in out["/v1/responses"] if line.startswith("event: ")]
    assert events[-1] == "event: response.failed"
    assert srv.engine.prompts and len(srv.engine.prompts) == 1  # the queued never started
