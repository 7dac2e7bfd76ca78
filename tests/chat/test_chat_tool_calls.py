from __future__ import annotations

import random
import re

import pytest

from ninfer_nb.chat import ChatDelta, ToolCall, ToolCallStreamParser, parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "score": {"type": "number"},
                    "exact": {"type": "boolean"},
                    "filters": {"type": "object"},
                    "tags": {"type": "array"},
                    "maybe": {"type": ["integer", "null"]},
                    "either": {"anyOf": [{"type": "number"}, {"type": "string"}]},
                },
            },
        },
    },
    {"name": "lookup", "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}}}},
]


def block(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_single_call_and_content_before() -> None:
    text = "I'll search for it.\n\n" + block("search", query="cats & dogs", limit="5")
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == "I'll search for it."
    assert [(c.name, c.arguments) for c in calls] == [("search", {"query": "cats & dogs", "limit": 5})]
    assert re.fullmatch(r"call_[0-9a-f]{16}", calls[0].id)
    assert calls[0].arguments_json == '{"query": "cats & dogs", "limit": 5}'


def test_typed_parameters_follow_the_schema() -> None:
    text = block(
        "search",
        query="123",
        limit="7.0",
        score="2.5",
        exact="True",
        filters='{"lang": "fr", "n": [1, 2]}',
        tags="['a', 'b']",
        maybe="null",
        either="3",
    )
    _, [call] = parse_tool_calls(text, TOOLS)
    assert call.arguments == {
        "query": "123",  # a string stays verbatim even when it looks like JSON
        "limit": 7,
        "score": 2.5,
        "exact": True,
        "filters": {"lang": "fr", "n": [1, 2]},
        "tags": ["a", "b"],
        "maybe": None,
        "either": 3,
    }


def test_values_that_do_not_fit_the_schema_stay_strings() -> None:
    text = block("search", limit="five", score="NaN", exact="yes", filters="{broken", tags='{"a": 1}', either="x y")
    _, [call] = parse_tool_calls(text, TOOLS)
    assert call.arguments == {
        "limit": "five", "score": "NaN", "exact": "yes", "filters": "{broken", "tags": '{"a": 1}', "either": "x y",
    }


def test_without_schema_values_are_json_when_valid() -> None:
    text = block("unknown", a="42", b="true", c='{"k": [1]}', d="hello world", e="[1, 2", f='"quoted"')
    _, [call] = parse_tool_calls(text, TOOLS)
    assert call.arguments == {"a": 42, "b": True, "c": {"k": [1]}, "d": "hello world", "e": "[1, 2", "f": "quoted"}
    _, [call] = parse_tool_calls(text)  # no tools at all
    assert call.arguments["a"] == 42


def test_anthropic_shaped_tool_and_multiline_values() -> None:
    code = "def f():\n    return 1\n"
    text = block("lookup", id="9") + "\n" + block("write", code=code)
    content, calls = parse_tool_calls(text, TOOLS)
    assert content == ""
    assert [c.arguments for c in calls] == [{"id": 9}, {"code": code}]
    assert calls[0].id != calls[1].id


def test_multiple_calls_and_content_around_them() -> None:
    text = "Plan:\n" + block("a", x="1") + "\n\n" + block("b") + "\n\nDone."
    content, calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["a", "b"] and calls[1].arguments == {}
    assert content == "Plan:Done."


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\nno function here\n</tool_call>",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\nstray text\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=a\n1\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>",  # no </function>
    ],
)
def test_malformed_blocks_stay_content(bad: str) -> None:
    text = "before " + bad + " after"
    assert parse_tool_calls(text) == (text, [])


def test_unclosed_block_stays_content_and_good_calls_survive() -> None:
    good = block("ok", v="1")
    text = good + "\n<tool_call>\n<function=cut_off>\n<parameter=v>\n2"
    content, calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["ok"]
    assert content == "<tool_call>\n<function=cut_off>\n<parameter=v>\n2"


def test_missing_final_parameter_close_is_tolerated() -> None:
    text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\nlast\n</function>\n</tool_call>"
    _, [call] = parse_tool_calls(text)
    assert call.arguments == {"a": 1, "b": "last"}


def stream(chunks: list[str], tools: list[dict] | None = None) -> tuple[str, list[ToolCall], list[ChatDelta]]:
    parser = ToolCallStreamParser(tools)
    deltas = [d for c in chunks for d in parser.push(c)] + parser.flush()
    content = "".join(d.text for d in deltas if d.kind == "content")
    calls = [d.tool_call for d in deltas if d.kind == "tool_call"]
    assert all(c is not None for c in calls)
    return content, calls, deltas  # type: ignore[return-value]


def test_content_streams_immediately() -> None:
    parser = ToolCallStreamParser()
    assert [d.text for d in parser.push("Hello wor")] == ["Hello wor"]
    assert parser.push("ld <tool_") == [ChatDelta("content", "ld")]  # " <tool_" might open a call
    assert parser.push("call>\n<function=f>\n") == []
    [delta] = parser.push("</function>\n</tool_call>")
    assert delta.kind == "tool_call" and delta.tool_call is not None and delta.tool_call.name == "f"
    assert parser.push("\n<tool_call") == []
    assert parser.push("x") == [ChatDelta("content", "<tool_callx")]  # newline after a call dropped
    assert parser.push(" <tool") == []
    assert parser.flush() == [ChatDelta("content", " <tool")]


def test_stream_equals_non_streaming_on_random_chunkings() -> None:
    rng = random.Random(2)
    parts = [
        "Hi ", "\n", "\n\n", " text", "<", "<tool", "<tool_call>", "</tool_call>", block("search", limit="3"),
        block("g", a='{"x": 1}', b="two\nlines"), "<tool_call>\n<function=bad>\n", "</function>", "trailing",
    ]
    for _ in range(500):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))
        cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 8)))
        chunks = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        content, calls, deltas = stream(chunks, TOOLS)
        want_content, want_calls = parse_tool_calls(text, TOOLS)
        assert content == want_content, (text, chunks)
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in want_calls]
        assert all(d.text for d in deltas if d.kind == "content")


def test_stream_every_split_of_one_call() -> None:
    text = "Sure.\n" + block("search", query="x y", limit="2") + "\nok"
    want = parse_tool_calls(text, TOOLS)
    for i in range(len(text) + 1):
        content, calls, _ = stream([text[:i], text[i:]], TOOLS)
        assert content == want[0] == "Sure.ok"
        assert [c.arguments for c in calls] == [{"query": "x y", "limit": 2}]
