"""Hostile input gets a 4xx in its route's protocol shape (issue 30, items 1-2).

Each test is one defect class: lone UTF-16 surrogates, deep nesting, huge integers and NaN,
non-UTF-8 header values (with the request log on), malformed fields on streaming routes,
max_tokens beyond the context, Retry-After on overload, the default body limit, and a huge
prompt that must not stall other requests. Raw httpx for the malformed requests; the server
must answer a normal request afterwards.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ninfer_nb.server import ServerConfig
from ninfer_nb.server.cli import parse_args
from tests.server.conftest import API_KEY, MODEL_ID, base_config, openai_client
from tests.server.harness import LiveServer

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MSGS = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": MODEL_ID, "input": "hi", "max_output_tokens": 2}
ROUTES = {  # every POST route with a valid body
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESP,
    "/v1/responses/input_tokens": {"model": MODEL_ID, "input": "hi"},
    "/v1/messages": MSGS,
    "/v1/messages/count_tokens": {"model": "m", "messages": MSGS["messages"]},
}


def post_raw(srv: LiveServer, path: str, raw: bytes,
             headers: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(srv.url + path, content=raw, headers=headers or AUTH, timeout=60)


def assert_protocol_4xx(path: str, r: httpx.Response, status: int = 400) -> dict[str, Any]:
    """The error body in the route's protocol shape, with the expected status."""
    assert r.status_code == status, (path, r.status_code, r.text)
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert body["error"]["type"] in ("invalid_request_error", "authentication_error")
        return dict(body["error"])
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], body
    return dict(err)


def with_field(path: str, raw_field: str) -> bytes:
    """The route's valid body with one more field spliced in as raw JSON text."""
    body = json.dumps(ROUTES[path])
    return (body[:-1] + ", " + raw_field + "}").encode()


def still_serves(srv: LiveServer) -> None:
    out = openai_client(srv).chat.completions.create(**CHAT)
    assert out.choices[0].finish_reason in ("stop", "length")


@pytest.fixture()
def logged(scripted: Any, tmp_path: Path) -> LiveServer:
    srv: LiveServer = scripted("fine</think>ok", request_log=str(tmp_path / "requests.jsonl"))
    return srv


def log_lines(srv: LiveServer) -> list[dict[str, Any]]:
    assert srv.config.request_log is not None
    text = Path(srv.config.request_log).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("path", list(ROUTES))
def test_lone_surrogates_are_400(logged: LiveServer, path: str) -> None:
    for field in ('"x": "\\ud800"', '"x": {"\\udfff": 1}', '"model": "a\\udc00b"'):
        raw = with_field(path, field)
        err = assert_protocol_4xx(path, post_raw(logged, path, raw))
        assert "surrogate" in err["message"]
    if "count" not in path and "input_tokens" not in path:  # the streaming variant too
        err = assert_protocol_4xx(path, post_raw(
            logged, path, with_field(path, '"stream": true, "metadata": {"k": "\\ud83d"}')))
    # a valid pair is an emoji, not an error (in a field every route accepts)
    paired = with_field(path, '"metadata": {"k": "\\ud83d\\ude00"}')
    assert post_raw(logged, path, paired).status_code == 200
    assert log_lines(logged)  # the log survived, line by line valid JSON
    still_serves(logged)


@pytest.mark.parametrize("path", list(ROUTES))
def test_deep_nesting_huge_integers_and_nan_are_400(logged: LiveServer, path: str) -> None:
    for field in ('"x": ' + "[" * 1000 + "]" * 1000,       # past json's recursion limit
                  '"x": ' + "{\"a\": " * 200 + "1" + "}" * 200,  # parses, too deep to pass on
                  '"x": ' + "9" * 5000,                    # past Python's int digits limit
                  '"x": NaN', '"x": -Infinity'):
        assert_protocol_4xx(path, post_raw(logged, path, with_field(path, field)))
    assert post_raw(logged, path, b"\xff\xfe{}").status_code == 400
    still_serves(logged)


def test_integer_fields_beyond_int64_are_400(logged: LiveServer) -> None:
    for path, field in (("/v1/chat/completions", "seed"), ("/v1/chat/completions", "max_tokens"),
                        ("/v1/messages", "max_tokens"), ("/v1/messages", "top_k"),
                        ("/v1/responses", "max_output_tokens")):
        raw = json.dumps({**ROUTES[path], field: 10**30}).encode()
        err = assert_protocol_4xx(path, post_raw(logged, path, raw))
        assert field in (err.get("param") or "") or field in err["message"]
    ok = json.dumps({**CHAT, "seed": 2**64 - 1}).encode()  # seeds are u64
    assert post_raw(logged, "/v1/chat/completions", ok).status_code == 200


def test_non_utf8_header_values(logged: LiveServer) -> None:
    bad_key = {"Authorization": b"Bearer \xe9\xff\xfe", "Content-Type": b"application/json"}
    for path in ROUTES:
        raw = json.dumps(ROUTES[path]).encode()
        r = post_raw(logged, path, raw, headers=bad_key)
        assert_protocol_4xx(path, r, 401)
        r = post_raw(logged, path, raw, headers={"x-api-key": b"\xff" + API_KEY.encode(),
                                                 "Content-Type": b"application/json"})
        assert_protocol_4xx(path, r, 401)
        odd = {**{k: v.encode() for k, v in AUTH.items()}, "x-trace": b"caf\xe9 \xff",
               "User-Agent": b"\xc3\x28"}
        assert post_raw(logged, path, raw, headers=odd).status_code == 200, path
    records = log_lines(logged)
    assert any("x-trace" in str(r.get("headers", {})).lower() for r in records)
    still_serves(logged)


def test_streams_end_with_their_terminal_event(scripted: Any) -> None:
    srv = scripted("fine</think>ok")
    cases = [  # echoed fields that used to break the stream after its 200 went out
        ("/v1/messages", {**MSGS, "stream": True, "model": "m\u2028\u00e9"}, "event: message_stop"),
        ("/v1/responses", {**RESP, "stream": True, "metadata": {"k": "\u00e9"},
                           "instructions": "\u2603", "max_output_tokens": 50},
         "event: response.completed"),
        ("/v1/responses", {**RESP, "stream": True, "max_output_tokens": 1},
         "event: response.incomplete"),
        ("/v1/chat/completions", {**CHAT, "stream": True,
                                  "stream_options": {"include_usage": True}}, "data: [DONE]"),
    ]
    for path, body, terminal in cases:
        with httpx.stream("POST", srv.url + path, json=body, headers=AUTH, timeout=30) as r:
            text = r.read().decode()
        assert r.status_code == 200, text
        assert terminal in text, text
    bad = [("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": "yes"}),
           ("/v1/messages", {**MSGS, "stream": True, "thinking": "on"}),
           ("/v1/messages", {**MSGS, "stream": True, "model": 7}),
           ("/v1/responses", {**RESP, "stream": True, "reasoning": []})]
    for path, body in bad:
        assert_protocol_4xx(path, httpx.post(srv.url + path, json=body, headers=AUTH))


def test_max_tokens_beyond_the_context_is_clamped_in_every_protocol(scripted: Any) -> None:
    srv = scripted("word " * 400, engine_kw={"max_context": 64}, max_context=64)
    huge = 2**40
    chat = httpx.post(srv.url + "/v1/chat/completions", headers=AUTH,
                      json={**CHAT, "max_tokens": huge}).json()
    assert chat["choices"][0]["finish_reason"] == "length"
    used = chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"]
    assert used == 64
    msg = httpx.post(srv.url + "/v1/messages", headers=AUTH,
                     json={**MSGS, "max_tokens": huge}).json()
    assert msg["stop_reason"] == "max_tokens"
    assert msg["usage"]["input_tokens"] + msg["usage"]["output_tokens"] == 64
    resp = httpx.post(srv.url + "/v1/responses", headers=AUTH,
                      json={**RESP, "max_output_tokens": huge}).json()
    assert resp["status"] == "incomplete" and resp["usage"]["total_tokens"] == 64


async def test_retry_after_on_429_and_529(scripted: Any) -> None:
    srv = scripted("slow " * 40, max_pending=0, engine_kw={"token_delay_s": 0.02},
                   default_max_tokens=40)
    async with httpx.AsyncClient(base_url=srv.url, headers=AUTH, timeout=60) as client:
        first = asyncio.create_task(client.post("/v1/chat/completions", json={
            **CHAT, "max_tokens": 40}))
        await asyncio.sleep(0.3)
        chat = await client.post("/v1/chat/completions", json=CHAT)
        msgs = await client.post("/v1/messages", json=MSGS)
        resp = await client.post("/v1/responses", json={**RESP, "stream": True})
        assert (chat.status_code, msgs.status_code, resp.status_code) == (429, 529, 429)
        for r in (chat, msgs, resp):
            assert int(r.headers["Retry-After"]) >= 1
        assert (await first).status_code == 200


def test_default_body_limit_is_tens_of_mib() -> None:
    assert 16 * 2**20 <= ServerConfig().max_request_bytes <= 64 * 2**20
    assert parse_args([]).max_request_bytes == ServerConfig().max_request_bytes
    assert parse_args([]).shutdown_timeout_s == 30.0
    assert parse_args(["--shutdown-timeout", "5"]).shutdown_timeout_s == 5.0


@pytest.fixture(scope="module")
def roomy_server(real_llm: Any) -> Iterator[LiveServer]:
    """The real tiny engine (it takes token ids, so prompts are tokenized off its thread)."""
    with LiveServer(real_llm, base_config(max_request_bytes=16 * 2**20)) as srv:
        yield srv


async def test_huge_prompt_does_not_stall_other_requests(roomy_server: LiveServer) -> None:
    """The server shares this process's GIL: a tokenizer holding it would freeze the test too,
    so the small requests must be answered while the huge one is still being tokenized."""
    srv = roomy_server
    huge = {**CHAT, "messages": [{"role": "user", "content": "hello world, " * 150_000}]}
    async with httpx.AsyncClient(base_url=srv.url, headers=AUTH, timeout=120) as client:
        t0 = time.monotonic()
        big = asyncio.create_task(client.post("/v1/chat/completions", json=huge))
        await asyncio.sleep(0.5)  # parsed and tokenizing by now
        count = await client.post("/v1/messages/count_tokens", json=ROUTES[
            "/v1/messages/count_tokens"])
        chat = await client.post("/v1/chat/completions", json=CHAT)
        quick = time.monotonic() - t0
        big_was_running = not big.done()
        refused = await big
        slow = time.monotonic() - t0
    assert count.status_code == 200 and chat.status_code == 200
    assert refused.status_code == 400 and refused.json()["error"]["code"] == \
        "context_length_exceeded"
    assert big_was_running and quick < slow / 2, (quick, slow)
