"""Structured output and enforced tool calls through the official SDKs (issue 29, item 5).

The real tiny engine has random weights: left alone it writes neither JSON nor tool calls, so
every valid output here was forced by the grammar. Thinking is off (an open think block lets
free text run first, and random weights never close it).
"""
from __future__ import annotations

import json
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests.server.conftest import MODEL_ID, anthropic_client, openai_client

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "size"],
          "properties": {"ok": {"type": "boolean"},
                         "size": {"type": "string", "enum": ["small", "large"]}}}
ARGS_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "metric"],
               "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]},
                              "metric": {"type": "boolean"}}}
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather",
                                                           "parameters": ARGS_SCHEMA}}]
FLAT_TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": ARGS_SCHEMA}]
ANTHROPIC_TOOLS: list[Any] = [{"name": "get_weather", "input_schema": ARGS_SCHEMA}]
ASK: list[Any] = [{"role": "user", "content": "Weather?"}]
NO_THINKING = {"enable_thinking": False}
ROOM = 60  # tokens: enough for the grammar to close (JSON whitespace is capped), still fast


@pytest.mark.parametrize("stream", [False, True])
def test_chat_json_schema_validates(real_server, stream: bool) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA,
                                                       "strict": True}}
    client = openai_client(real_server)
    kw: dict[str, Any] = dict(model=MODEL_ID, messages=ASK, max_tokens=ROOM,
                              response_format=fmt, extra_body=NO_THINKING)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = client.chat.completions.create(**kw)
        text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)
    free = client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=8,
                                          extra_body=NO_THINKING)
    assert not (free.choices[0].message.content or "").startswith("{")


def test_chat_json_object_is_an_object(real_server) -> None:
    for stream in (False, True):
        kw: dict[str, Any] = dict(model=MODEL_ID, messages=ASK, max_tokens=ROOM, temperature=0.0,
                                  response_format={"type": "json_object"}, extra_body=NO_THINKING)
        if stream:
            chunks = list(openai_client(real_server).chat.completions.create(stream=True, **kw))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = chunks[-1].choices[0].finish_reason
        else:
            r = openai_client(real_server).chat.completions.create(**kw)
            text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
        assert finish == "stop" and isinstance(json.loads(text), dict)


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_chat_tool_choice_forces_a_valid_call(real_server, choice: Any) -> None:
    client = openai_client(real_server)
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=CHAT_TOOLS,
                                       tool_choice=choice, parallel_tool_calls=False,
                                       max_tokens=ROOM, extra_body=NO_THINKING)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = r.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].function.arguments), ARGS_SCHEMA)

    chunks = list(client.chat.completions.create(
        model=MODEL_ID, messages=ASK, tools=CHAT_TOOLS, tool_choice=choice, max_tokens=ROOM,
        parallel_tool_calls=False, stream=True, extra_body=NO_THINKING))
    streamed = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in streamed] == ["get_weather"]
    for tc in streamed:
        jsonschema.validate(json.loads(tc.function.arguments), ARGS_SCHEMA)


def test_responses_text_format_and_required_tool(real_server) -> None:
    client = openai_client(real_server)
    r = client.responses.create(
        model=MODEL_ID, input="Weather?", max_output_tokens=ROOM, extra_body=NO_THINKING,
        text={"format": {"type": "json_schema", "name": "s", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    assert r.text.format.type == "json_schema"

    events = list(client.responses.create(
        model=MODEL_ID, input="Weather?", tools=FLAT_TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=ROOM, stream=True, extra_body=NO_THINKING))
    done = [e for e in events if e.type == "response.completed"]
    assert done, [(e.type, getattr(e, "response", None)) for e in events[-2:]]
    done = done[0].response
    calls = [o for o in done.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), ARGS_SCHEMA)


def test_anthropic_output_config_and_tool_any(real_server) -> None:
    client = anthropic_client(real_server)
    off: Any = {"type": "disabled"}
    msg = client.messages.create(
        model="m", max_tokens=ROOM, messages=ASK, thinking=off,
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
    texts = [b.text for b in msg.content if b.type == "text"]
    assert msg.stop_reason == "end_turn"
    jsonschema.validate(json.loads("".join(texts)), SCHEMA)

    with client.messages.stream(model="m", max_tokens=ROOM, messages=ASK, thinking=off,
                                tools=ANTHROPIC_TOOLS,
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}
                                ) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, ARGS_SCHEMA)


def test_bad_schema_is_a_400_naming_the_field(real_server) -> None:
    client = openai_client(real_server)
    bad: Any = {"type": "json_schema", "json_schema": {"name": "s",
                                                       "schema": {"type": "no-such-type"}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=4,
                                       response_format=bad)
    assert err.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL_ID, messages=ASK, max_tokens=4,
                                       tools=CHAT_TOOLS, response_format={"type": "json_object"})
    assert err.value.body["param"] == "response_format"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client(real_server).messages.create(
            model="m", max_tokens=4, messages=ASK,
            output_config={"format": {"type": "json_schema", "schema": {"type": 7}}})
