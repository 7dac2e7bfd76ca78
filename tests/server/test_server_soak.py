"""A bounded soak (issue 30, item 7): many concurrent streams in all three protocols, some
clients leaving at random points. Nothing may be lost: every request that was read to its end
completed with usage equal to the tokens it was sent (and exactly the reply's text) or failed
with its protocol's error; afterwards the engine's queue is empty, no generation is left, and
the server still serves. A fixed seed makes a failure replayable.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ninfer_nb.server.state import STATE
from tests.server.conftest import API_KEY, MODEL_ID, openai_client

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CLIENTS = 48
SEED = 30
REPLY = " ".join(f"w{i}" for i in range(200))


@dataclass
class Outcome:
    path: str
    max_tokens: int
    leave_after: int | None        # lines read before the client hangs up; None = read all
    status: int = 0
    text: str = ""
    completion_tokens: int | None = None
    finish: str | None = None
    error: dict[str, Any] | None = None


def body_for(path: str, max_tokens: int) -> dict[str, Any]:
    msgs = [{"role": "user", "content": "go"}]
    if path == "/v1/chat/completions":
        return {"model": MODEL_ID, "messages": msgs, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
    if path == "/v1/messages":
        return {"model": "m", "messages": msgs, "max_tokens": max_tokens, "stream": True}
    return {"model": MODEL_ID, "input": "go", "max_output_tokens": max_tokens, "stream": True}


def read_event(path: str, data: dict[str, Any], out: Outcome) -> None:
    """Fold one SSE data object into the outcome (text, usage, finish, error)."""
    if "error" in data and path != "/v1/messages":
        out.error = data["error"]
    elif path == "/v1/chat/completions":
        for choice in data["choices"]:
            out.text += choice["delta"].get("content") or ""
            out.finish = choice["finish_reason"] or out.finish
        if data.get("usage"):
            out.completion_tokens = data["usage"]["completion_tokens"]
    elif path == "/v1/messages":
        if data["type"] == "error":
            out.error = data["error"]
        elif data["type"] == "content_block_delta":
            out.text += data["delta"].get("text", "")
        elif data["type"] == "message_delta":
            out.finish = data["delta"]["stop_reason"]
            out.completion_tokens = data["usage"]["output_tokens"]
    elif data["type"] == "response.output_text.delta":
        out.text += data["delta"]
    elif data["type"] in ("response.completed", "response.incomplete", "response.failed"):
        out.finish = data["response"]["status"]
        out.completion_tokens = (data["response"]["usage"] or {}).get("output_tokens")


async def one_client(client: httpx.AsyncClient, out: Outcome) -> None:
    async with client.stream("POST", out.path, json=body_for(out.path, out.max_tokens)) as r:
        out.status = r.status_code
        if r.status_code != 200:
            out.error = json.loads(await r.aread()).get("error")
            return
        lines = 0
        async for line in r.aiter_lines():
            lines += 1
            if out.leave_after is not None and lines >= out.leave_after:
                return  # hang up mid-stream: the connection closes with the response
            if line.startswith("data: {"):
                read_event(out.path, json.loads(line[6:]), out)


def test_soak_concurrent_streams_with_random_disconnects(scripted: Any) -> None:
    srv = scripted(REPLY, engine_kw={"token_delay_s": 0.001}, max_pending=CLIENTS,
                   enable_thinking=False, keepalive_s=0.2)
    reply_ids = srv.engine.tokenizer.encode(REPLY)
    rng = random.Random(SEED)
    outcomes = [Outcome(path=rng.choice(["/v1/chat/completions", "/v1/messages",
                                         "/v1/responses"]),
                        max_tokens=rng.randint(3, 40),
                        leave_after=rng.randint(1, 30) if rng.random() < 0.3 else None)
                for _ in range(CLIENTS)]

    async def main() -> None:
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(base_url=srv.url, headers=AUTH, timeout=60,
                                     limits=limits) as client:
            await asyncio.wait_for(asyncio.gather(*(one_client(client, o) for o in outcomes)),
                                   timeout=120)

    asyncio.run(main())
    finished = {"/v1/chat/completions": "length", "/v1/messages": "max_tokens",
                "/v1/responses": "incomplete"}
    for out in outcomes:
        if out.leave_after is not None and out.finish is None:
            continue  # left before the end: nothing to check on the client's side
        if out.error is not None:  # a refusal or a mid-stream failure, in the protocol's shape
            assert out.status in (200, 429, 529) and out.error.get("message"), out
            continue
        assert out.status == 200, out
        assert out.finish == finished[out.path], out
        assert out.completion_tokens == out.max_tokens, out
        assert out.text == srv.engine.tokenizer.decode(reply_ids[:out.max_tokens]), out
    assert sum(o.leave_after is None for o in outcomes) >= CLIENTS // 2
    left_mid_stream = [o for o in outcomes if o.leave_after is not None and o.finish is None]
    assert left_mid_stream and srv.engine.cancelled >= 1  # hang-ups did stop generations

    state = srv.app[STATE]
    deadline = time.monotonic() + 10
    while (state.worker.num_running or state.worker.num_waiting or state.generations) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (state.worker.num_running, state.worker.num_waiting, len(state.generations)) == (0, 0, 0)
    out = openai_client(srv).chat.completions.create(model=MODEL_ID, max_tokens=4,
                                                     messages=[{"role": "user", "content": "x"}])
    assert out.usage is not None and out.usage.completion_tokens == 4
