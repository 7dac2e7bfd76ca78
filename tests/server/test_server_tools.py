"""Tool calls, reasoning split, thinking toggle and stop sequences on all three protocols.

The scripted engine replays fixed replies through the real tokenizer, detokenizer and parsers
(random weights never produce these), with prompts rendered by the real Qwen3.6 template.
"""
from __future__ import annotations

import json
from typing import Any

from tests.server.conftest import MODEL_ID, anthropic_client, openai_client

CALL = ("I should call the weather tool.</think>\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "</function>\n</tool_call>")
ANSWER = "The tool answered.</think>\n\nIt is sunny in Paris."
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "days": {"type": "integer"}}, "required": ["city"]}
OPENAI_TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast", "parameters": SCHEMA}}]


def weather(messages: list[dict[str, Any]], prompt: str) -> str:
    return ANSWER if messages[-1]["role"] == "tool" else CALL


def test_openai_tool_round_trip(scripted) -> None:
    srv = scripted(weather, default_max_tokens=200)
    client = openai_client(srv)
    msgs: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=OPENAI_TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == "I should call the weather tool."  # type: ignore[attr-defined]
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and len(call.id) == 5 + 16
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert "get_weather" in srv.engine.prompts[0] and "<tools>" in srv.engine.prompts[0]

    msgs += [choice.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"}]
    second = client.chat.completions.create(model=MODEL_ID, messages=msgs, tools=OPENAI_TOOLS)
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop"
    prompt = srv.engine.prompts[1]
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in prompt
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in prompt


def test_openai_stream_tool_call_chunk_and_reasoning(scripted) -> None:
    srv = scripted(weather, default_max_tokens=200)
    chunks = list(openai_client(srv).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Paris?"}], tools=OPENAI_TOOLS,
        stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                        for c in chunks if c.choices)
    assert reasoning == "I should call the weather tool."
    with_calls = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(with_calls) == 1  # all calls in one chunk, at the end
    tc = with_calls[0].choices[0].delta.tool_calls[0]
    assert tc.index == 0 and tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"city": "Paris", "days": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].choices[0].delta.content is None


def test_anthropic_tool_round_trip(scripted) -> None:
    srv = scripted(weather)
    client = anthropic_client(srv)
    tools: list[Any] = [{"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}]
    msgs: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.messages.create(model="any-name", max_tokens=200, messages=msgs, tools=tools)
    assert first.model == "any-name" and first.stop_reason == "tool_use"
    kinds = [b.type for b in first.content]
    assert kinds == ["thinking", "tool_use"]
    use = first.content[1]
    assert use.id.startswith("toolu_") and use.input == {"city": "Paris", "days": 3}

    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                               for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                           "content": "sunny, 21C"}]}]
    second = client.messages.create(model="any-name", max_tokens=200, messages=msgs, tools=tools)
    assert second.stop_reason == "end_turn"
    assert [b.type for b in second.content] == ["thinking", "text"]
    assert second.content[1].text == "It is sunny in Paris."
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in srv.engine.prompts[1]


def test_anthropic_stream_event_sequence(scripted) -> None:
    srv = scripted(weather)
    tools: list[Any] = [{"name": "get_weather", "input_schema": SCHEMA}]
    with anthropic_client(srv).messages.stream(
            model="m", max_tokens=200, tools=tools,
            messages=[{"role": "user", "content": "Paris?"}]) as stream:
        events = [ev for ev in stream]
        final = stream.get_final_message()
    raw = [(e.type, e.delta.type if e.type == "content_block_delta" else
            e.content_block.type if e.type == "content_block_start" else None) for e in events
           if e.type in ("message_start", "content_block_start", "content_block_delta",
                         "content_block_stop", "message_delta", "message_stop")]
    dedup = [x for i, x in enumerate(raw) if i == 0 or x != raw[i - 1]]
    assert dedup == [
        ("message_start", None), ("content_block_start", "thinking"),
        ("content_block_delta", "thinking_delta"), ("content_block_delta", "signature_delta"),
        ("content_block_stop", None), ("content_block_start", "tool_use"),
        ("content_block_delta", "input_json_delta"), ("content_block_stop", None),
        ("message_delta", None), ("message_stop", None)]
    assert final.stop_reason == "tool_use"
    assert final.content[1].input == {"city": "Paris", "days": 3}
    assert final.usage.output_tokens > 0


def test_responses_tool_round_trip_with_chaining(scripted) -> None:
    srv = scripted(weather, default_max_tokens=200)
    client = openai_client(srv)
    tools: list[Any] = [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]
    first = client.responses.create(model=MODEL_ID, input="Weather in Paris?", tools=tools)
    assert first.status == "completed"
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    call = first.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris",
                                                                          "days": 3}
    second = client.responses.create(
        model=MODEL_ID, previous_response_id=first.id, tools=tools,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "It is sunny in Paris."
    assert second.previous_response_id == first.id
    prompt = srv.engine.prompts[1]
    assert "Weather in Paris?" in prompt and "<tool_response>\nsunny\n</tool_response>" in prompt


def test_thinking_toggle_per_request(scripted) -> None:
    srv = scripted(lambda m, p: "Plain answer.", default_max_tokens=50)
    client = openai_client(srv)
    q: list[Any] = [{"role": "user", "content": "q"}]
    off = client.chat.completions.create(model=MODEL_ID, messages=q,
                                         extra_body={"enable_thinking": False})
    assert off.choices[0].message.content == "Plain answer."
    assert srv.engine.prompts[-1].endswith("<think>\n\n</think>\n\n")
    on = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "q"}])
    assert on.choices[0].message.reasoning_content == "Plain answer."  # type: ignore[attr-defined]
    assert srv.engine.prompts[-1].endswith("<think>\n")
    msg = anthropic_client(srv).messages.create(
        model="m", max_tokens=50, thinking={"type": "disabled"},
        messages=[{"role": "user", "content": "q"}])
    assert [b.type for b in msg.content] == ["text"]


def test_no_thinking_server_default(scripted) -> None:
    srv = scripted(lambda m, p: "Hello.", enable_thinking=False)
    r = openai_client(srv).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "q"}])
    assert r.choices[0].message.content == "Hello."
    assert srv.engine.prompts[-1].endswith("</think>\n\n")


def test_stop_sequences(scripted) -> None:
    srv = scripted(lambda m, p: "one two STOP three", enable_thinking=False)
    r = openai_client(srv).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "q"}], stop=["STOP"])
    assert r.choices[0].message.content == "one two " and r.choices[0].finish_reason == "stop"
    msg = anthropic_client(srv).messages.create(
        model="m", max_tokens=50, stop_sequences=["XYZ", "STOP"],
        messages=[{"role": "user", "content": "q"}])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "STOP"
    assert msg.content[0].text == "one two "
    plain = anthropic_client(srv).messages.create(
        model="m", max_tokens=50, messages=[{"role": "user", "content": "q"}])
    assert plain.stop_reason == "end_turn" and plain.stop_sequence is None
    cut = anthropic_client(srv).messages.create(
        model="m", max_tokens=2, messages=[{"role": "user", "content": "q"}])
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
