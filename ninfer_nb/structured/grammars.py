"""Lark grammars (llguidance's dialect) for the output constraints a request can ask for.

Each builder returns the rules of a grammar whose top rule is `body`; `wrap_start` adds the
`start` rule, optionally after an open reasoning block (the prompt ended with `<think>`, so the
output is free text up to `</think>` and the constraint applies after it). Markers that are
single added tokens (`<tool_call>`, `</think>`) are written as token ids, so plain text can never
spell them. This module knows nothing about tokenizers beyond `MarkerIds`, nor about matching.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Sequence

import llguidance

__all__ = [
    "MarkerIds",
    "choice_rules",
    "json_object_rules",
    "json_schema_rules",
    "lark_marker",
    "lark_string",
    "regex_rules",
    "wrap_start",
]

MarkerIds = Callable[[str], "int | None"]  # text → its single added-token id, else None

THINK_CLOSE = "</think>"
# Whitespace between JSON tokens: enough for pretty-printed output, bounded so that a model stuck
# emitting whitespace cannot run away (llguidance's default is unbounded).
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,48}"}


def lark_string(text: str) -> str:
    """A Lark string literal matching `text` exactly (Lark literals escape like JSON)."""
    return json.dumps(text, ensure_ascii=False)


def lark_marker(text: str, marker_ids: MarkerIds) -> str:
    """`<[id]>` when `text` is one added token, else the literal text."""
    token_id = marker_ids(text)
    return f"<[{token_id}]>" if token_id is not None else lark_string(text)


def lark_json(schema: Any) -> str:
    """An inline JSON-schema rule, with `JSON_OPTIONS` unless the schema sets its own."""
    if isinstance(schema, dict) and "x-guidance" not in schema:
        schema = {**schema, "x-guidance": JSON_OPTIONS}
    return "%json " + json.dumps(schema, ensure_ascii=False)


def json_object_rules() -> list[str]:
    return ["body: " + lark_json({"type": "object"})]


def json_schema_rules(schema: dict) -> list[str]:
    return ["body: " + lark_json(schema)]


def regex_rules(regex: str) -> list[str]:
    return ["body: BODY_RE", f"BODY_RE: /{llguidance.regex_to_lark(regex)}/"]


def choice_rules(choices: Sequence[str]) -> list[str]:
    if not choices:
        raise ValueError("a choice constraint needs at least one choice")
    return ["body: " + " | ".join(lark_string(c) for c in choices)]


def wrap_start(rules: list[str], marker_ids: MarkerIds, *, reasoning_open: bool = False) -> str:
    """The whole grammar: `start` → `body`, after free text and `</think>` when reasoning is open."""
    if reasoning_open:
        close_id = marker_ids(THINK_CLOSE)
        if close_id is None:  # a text `</think>` could not end the free text's greedy lexeme
            raise ValueError(f"reasoning_open needs {THINK_CLOSE} to be one token of the vocabulary")
        start = f"start: REASONING <[{close_id}]> AFTER_REASONING body"
        extra = ["REASONING: /(?s:.*)/", r"AFTER_REASONING: /[ \t\r\n]*/"]
    else:
        start, extra = "start: body", []
    return "\n".join([start, *rules, *extra]) + "\n"
