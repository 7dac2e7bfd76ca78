"""The tool-call dialect follows the model's chat template on every protocol (issue 29, item 6).

A scripted engine replays a Hermes-style reply (`<tool_call>{json}</tool_call>`, Qwen2.5 / Qwen3)
through a tokenizer whose chat template is a Hermes one; every protocol, streamed and not, must
return a proper tool call, not the tags as text.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ninfer_nb.chat import Tokenizer
from tests.server.conftest import MODEL_ID, anthropic_client, base_config, openai_client
from tests.server.harness import LiveServer
from tests.server.scripted_engine import ScriptedEngine

HERMES_TEMPLATE = (  # the tool branch of the Qwen2.5 / Qwen3 templates, messages kept plain
    "{%- if tools %}<|im_start|>system\n# Tools\n\nYou are provided with function signatures "
    "within <tools></tools> XML tags:\n<tools>{%- for tool in tools %}\n{{ tool | tojson }}"
    "{%- endfor %}\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{{ message.content if message.content is string else '' }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ARGS = {"city": "Paris", "days": 3}
REPLY = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
         + json.dumps(ARGS) + "}\n</tool_call>")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "days": {"type": "integer"}}, "required": ["city"]}
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather",
                                                           "parameters": SCHEMA}}]
FLAT_TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]
ANTHROPIC_TOOLS: list[Any] = [{"name": "get_weather", "input_schema": SCHEMA}]
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def hermes_server(tiny_qwen35_dir: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("hermes_tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json", "config.json"):
        if (tiny_qwen35_dir / name).is_file():
            shutil.copy(tiny_qwen35_dir / name, root / name)
    (root / "chat_template.jinja").write_text(HERMES_TEMPLATE, encoding="utf-8")
    tokenizer = Tokenizer.from_dir(root)
    assert tokenizer.tool_dialect.name == "hermes_json"
    engine = ScriptedEngine(tokenizer, REPLY, model_id=MODEL_ID)
    with LiveServer(engine, base_config(default_max_tokens=200)) as srv:
        yield srv


def test_chat_completions_hermes_call(hermes_server: LiveServer) -> None:
    client = openai_client(hermes_server)
    r = client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=CHAT_TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGS
    assert "<tools>" in hermes_server.engine.prompts[-1]

    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=ASK, tools=CHAT_TOOLS,
                                                 stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in text and text.strip() == "Let me check."
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
        ("get_weather", ARGS)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_responses_hermes_call(hermes_server: LiveServer) -> None:
    client = openai_client(hermes_server)
    r = client.responses.create(model=MODEL_ID, input="Weather in Paris?", tools=FLAT_TOOLS)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == ARGS
    assert "<tool_call>" not in r.output_text

    events = list(client.responses.create(model=MODEL_ID, input="Weather in Paris?",
                                          tools=FLAT_TOOLS, stream=True))
    done = [e for e in events if e.type == "response.completed"][0].response
    streamed = [o for o in done.output if o.type == "function_call"]
    assert len(streamed) == 1 and json.loads(streamed[0].arguments) == ARGS


def test_anthropic_hermes_call(hermes_server: LiveServer) -> None:
    client = anthropic_client(hermes_server)
    msg = client.messages.create(model="m", max_tokens=200, messages=ASK, tools=ANTHROPIC_TOOLS)
    assert msg.stop_reason == "tool_use"
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].input == ARGS

    with client.messages.stream(model="m", max_tokens=200, messages=ASK,
                                tools=ANTHROPIC_TOOLS) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.input for b in final.content if b.type == "tool_use"] == [ARGS]
