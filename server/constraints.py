"""Output constraints a request asks for (structured output, enforced tool calls), compiled.

The protocol parsers read their fields into an `OutputRequest` (which constraint, and the request
field it came from); `compile_output` turns it into a `ninfer_nb.structured.Constraint` for the
engine. Compiling takes milliseconds and building the grammar's view of the tokenizer seconds, so
both run on the PromptBuilder's threads, never on the event loop or the engine thread. A spec
the grammar library cannot enforce is a 400 naming the field. Knows no HTTP and no protocol
shapes beyond the tool list and tool_choice values the structured package reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer_nb.chat import prompt_opens_reasoning
from ninfer_nb.structured import Constraint, ConstraintError, compile_constraint, grammar_tokenizer

from .engine import ChatEngine, Tool
from .errors import BadRequest


@dataclass(frozen=True)
class OutputRequest:
    kind: str   # a ninfer_nb.structured kind: json_object, json_schema or tool_calls
    spec: Any   # the schema, or {"tools", "tool_choice", "parallel_tool_calls"}
    param: str  # the request field it came from (named in a 400)


def json_format(kind: Any, schema: Any, param: str) -> OutputRequest | None:
    """A response format's type and schema (None for plain text); others are a 400."""
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return OutputRequest("json_object", None, param)
    if kind == "json_schema":
        if not isinstance(schema, dict):
            raise BadRequest(f"{param} needs a JSON schema object", param=param)
        return OutputRequest("json_schema", schema, param)
    raise BadRequest(f"{param}.type must be text, json_object or json_schema, got {kind!r}",
                     param=f"{param}.type")


def tool_grammar(tools: list[Tool] | None, choice: str, parallel: bool,
                 param: str) -> OutputRequest | None:
    """Enforced calls for tool_choice `required` (tools already narrowed to a named one) or
    `auto` with parallel calls off; None when the model is free (auto, parallel allowed)."""
    if not tools or (choice == "auto" and parallel):
        return None
    spec = {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel}
    return OutputRequest("tool_calls", spec, param)


def one_of(fmt: OutputRequest | None, tools: list[Tool] | None,
           calls: OutputRequest | None) -> OutputRequest | None:
    """The JSON format or the enforced calls. A JSON format leaves no room for tool calls, so
    it with tools offered (tool_choice other than none) is a 400 rather than tools ignored."""
    if fmt is not None and tools:
        raise BadRequest(f"a JSON output format ({fmt.param}) cannot be combined with tools "
                         "(unless tool_choice is none)", param=fmt.param)
    return fmt or calls


def vocab_size(engine: ChatEngine) -> int | None:
    """The logits' width (the model's vocabulary, padding included) when the engine says."""
    cfg = getattr(engine, "model_config", None)
    return getattr(cfg, "vocab_size", None)


def warm_grammar(engine: ChatEngine) -> None:
    """Build the grammar's view of the tokenizer (seconds at 248K ids) once, ahead of requests."""
    grammar_tokenizer(engine.tokenizer, vocab_size(engine))  # type: ignore[arg-type]


def compile_output(engine: ChatEngine, want: OutputRequest, prompt_text: str) -> Constraint:
    """The compiled constraint; free text may run to `</think>` first when the prompt opened a
    think block. A spec that cannot be enforced is a 400 naming `want.param`, and so is any
    constraint for an engine that cannot take one (a test double without `stream`)."""
    if getattr(engine, "stream", None) is None:
        raise BadRequest(f"{want.param}: this engine cannot enforce output constraints",
                         param=want.param, code="invalid_constraint")
    try:
        return compile_constraint(want.kind, want.spec, engine.tokenizer,  # type: ignore[arg-type]
                                  vocab_size=vocab_size(engine),
                                  reasoning_open=prompt_opens_reasoning(prompt_text))
    except ConstraintError as exc:
        raise BadRequest(f"{want.param}: {exc.message}", param=want.param,
                         code="invalid_constraint") from None
