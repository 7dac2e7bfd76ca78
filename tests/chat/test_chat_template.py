from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from ninfer_nb.chat import DEFAULT_CHATML_TEMPLATE, ChatFormatter, Tokenizer, format_chat, render_chat
from ninfer_nb.errors import InvalidRequestError
from tests.support.qwen_tokenizer import chat_template_text

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo d'une ville",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]

TOOL_HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and the time?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": "I need two tools.",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
            {"id": "b", "type": "function", "function": {"name": "now", "arguments": {}}},
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "sunny"},
    {"role": "tool", "tool_call_id": "b", "content": "12:00"},
]

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi 😀"}],
    TOOL_HISTORY,
    [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\na1"},
        {"role": "user", "content": [{"type": "text", "text": "q2 "}, {"type": "image"}, {"type": "text", "text": "see"}]},
        {"role": "assistant", "content": "a2", "reasoning_content": "new thoughts"},
    ],
]


def oracle(messages: list[dict], **kwargs) -> str:
    """transformers' own renderer is the reference for Hugging Face template semantics."""
    rendered, _ = render_jinja_template([messages], chat_template=chat_template_text(), **kwargs)
    return rendered[0]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("with_tools", [True, False])
def test_matches_transformers(index: int, thinking: bool, with_tools: bool) -> None:
    messages = CONVERSATIONS[index]
    tools = TOOLS if with_tools else None
    ours = render_chat(chat_template_text(), messages, tools=tools, enable_thinking=thinking)
    assert ours == oracle(messages, tools=tools, add_generation_prompt=True, enable_thinking=thinking)


def test_generation_prompt_thinking_on_and_off(qwen_tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    on = format_chat(qwen_tok, messages)
    off = format_chat(qwen_tok, messages, enable_thinking=False)
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert off == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    bare = format_chat(qwen_tok, messages, add_generation_prompt=False)
    assert bare == "<|im_start|>user\nhi<|im_end|>\n"


def test_tools_block_and_tool_history(qwen_tok: Tokenizer) -> None:
    text = format_chat(qwen_tok, TOOL_HISTORY, tools=TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n")
    # one JSON object per line, non-ASCII kept (HF tojson: ensure_ascii=False)
    assert '\n{"type": "function", "function": {"name": "get_weather", "description": "Météo d\'une ville"' in text
    assert "</tools>\n\nIf you choose to call a function" in text and "</IMPORTANT>\n\nBe brief.<|im_end|>" in text
    assert (
        "<|im_start|>assistant\n<think>\nI need two tools.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=now>\n</function>\n</tool_call><|im_end|>\n"
    ) in text
    # consecutive tool results share one user turn
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert text.count("<|im_start|>user") == 2


def test_reasoning_kept_only_after_last_query(qwen_tok: Tokenizer) -> None:
    text = format_chat(qwen_tok, CONVERSATIONS[3], add_generation_prompt=False)
    assert "old thoughts" not in text
    assert "<|im_start|>assistant\na1<|im_end|>" in text
    assert "<|im_start|>assistant\n<think>\nnew thoughts\n</think>\n\na2<|im_end|>" in text
    assert "q2 <|vision_start|><|image_pad|><|vision_end|>see" in text


def test_openai_shaped_history_is_accepted(qwen_tok: Tokenizer) -> None:
    as_string = [dict(m) for m in TOOL_HISTORY]
    as_string[2] = {
        **TOOL_HISTORY[2],
        "reasoning_content": None,
        "reasoning": "I need two tools.",
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}},
            {"id": "b", "type": "function", "function": {"name": "now", "arguments": ""}},
        ],
    }
    assert format_chat(qwen_tok, as_string, tools=TOOLS) == format_chat(qwen_tok, TOOL_HISTORY, tools=TOOLS)
    assert as_string[2]["reasoning_content"] is None  # the caller's messages are not modified
    bad = [dict(m) for m in as_string]
    bad[2] = {**as_string[2], "tool_calls": [{"function": {"name": "now", "arguments": "{oops"}}]}
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        format_chat(qwen_tok, bad, tools=TOOLS)


def test_prompt_tokenizes_with_single_special_ids(qwen_tok: Tokenizer) -> None:
    ids = ChatFormatter(qwen_tok).encode([{"role": "user", "content": "hi"}])
    assert ids[0] == 248045 and ids[-2:] == [248068, 198]  # "<think>", "\n"
    assert qwen_tok.decode(ids) == format_chat(qwen_tok, [{"role": "user", "content": "hi"}])


def test_template_errors_become_invalid_request(qwen_tok: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError, match="No user query found in messages."):
        format_chat(qwen_tok, [{"role": "system", "content": "s"}])
    with pytest.raises(InvalidRequestError, match="Unexpected message role: robot"):
        format_chat(qwen_tok, [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    with pytest.raises(InvalidRequestError, match="syntax"):
        render_chat("{% for %}", [{"role": "user", "content": "a"}])
    with pytest.raises(InvalidRequestError):
        render_chat("{{ messages[0].content.nope() }}", [{"role": "user", "content": "a"}])
    with pytest.raises(InvalidRequestError):  # the sandbox refuses attribute escapes
        render_chat("{{ ''.__class__.__mro__ }}", [{"role": "user", "content": "a"}])


@pytest.mark.parametrize(
    "messages",
    [[], "hello", [{"content": "no role"}], [{"role": 3, "content": "x"}], ["user: hi"], None],
)
def test_message_validation(qwen_tok: Tokenizer, messages) -> None:
    with pytest.raises(InvalidRequestError):
        format_chat(qwen_tok, messages)


def test_tools_validation(qwen_tok: Tokenizer) -> None:
    with pytest.raises(InvalidRequestError, match="tools"):
        format_chat(qwen_tok, [{"role": "user", "content": "a"}], tools=["get_weather"])


def test_hf_filters_and_globals() -> None:
    msgs = [{"role": "user", "content": "é"}]
    assert render_chat("{{ messages[0] | tojson }}", msgs) == '{"role": "user", "content": "é"}'
    assert render_chat("{{ messages[0] | tojson(indent=2) }}", msgs) == '{\n  "role": "user",\n  "content": "é"\n}'
    assert render_chat("{{ '<b>' | tojson }}", msgs) == '"<b>"'  # no HTML escaping
    assert len(render_chat("{{ strftime_now('%Y-%m-%d') }}", msgs)) == 10
    looped = "{% for m in [1, 2, 3] %}{% if m == 2 %}{% continue %}{% endif %}{{ m }}{% endfor %}"
    assert render_chat(looped, msgs) == "13"
    assert render_chat("  {% if true %}\nx{% endif %}", msgs) == "x"  # trim_blocks + lstrip_blocks
    assert render_chat("{{ bos_token }}{{ eos_token }}{{ custom }}", msgs, bos_token="<s>", eos_token="</s>", custom=7) == "<s></s>7"


def test_default_chatml_template() -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import WordLevel

    tok = Tokenizer(Backend(WordLevel({"[UNK]": 0}, unk_token="[UNK]")), eos_token_ids=[0])
    text = format_chat(tok, [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert text == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(DEFAULT_CHATML_TEMPLATE, [{"role": "user", "content": "x"}], add_generation_prompt=False) == (
        "<|im_start|>user\nx<|im_end|>\n"
    )
