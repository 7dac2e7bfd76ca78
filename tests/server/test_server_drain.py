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
    srv = served(2.0)
    running: list[str] = []
    first = threading.Event()
    long_stream = {"model": "m", "stream": True, "max_tokens": 1000, "messages": USER}
    t_running = in_thread(stream_lines, srv.url, "/v1/messages", long_stream, running, first)
    assert first.wait(30)
    queued: list[httpx.Response] = []
    t_queued = in_thread(lambda: queued.append(httpx.post(
        srv.url + "/v1/chat/completions", json={"model": MODEL_ID, "messages": USER},
        timeout=60)))
    time.sleep(0.5)  # queued behind the running stream
    t_signal = srv.signal(signal.SIGTERM)

    t_queued.join(5)
    assert queued and time.monotonic() - t_signal < 2.0
    r = queued[0]
    assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["code"] == "server_shutting_down"

    time.sleep(0.3)  # the listener is still open during the drain: new work gets a 503
    fresh = httpx.post(srv.url + "/v1/chat/completions",
                       json={"model": MODEL_ID, "messages": USER}, timeout=10)
    assert fresh.status_code == 503 and int(fresh.headers["Retry-After"]) >= 1
    fresh = httpx.post(srv.url + "/v1/messages", json=long_stream, timeout=10)
    assert fresh.status_code == 503 and fresh.json()["type"] == "error"
    assert "Retry-After" in fresh.headers

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
