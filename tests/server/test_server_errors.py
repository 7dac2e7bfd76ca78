"""Every error case, in each protocol's shape, against the real tiny engine (and the scripted
double where the engine must be slow or broken). No error may disturb the next request."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, MODEL_ID, anthropic_client, openai_client
from tests.server.harness import LiveServer

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MSGS = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def post(srv: LiveServer, path: str, body: Any, headers: dict[str, str] | None = None,
         **kw: Any) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(srv.url + path, content=content, timeout=60,
                      headers={"Content-Type": "application/json", **AUTH, **(headers or {})},
                      **kw)


def openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    assert r.headers["request-id"].startswith("req_")
    return err


def anthropic_error(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    assert body["request_id"] == r.headers["request-id"]
    return body["error"]


def test_malformed_json_and_wrong_types(real_server: LiveServer) -> None:
    openai_error(post(real_server, "/v1/chat/completions", b"{not json"), 400, "invalid_json")
    anthropic_error(post(real_server, "/v1/messages", b"[1, 2"), 400, "invalid_request_error")
    openai_error(post(real_server, "/v1/responses", b"[]"), 400, "invalid_json")
    err = openai_error(post(real_server, "/v1/chat/completions", {**CHAT, "messages": "hi"}), 400)
    assert err["param"] == "messages"
    err = openai_error(post(real_server, "/v1/chat/completions", {**CHAT, "temperature": "hot"}),
                       400)
    assert err["param"] == "temperature" and "number" in err["message"]
    err = openai_error(post(real_server, "/v1/chat/completions", {**CHAT, "top_p": 7}), 400)
    assert err["param"] == "top_p"
    err = openai_error(post(real_server, "/v1/chat/completions", {**CHAT, "max_tokens": 0}), 400)
    assert err["param"] == "max_tokens"
    e = anthropic_error(post(real_server, "/v1/messages", {**MSGS, "max_tokens": "9"}), 400,
                        "invalid_request_error")
    assert "max_tokens" in e["message"]
    anthropic_error(post(real_server, "/v1/messages", {"model": "m", "messages": []}), 400,
                    "invalid_request_error")


def test_unknown_model_and_route(real_server: LiveServer) -> None:
    client = openai_client(real_server)
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-9", input="x")
    r = httpx.get(real_server.url + "/v1/nope", headers=AUTH)
    openai_error(r, 404)
    anthropic_error(post(real_server, "/v1/messages/nope", MSGS), 404, "not_found_error")


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/models"), ("GET", "/v1/models/" + MODEL_ID), ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"), ("GET", "/v1/responses/resp_x"), ("DELETE", "/v1/responses/x"),
    ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"), ("GET", "/metrics"),
])
def test_auth_required_everywhere_but_health(real_server: LiveServer, method: str,
                                             path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
        r = httpx.request(method, real_server.url + path, headers=headers, content=b"{}")
        if path.startswith("/v1/messages"):
            anthropic_error(r, 401, "authentication_error")
        else:
            openai_error(r, 401, "invalid_api_key")
    ok = httpx.request(method, real_server.url + path, headers={"x-api-key": API_KEY},
                       content=b"{}")
    assert ok.status_code != 401
    assert httpx.get(real_server.url + "/health").json() == {"status": "ok"}


def test_sdk_auth_errors(real_server: LiveServer) -> None:
    with pytest.raises(openai.AuthenticationError):
        openai_client(real_server, key="bad").models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(real_server, key="bad").messages.create(**MSGS)


def test_context_length_exceeded(real_server: LiveServer) -> None:
    long = "word " * 2000  # far over the 384-token context
    big = {**CHAT, "messages": [{"role": "user", "content": long}]}
    openai_error(post(real_server, "/v1/chat/completions", big), 400, "context_length_exceeded")
    openai_error(post(real_server, "/v1/chat/completions", {**big, "stream": True}), 400,
                 "context_length_exceeded")
    openai_error(post(real_server, "/v1/responses", {"model": MODEL_ID, "input": long}), 400,
                 "context_length_exceeded")
    big_msgs = {**MSGS, "messages": [{"role": "user", "content": long}]}
    anthropic_error(post(real_server, "/v1/messages", big_msgs), 400, "invalid_request_error")
    anthropic_error(post(real_server, "/v1/messages", {**big_msgs, "stream": True}), 400,
                    "invalid_request_error")
    assert openai_client(real_server).chat.completions.create(**CHAT).choices[0].finish_reason


def test_body_over_limit_is_413_before_parsing(real_server: LiveServer) -> None:
    huge = b"x" * (300 * 1024)  # not JSON: the size check must come first
    openai_error(post(real_server, "/v1/chat/completions", huge), 413, "request_too_large")
    anthropic_error(post(real_server, "/v1/messages", huge), 413, "request_too_large")

    def chunks() -> Any:  # no Content-Length: the limit applies while reading
        for _ in range(300):
            yield b"y" * 1024

    r = httpx.post(real_server.url + "/v1/chat/completions", content=chunks(), headers=AUTH)
    openai_error(r, 413, "request_too_large")


def test_unsupported_features(real_server: LiveServer) -> None:
    cases = [({**CHAT, "n": 17}, "n_not_supported"), ({**CHAT, "n": 2, "best_of": 3}, "best_of_not_supported"),
             ({**CHAT, "functions": [{"name": "f"}]}, "tools_not_supported"),
             ({**CHAT, "messages": [{"role": "function", "content": "x"}]}, "tools_not_supported"),
             ({**CHAT, "messages": [{"role": "user", "content": [
                 {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
              "vision_disabled"),
             ({**CHAT, "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
              "modality_not_supported"),
             ({**CHAT, "tools": [{"type": "code_interpreter"}]}, "tools_not_supported"),
             ({**CHAT, "messages": [{"role": "user", "content": "a"},
                                    {"role": "system", "content": "late"}]}, "unsupported_role")]
    for body, code in cases:
        openai_error(post(real_server, "/v1/chat/completions", body), 400, code)
    err = openai_error(post(real_server, "/v1/chat/completions",
                            {**CHAT, "response_format": {"type": "xml"}}), 400)
    assert "response_format" in err["message"] and err["param"] == "response_format.type"
    openai_error(post(real_server, "/v1/responses",
                      {"model": MODEL_ID, "input": "x", "background": True}), 400)
    image = {**MSGS, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]}
    anthropic_error(post(real_server, "/v1/messages", image), 400, "invalid_request_error")


def test_engine_exception_fails_only_that_request(scripted) -> None:
    def reply(messages: list[dict[str, Any]], prompt: str) -> str:
        if messages[-1]["content"] == "explode":
            raise RuntimeError("scripted engine failure")
        return "fine</think>ok"

    srv = scripted(reply)
    bad = post(srv, "/v1/chat/completions",
               {**CHAT, "messages": [{"role": "user", "content": "explode"}]})
    err = openai_error(bad, 500, "internal_error")
    assert "scripted" not in err["message"]  # no internals leak
    anthropic_error(post(srv, "/v1/messages",
                         {**MSGS, "messages": [{"role": "user", "content": "explode"}]}),
                    500, "api_error")
    good = openai_client(srv).chat.completions.create(**{**CHAT, "max_tokens": 20})
    assert good.choices[0].message.content == "ok"


async def test_overload_429_and_529(scripted) -> None:
    srv = scripted("slow " * 40, max_pending=1, engine_kw={"token_delay_s": 0.02},
                   default_max_tokens=40)
    async with httpx.AsyncClient(base_url=srv.url, headers=AUTH, timeout=60) as client:
        first = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT | {
            "max_tokens": 40}))
        await asyncio.sleep(0.3)  # running
        second = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
        await asyncio.sleep(0.1)  # waiting: the queue is now full
        r3 = await client.post("/v1/chat/completions", json=CHAT)
        r4 = await client.post("/v1/messages", json=MSGS)
        openai_error(r3, 429, "server_overloaded")
        anthropic_error(r4, 529, "overloaded_error")
        assert (await first).status_code == 200 and (await second).status_code == 200
    after = openai_client(srv).chat.completions.create(**CHAT)  # the queue drained
    assert after.choices[0].finish_reason == "length"


def test_mid_stream_failure_in_each_protocol(scripted) -> None:
    srv = scripted("a b c d e f g h", engine_kw={"fail_after": 3}, enable_thinking=False,
                   default_max_tokens=20)
    msgs = [{"role": "user", "content": "x"}]

    def stream(path: str, body: dict[str, Any]) -> str:
        with httpx.stream("POST", srv.url + path, json=body, headers=AUTH, timeout=30) as r:
            assert r.status_code == 200
            return r.read().decode()

    chat = stream("/v1/chat/completions", {"model": MODEL_ID, "stream": True, "messages": msgs})
    *_, last, done = [line for line in chat.splitlines() if line.startswith("data:")]
    assert json.loads(last[5:])["error"]["code"] == "internal_error"
    assert done == "data: [DONE]"  # the error event, then the stream's end
    claude = stream("/v1/messages", {"model": "m", "stream": True, "max_tokens": 20,
                                     "messages": msgs})
    assert "event: error" in claude and '"api_error"' in claude
    assert "message_stop" not in claude
    resp = stream("/v1/responses", {"model": MODEL_ID, "stream": True, "input": "x"})
    assert "event: response.failed" in resp and '"internal_error"' in resp
    with pytest.raises(openai.APIError):
        list(openai_client(srv).chat.completions.create(model=MODEL_ID, messages=msgs,
                                                        stream=True))
    srv.engine.fail_after = None  # the same server keeps serving
    ok = openai_client(srv).chat.completions.create(model=MODEL_ID, messages=msgs)
    assert ok.choices[0].message.content == "a b c d e f g h"
