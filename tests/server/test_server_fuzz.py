"""Hypothesis fuzzing of every POST route's body and headers (issue 30, item 7).

For each route: a valid body with one field replaced by arbitrary JSON (lone surrogates, huge
integers, NaN, deep nesting included), arbitrary JSON documents, arbitrary bytes, and arbitrary
header values. Every answer must be below 500; a 4xx must be a JSON error in the route's
protocol shape; a 200 stream must end with its protocol's terminal event; and the server must
answer a normal request afterwards. One scripted server serves the whole module.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from tests.server.conftest import API_KEY, MODEL_ID, base_config, openai_client
from tests.server.harness import LiveServer
from tests.server.scripted_engine import ScriptedEngine

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
MESSAGES = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL_ID, "messages": MESSAGES, "max_tokens": 3},
    "/v1/responses": {"model": MODEL_ID, "input": "hi", "max_output_tokens": 3},
    "/v1/responses/input_tokens": {"model": MODEL_ID, "input": "hi"},
    "/v1/messages": {"model": "m", "max_tokens": 3, "messages": MESSAGES},
    "/v1/messages/count_tokens": {"model": "m", "messages": MESSAGES},
}
FIELDS = {  # the fields each route reads, plus a few it does not
    "/v1/chat/completions": [
        "model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
        "temperature", "top_p", "top_k", "min_p", "seed", "stop", "tools", "tool_choice", "n",
        "response_format", "presence_penalty", "frequency_penalty", "enable_thinking",
        "chat_template_kwargs", "ignore_eos", "functions", "user"],
    "/v1/responses": [
        "model", "input", "instructions", "max_output_tokens", "stream", "temperature", "top_p",
        "tools", "tool_choice", "reasoning", "text", "include", "store", "metadata",
        "previous_response_id", "background", "seed", "parallel_tool_calls"],
    "/v1/messages": [
        "model", "messages", "max_tokens", "system", "stream", "stop_sequences", "temperature",
        "top_p", "top_k", "tools", "tool_choice", "thinking", "metadata"],
}
FIELDS["/v1/responses/input_tokens"] = FIELDS["/v1/responses"]
FIELDS["/v1/messages/count_tokens"] = FIELDS["/v1/messages"]
TERMINAL = {
    "/v1/chat/completions": ("data: [DONE]",),
    "/v1/messages": ("event: message_stop", "event: error"),
    "/v1/responses": ("event: response.completed", "event: response.incomplete",
                      "event: response.failed", "event: response.cancelled"),
}
MESSAGE_PATHS = st.sampled_from(["messages", "input"])

texts = st.text(st.characters() | st.characters(categories=["Cs"]), max_size=20)  # + surrogates
scalars = (st.none() | st.booleans() | texts
           | st.integers(-(2**70), 2**70) | st.sampled_from([10**400, -(10**300), 2**63, 2**64])
           | st.floats(allow_nan=True, allow_infinity=True))
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["role", "content", "type", "text", "name", "function",
                                       "arguments", "parameters", "input_schema", "id",
                                       "include_usage", "effort", "format"]) | texts,
                      children, max_size=4),
    max_leaves=12,
)
# Shapes that reach deeper into the message parsers than arbitrary JSON usually does.
message_items = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"]) | texts},
    optional={"content": json_values | texts | st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "input_text", "image_url", "tool_use", "tool_result",
                                  "thinking", "image"])}, optional={"text": json_values})),
        "tool_calls": json_values, "tool_call_id": json_values, "type": json_values})


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


# JSON text json.dumps will not write: numbers past Python's 4300-digit limit, NaN, nesting.
raw_values = (st.integers(4000, 6000).map(lambda n: "9" * n)
              | st.sampled_from(["NaN", "-Infinity", "1e999", '"\\udfff"', '{"\\ud800": 1}'])
              | st.integers(60, 1200).map(deep))


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    kind = draw(st.sampled_from(["field", "field", "messages", "document", "bytes", "raw"]))
    base = dict(ROUTES[path])
    if kind == "field":
        base[draw(st.sampled_from(FIELDS[path]))] = draw(json_values)
        if draw(st.booleans()) and "count" not in path and "input_tokens" not in path:
            base["stream"] = True
    elif kind == "messages":
        key = "input" if "responses" in path else "messages"
        base[key] = draw(st.lists(message_items, min_size=1, max_size=3))
        base["stream"] = draw(st.booleans()) and "count" not in path
    elif kind == "document":
        return json.dumps(draw(json_values)).encode()
    elif kind == "bytes":
        return draw(st.binary(max_size=64))
    else:
        key = json.dumps(draw(st.sampled_from([*FIELDS[path], "x"])))
        return (json.dumps(base)[:-1] + f", {key}: {draw(raw_values)}}}").encode()
    return json.dumps(base).encode()  # ensure_ascii: a lone surrogate goes out as \udXXX


# Bytes HTTP allows in a value (tab, visible ASCII, obs-text 0x80-0xff: not UTF-8 as a rule).
# Control bytes are refused by aiohttp's HTTP parser with a plain 400 before any app code runs.
HEADER_BYTES = [9, *range(0x20, 0x7F), *range(0x80, 0x100)]
header_values = st.lists(st.sampled_from(HEADER_BYTES), max_size=24).map(bytes).filter(
    lambda b: b == b.strip())
header_sets = st.fixed_dictionaries({}, optional={
    "Authorization": st.sampled_from([b"Bearer " + API_KEY.encode(), b"Bearer"])
    | header_values.map(lambda v: b"Bearer " + v),
    "x-api-key": header_values,
    "Content-Type": st.sampled_from([b"application/json", b"text/plain"]) | header_values,
    "x-fuzz": header_values,
    "anthropic-version": header_values,
})


@pytest.fixture(scope="module")
def server(tiny_qwen35_dir: Any) -> Iterator[LiveServer]:
    from ninfer_nb.chat import Tokenizer

    engine = ScriptedEngine(Tokenizer.from_dir(tiny_qwen35_dir), "fine</think>ok",
                            model_id=MODEL_ID)
    with LiveServer(engine, base_config(request_log=None)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def check_answer(path: str, r: httpx.Response) -> None:
    assert r.status_code < 500, (path, r.status_code, r.text[:500])
    if r.status_code >= 400:
        body = r.json()
        if path.startswith("/v1/messages"):
            assert body["type"] == "error" and {"type", "message"} <= set(body["error"]), body
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"}, body
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        lines = r.text.splitlines()
        route = path if path in TERMINAL else ""
        assert route and any(line in TERMINAL[route] for line in lines[-3:]), r.text[-500:]
    else:
        r.json()


FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("path", list(ROUTES))
def test_fuzz_bodies(client: httpx.Client, server: LiveServer, path: str) -> None:
    @FUZZ
    @given(raw=bodies(path))
    def one(raw: bytes) -> None:
        check_answer(path, client.post(path, content=raw, headers=AUTH))

    one()
    out = openai_client(server).chat.completions.create(model=MODEL_ID, messages=MESSAGES)
    assert out.choices[0].message.content == "ok"


@pytest.mark.parametrize("path", list(ROUTES))
def test_fuzz_headers(client: httpx.Client, server: LiveServer, path: str) -> None:
    @settings(FUZZ, max_examples=15)
    @given(headers=header_sets)
    def one(headers: dict[str, bytes]) -> None:
        try:
            r = client.post(path, content=json.dumps(ROUTES[path]).encode(), headers=headers)
        except httpx.LocalProtocolError:  # a value h11 will not send at all
            reject()
        check_answer(path, r)

    one()
    out = openai_client(server).chat.completions.create(model=MODEL_ID, messages=MESSAGES)
    assert out.choices[0].message.content == "ok"
