from __future__ import annotations

import random

import pytest

from ninfer_nb.chat import (
    ChatDelta,
    ChatMessageOut,
    ChatStreamParser,
    IncrementalDetokenizer,
    Tokenizer,
    format_chat,
    parse_chat_output,
    prompt_opens_reasoning,
)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]

CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
OUTPUTS = [
    ("The user wants weather. 🌦️\n</think>\n\nLet me check.\n\n" + CALL, True),
    ("Thinking about <tool_call> inside reasoning\n</think>\n\n" + CALL + "\n" + CALL, True),
    ("Just an answer with 日本語.", False),
    ("<think>\nshort\n</think>\n\nAnswer <b>bold</b> <tool", False),
    ("cut off while thinking", True),
]


def collect(deltas: list[ChatDelta]) -> ChatMessageOut:
    return ChatMessageOut(
        reasoning="".join(d.text for d in deltas if d.kind == "reasoning"),
        content="".join(d.text for d in deltas if d.kind == "content"),
        tool_calls=[d.tool_call for d in deltas if d.kind == "tool_call" and d.tool_call is not None],
    )


def same(a: ChatMessageOut, b: ChatMessageOut) -> bool:
    def key(m: ChatMessageOut) -> tuple:
        return m.reasoning, m.content, [(c.name, c.arguments) for c in m.tool_calls]

    return key(a) == key(b)


def test_parse_chat_output() -> None:
    out = parse_chat_output(OUTPUTS[0][0], starts_in_reasoning=True, tools=TOOLS)
    assert out.reasoning == "The user wants weather. 🌦️"
    assert out.content == "Let me check."
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("get_weather", {"city": "Paris", "days": 3})]
    out = parse_chat_output(OUTPUTS[1][0], starts_in_reasoning=True)
    assert "<tool_call>" in out.reasoning and len(out.tool_calls) == 2 and out.content == ""
    out = parse_chat_output(OUTPUTS[3][0], starts_in_reasoning=False)
    assert (out.reasoning, out.content, out.tool_calls) == ("short", "Answer <b>bold</b> <tool", [])


@pytest.mark.parametrize("text,starts", OUTPUTS)
def test_stream_equals_non_streaming_on_random_chunkings(text: str, starts: bool) -> None:
    want = parse_chat_output(text, starts_in_reasoning=starts, tools=TOOLS)
    rng = random.Random(len(text))
    for _ in range(150):
        cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 10)))
        parser = ChatStreamParser(starts_in_reasoning=starts, tools=TOOLS)
        deltas = [d for a, b in zip([0] + cuts, cuts + [len(text)]) for d in parser.push(text[a:b])]
        deltas += parser.finish()
        assert same(collect(deltas), want), cuts
        kinds = [d.kind for d in deltas]
        assert "reasoning" not in kinds[kinds.index("content"):] if "content" in kinds else True
    assert parser.finish() == []
    with pytest.raises(RuntimeError):
        parser.push("more")


def test_token_by_token_pipeline(qwen_tok: Tokenizer) -> None:
    """ids → IncrementalDetokenizer → ChatStreamParser, as the server runs it."""
    prompt = format_chat(qwen_tok, [{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
    assert prompt_opens_reasoning(prompt)
    for text, starts in OUTPUTS:
        ids = qwen_tok.encode(text + "<|im_end|>")
        detok = IncrementalDetokenizer(qwen_tok, skip_special_tokens=True)
        parser = ChatStreamParser(starts_in_reasoning=starts, tools=TOOLS)
        deltas: list[ChatDelta] = []
        for token_id in ids:
            deltas += parser.push(detok.push(token_id))
        deltas += parser.push(detok.flush()) + parser.finish()
        assert same(collect(deltas), parse_chat_output(text, starts_in_reasoning=starts, tools=TOOLS))
        assert [d for d in deltas if d.kind == "tool_call"] == [d for d in deltas if d.tool_call is not None]


def test_prompt_opens_reasoning(qwen_tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert prompt_opens_reasoning(format_chat(qwen_tok, messages))
    assert not prompt_opens_reasoning(format_chat(qwen_tok, messages, enable_thinking=False))
    assert not prompt_opens_reasoning("<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n")
    assert not prompt_opens_reasoning("")
