"""Tool calls stream as each is parsed, on all three protocols (scripted engine replaying two
Qwen XML calls with a delay per token): the first call's event goes out while the second is
still being generated, and the protocol's call indexes count up."""
from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.server.conftest import API_KEY, MODEL_ID

ONE = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n"
       "</function>\n</tool_call>")
TWO = "Checking.</think>\n\n" + ONE.format(city="Paris") + "\n" + ONE.format(city="Rome")
TOOL = {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
AUTH = {"Authorization": f"Bearer {API_KEY}", "x-api-key": API_KEY}


def timed_lines(url: str, body: dict[str, Any]) -> list[tuple[float, str]]:
    out = []
    with httpx.stream("POST", url, json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            out.append((time.monotonic(), line))
    return out


def first_time(lines: list[tuple[float, str]], needle: str) -> float:
    return next(t for t, line in lines if needle in line)


def test_calls_stream_one_by_one(scripted) -> None:
    srv = scripted(TWO, engine_kw={"token_delay_s": 0.02}, default_max_tokens=300)
    msgs = [{"role": "user", "content": "Paris and Rome?"}]
    # OpenAI chat: one chunk per call, indexes 0 and 1, the first well before the second
    chat = timed_lines(srv.url + "/v1/chat/completions", {
        "model": MODEL_ID, "stream": True, "messages": msgs,
        "tools": [{"type": "function", "function": TOOL}]})
    calls = [(t, json.loads(line[6:])["choices"][0]["delta"]["tool_calls"])
             for t, line in chat if '"tool_calls": [' in line]
    assert [c[0]["index"] for _, c in calls] == [0, 1]
    assert [json.loads(c[0]["function"]["arguments"])["city"] for _, c in calls] == ["Paris", "Rome"]
    assert calls[1][0] - calls[0][0] > 0.2          # Rome's ~20 tokens came after Paris's chunk
    # Anthropic: a tool_use block per call, the first before Rome is generated
    claude = timed_lines(srv.url + "/v1/messages", {
        "model": "m", "max_tokens": 300, "stream": True, "messages": msgs,
        "tools": [{"name": "get_weather", "input_schema": TOOL["parameters"]}]})
    starts = [(t, line) for t, line in claude if '"tool_use"' in line and "content_block_start" in line]
    assert len(starts) == 2 and starts[1][0] - starts[0][0] > 0.2
    # Responses: a function_call item per call, added as it is parsed
    resp = timed_lines(srv.url + "/v1/responses", {
        "model": MODEL_ID, "stream": True, "input": "Paris and Rome?",
        "tools": [{"type": "function", **TOOL}]})
    added = [t for t, line in resp if '"function_call"' in line and "output_item.added" in line]
    assert len(added) == 2 and added[1] - added[0] > 0.2
    assert first_time(resp, "response.completed") >= added[1]
