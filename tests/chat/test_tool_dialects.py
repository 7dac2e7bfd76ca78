"""Tool-call dialects: detection from chat templates, and each dialect parsed from recorded
model outputs whole, one character at a time, at every split and in random chunkings."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ninfer_nb.chat import (
    ChatDelta,
    ChatMessageOut,
    ChatStreamParser,
    IncrementalDetokenizer,
    Tokenizer,
    ToolCallDialect,
    detect_dialect,
    get_dialect,
    parse_chat_output,
)

ASSETS = Path(__file__).resolve().parents[1] / "assets"

# ---- templates: the lines that carry each family's tool-call instructions ------------------------
QWEN2_5_TEMPLATE = (  # Qwen2.5-*-Instruct tokenizer_config.json, tools branch (Qwen3 is alike)
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and '
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n{%- endif %}\n'
    "{%- for message in messages %}{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.function.name }}"
    "{{- '\", \"arguments\": ' }}{{- tool_call.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}{%- endfor %}"
)
QWEN3_TEMPLATE = QWEN2_5_TEMPLATE + (
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
)
LLAMA3_1_TEMPLATE = (  # Meta-Llama-3.1-*-Instruct, tool branches
    "{%- if builtin_tools is defined or tools is not none %}\n"
    '    {{- "Environment: ipython\\n" }}\n{%- endif %}\n'
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
    "name and its value}.' }}\n"
    "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    '            {{- "<|python_tag|>" + tool_call.name + ".call(" }}\n'
    "        {%- else  %}\n"
    "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "            {{- '\"parameters\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    '            {{- "}" }}\n'
    "        {%- endif %}\n"
    '    {%- elif message.role == "tool" or message.role == "ipython" %}\n'
    '        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n'
)
LLAMA3_2_TEMPLATE = LLAMA3_1_TEMPLATE.replace("<|python_tag|>", "")  # 3.2 dropped built-in tools


def test_detect_dialect_from_templates() -> None:
    qwen3_6 = (ASSETS / "qwen3_6_chat_template.jinja").read_text(encoding="utf-8")
    assert detect_dialect(qwen3_6).name == "qwen_xml"
    assert detect_dialect(QWEN2_5_TEMPLATE).name == "hermes_json"
    assert detect_dialect(QWEN3_TEMPLATE).name == "hermes_json"
    assert detect_dialect(LLAMA3_1_TEMPLATE).name == "llama3_json"
    assert detect_dialect(LLAMA3_2_TEMPLATE).name == "llama3_json"
    assert detect_dialect(None).name == "qwen_xml"  # no template: the engine's native models
    assert detect_dialect("{{ messages }}").name == "qwen_xml"


def test_tokenizer_names_its_dialect(qwen_tok: Tokenizer) -> None:
    assert qwen_tok.tool_dialect.name == detect_dialect(qwen_tok.chat_template).name
    for template, name in ((QWEN2_5_TEMPLATE, "hermes_json"), (LLAMA3_1_TEMPLATE, "llama3_json")):
        tok = Tokenizer(qwen_tok.backend, eos_token_ids=qwen_tok.eos_token_ids, chat_template=template)
        assert tok.tool_dialect is get_dialect(name)


def test_get_dialect() -> None:
    assert get_dialect(None).name == "qwen_xml"
    hermes = get_dialect("hermes_json")
    assert isinstance(hermes, ToolCallDialect) and get_dialect(hermes) is hermes
    with pytest.raises(KeyError, match="unknown tool-call dialect"):
        get_dialect("mistral")


# ---- recorded outputs ------------------------------------------------------------------------------
def hermes(name: str, args: dict, key: str = "arguments") -> str:
    return "<tool_call>\n" + json.dumps({"name": name, key: args}, ensure_ascii=False) + "\n</tool_call>"


def xml(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


PARIS = {"city": "Paris"}
TOKYO = {"city": "Tokyo", "unit": "celsius", "days": 3}
CODE = {"code": 'print("}{ \\" ]")\nx = {"a": [1, 2]}', "timeout": 1.5, "dry_run": False, "tags": None}
XML_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]

# (dialect, output, starts_in_reasoning, want reasoning, want content, want [(name, arguments)])
RECORDED: list[tuple[str, str, bool, str, str, list[tuple[str, dict]]]] = [
    # Qwen2.5-Instruct: one call, nothing else
    ("hermes_json", hermes("get_weather", PARIS), False, "", "", [("get_weather", PARIS)]),
    # Qwen3 thinking: reasoning, then two parallel calls
    ("hermes_json",
     "<think>\nThe user wants Paris and Tokyo. Two calls.\n</think>\n\n"
     + hermes("get_weather", PARIS) + "\n" + hermes("get_weather", TOKYO),
     False, "The user wants Paris and Tokyo. Two calls.", "",
     [("get_weather", PARIS), ("get_weather", TOKYO)]),
    # content before, code with braces and quotes in a string, non-ASCII
    ("hermes_json",
     "Je vais exécuter le code 日本.\n\n" + hermes("run_python", CODE) + "\n\nVoilà.",
     False, "", "Je vais exécuter le code 日本.Voilà.", [("run_python", CODE)]),
    # arguments written as a JSON string; a final block whose </tool_call> never came
    ("hermes_json",
     '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_time", "arguments": {}}',
     False, "", "", [("get_weather", PARIS), ("get_time", {})]),
    # malformed JSON inside the tags stays content; the good call survives
    ("hermes_json",
     'Calling.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>\n'
     + hermes("get_weather", TOKYO),
     False, "", 'Calling.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
     [("get_weather", TOKYO)]),
    # cut off inside a call (max_tokens): the text stays content
    ("hermes_json", 'Sure.\n<tool_call>\n{"name": "get_weather", "argu', False, "",
     'Sure.\n<tool_call>\n{"name": "get_weather", "argu', []),
    # Qwen3 answering without tools
    ("hermes_json", "<think>\n\n</think>\n\nParis is the capital of France.", False, "",
     "Paris is the capital of France.", []),
    # Llama 3.1: a bare JSON call
    ("llama3_json", json.dumps({"name": "get_weather", "parameters": TOKYO}), False, "", "",
     [("get_weather", TOKYO)]),
    # Llama 3.1: after <|python_tag|>, two calls separated by ';'
    ("llama3_json",
     "<|python_tag|>" + json.dumps({"name": "get_weather", "parameters": PARIS}) + "; "
     + json.dumps({"name": "run_python", "parameters": CODE}, ensure_ascii=False),
     False, "", "", [("get_weather", PARIS), ("run_python", CODE)]),
    # text, then a tagged call; "arguments" accepted for "parameters"; OpenAI-like nesting
    ("llama3_json",
     "Let me look that up.\n<|python_tag|>" + json.dumps({"name": "get_weather", "arguments": PARIS})
     + "\n" + json.dumps({"type": "function", "function": {"name": "get_time", "parameters": {}}}),
     False, "", "Let me look that up.", [("get_weather", PARIS), ("get_time", {})]),
    # a built-in tool call is not JSON: it stays content, tag included
    ("llama3_json", '<|python_tag|>brave_search.call(query="weather in Paris")', False, "",
     '<|python_tag|>brave_search.call(query="weather in Paris")', []),
    # plain answers, JSON answers and JSON-looking text are content
    ("llama3_json", "The capital of France is Paris.", False, "", "The capital of France is Paris.", []),
    ("llama3_json", '{"answer": 42, "name": "x"}', False, "", '{"answer": 42, "name": "x"}', []),
    ("llama3_json", '{"name": "Bob", "age": 3}', False, "", '{"name": "Bob", "age": 3}', []),
    ("llama3_json", 'Use {"name": "f", "parameters": {}} like so.', False, "",
     'Use {"name": "f", "parameters": {}} like so.', []),
    # malformed or cut-off JSON stays content verbatim
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": Paris}}', False, "",
     '{"name": "get_weather", "parameters": {"city": Paris}}', []),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"ci', False, "",
     '<|python_tag|>{"name": "get_weather", "parameters": {"ci', []),
    # a call, then text after it
    ("llama3_json", json.dumps({"name": "get_weather", "parameters": PARIS}) + "\n\nDone.", False, "",
     "Done.", [("get_weather", PARIS)]),
    # Qwen3.6 XML after reasoning (the prompt opened <think>)
    ("qwen_xml",
     "The user wants weather.\n</think>\n\nLet me check.\n\n" + xml("get_weather", city="Paris", days="3"),
     True, "The user wants weather.", "Let me check.", [("get_weather", {"city": "Paris", "days": 3})]),
    # the XML dialect leaves Hermes JSON blocks alone, and the reverse
    ("qwen_xml", hermes("get_weather", PARIS), False, "", hermes("get_weather", PARIS), []),
    ("hermes_json", xml("get_weather", city="Paris"), False, "", xml("get_weather", city="Paris"), []),
]
IDS = [f"{i}-{r[0]}" for i, r in enumerate(RECORDED)]


def collect(deltas: list[ChatDelta]) -> ChatMessageOut:
    return ChatMessageOut(
        reasoning="".join(d.text for d in deltas if d.kind == "reasoning"),
        content="".join(d.text for d in deltas if d.kind == "content"),
        tool_calls=[d.tool_call for d in deltas if d.kind == "tool_call" and d.tool_call is not None],
    )


def summary(out: ChatMessageOut) -> tuple[str, str, list[tuple[str, dict]]]:
    return out.reasoning, out.content, [(c.name, c.arguments) for c in out.tool_calls]


def stream(dialect: str, chunks: list[str], starts: bool) -> list[ChatDelta]:
    parser = ChatStreamParser(starts_in_reasoning=starts, tools=XML_TOOLS, dialect=dialect)
    deltas = [d for chunk in chunks for d in parser.push(chunk)] + parser.finish()
    assert all(d.text for d in deltas if d.kind != "tool_call"), "empty text delta"
    assert all(d.tool_call is not None and not d.text for d in deltas if d.kind == "tool_call")
    return deltas


def random_chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 12)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize(("dialect", "text", "starts", "reasoning", "content", "calls"), RECORDED, ids=IDS)
def test_recorded_output_whole(dialect: str, text: str, starts: bool, reasoning: str, content: str,
                               calls: list[tuple[str, dict]]) -> None:
    out = parse_chat_output(text, starts_in_reasoning=starts, tools=XML_TOOLS, dialect=dialect)
    assert summary(out) == (reasoning, content, calls)
    assert len({c.id for c in out.tool_calls}) == len(calls)
    for call, (_, args) in zip(out.tool_calls, calls):
        assert json.loads(call.arguments_json) == args  # OpenAI: a JSON string; Anthropic: the dict


@pytest.mark.parametrize(("dialect", "text", "starts", "reasoning", "content", "calls"), RECORDED, ids=IDS)
def test_recorded_output_streamed(dialect: str, text: str, starts: bool, reasoning: str, content: str,
                                  calls: list[tuple[str, dict]]) -> None:
    want = (reasoning, content, calls)
    assert summary(collect(stream(dialect, list(text), starts))) == want  # one character at a time
    for i in range(len(text) + 1):
        assert summary(collect(stream(dialect, [text[:i], text[i:]], starts))) == want, i
    rng = random.Random(len(text))
    for _ in range(50):
        chunks = random_chunks(text, rng)
        assert summary(collect(stream(dialect, chunks, starts))) == want, chunks


def test_calls_are_emitted_as_they_complete() -> None:
    first, second = hermes("a", {"x": 1}), hermes("b", {})
    parser = ChatStreamParser(starts_in_reasoning=False, dialect="hermes_json")
    assert parser.push("Checking.\n" + first[:-3]) == [ChatDelta("content", "Checking.")]
    [delta] = parser.push(first[-3:] + "\n" + second[:5])
    assert delta.kind == "tool_call" and delta.tool_call is not None and delta.tool_call.name == "a"
    [delta] = parser.push(second[5:])
    assert delta.tool_call is not None and delta.tool_call.name == "b"
    assert parser.finish() == []

    parser = ChatStreamParser(starts_in_reasoning=False, dialect="llama3_json")
    call = json.dumps({"name": "get_weather", "parameters": PARIS})
    assert parser.push("<|python_tag|>" + call[:-1]) == []
    [delta] = parser.push(call[-1:] + ";")
    assert delta.tool_call is not None and delta.tool_call.arguments == PARIS
    assert parser.finish() == []


def test_llama_content_streams_once_it_cannot_be_a_call() -> None:
    parser = ChatStreamParser(starts_in_reasoning=False, dialect="llama3_json")
    assert parser.push("  ") == []  # leading whitespace (dropped by the reasoning split)
    assert parser.push('{"ans') == []  # a call may be starting
    assert parser.push('wer"') == [ChatDelta("content", '{"answer"')]  # the first key rules it out
    assert parser.push(": 1} <|pyth") == [ChatDelta("content", ": 1}")]  # a tag may be starting
    assert parser.push("on_tag|>x") == [ChatDelta("content", " <|python_tag|>x")]


FUZZ_PARTS = {
    "hermes_json": [
        hermes("f", {"a": "}{"}), hermes("g", {}), "<tool_call>\n{bad}\n</tool_call>", "<tool_call>",
        "</tool_call>", '{"name": "h", "arguments": {}}', "text ", "\n", " ", "<tool", "é",
    ],
    "llama3_json": [
        json.dumps({"name": "f", "parameters": {"a": "}{\\\""}}), '{"name": "g", "arguments": {}}',
        "<|python_tag|>", "; ", "\n", " ", "text", '{"k": 1}', "{", "}", '"', "<|py", "é", ";",
    ],
}


@pytest.mark.parametrize("dialect", sorted(FUZZ_PARTS))
def test_stream_equals_whole_text_on_random_outputs(dialect: str) -> None:
    rng = random.Random(7)
    parts = FUZZ_PARTS[dialect]
    for _ in range(400):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))
        want = summary(parse_chat_output(text, starts_in_reasoning=False, dialect=dialect))
        assert summary(collect(stream(dialect, random_chunks(text, rng), False))) == want, text
        assert summary(collect(stream(dialect, list(text), False))) == want, text


def test_hermes_through_the_detokenizer(qwen_tok: Tokenizer) -> None:
    """Token ids → IncrementalDetokenizer → ChatStreamParser, as LLM.chat_stream runs it."""
    text = ("<think>\nTwo cities.\n</think>\n\nChecking 日本 🌦️.\n\n" + hermes("get_weather", PARIS) + "\n"
            + hermes("get_weather", TOKYO))
    ids = qwen_tok.encode(text)
    detok = IncrementalDetokenizer(qwen_tok)
    parser = ChatStreamParser(starts_in_reasoning=False, dialect="hermes_json")
    deltas = [d for i in ids for d in parser.push(detok.push(i))]
    deltas += parser.push(detok.flush()) + parser.finish()
    assert summary(collect(deltas)) == (
        "Two cities.", "Checking 日本 🌦️.", [("get_weather", PARIS), ("get_weather", TOKYO)]
    )
