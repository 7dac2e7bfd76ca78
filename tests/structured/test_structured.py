"""Structured output at the real Qwen3.5/3.6 vocabulary: a random "model" constrained by each kind
of constraint always writes valid output; the host bitmask reference masks exactly.

The random model samples uniformly among the allowed ids; after `budget` tokens it ends at EOS as
soon as that is allowed and otherwise prefers the allowed ids of a few closing strings (quotes,
brackets, tag ends), so that unbounded grammars (json_object, repeated calls) finish. The tokenizer's grammar view is built once per module.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from ninfer_nb.chat import Tokenizer, get_dialect
from ninfer_nb.structured import (
    ConstraintError,
    ConstraintViolation,
    Matcher,
    allowed_token_ids,
    apply_token_bitmask,
    bitmask_words,
    compile_constraint,
    fill_batch_bitmask,
    grammar_tokenizer,
)
from tests.support.qwen_tokenizer import write_qwen_tokenizer_files

MODEL_VOCAB = 248320  # the checkpoints' padded logits width, wider than the tokenizer's 248077

ISSUE_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "priority": {"type": "string", "enum": ["low", "medium", "high"]},
        "assignees": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "role": {"type": "string", "enum": ["owner", "reviewer"]},
                },
                "required": ["name", "role"],
                "additionalProperties": False,
            },
        },
        "due": {
            "type": "object",
            "properties": {
                "month": {"type": "integer", "minimum": 1, "maximum": 12},
                "day": {"type": "integer", "minimum": 1, "maximum": 31},
            },
            "required": ["month", "day"],
            "additionalProperties": False,
        },
        "blocking": {"type": "boolean"},
    },
    "required": ["title", "priority", "assignees", "due"],
    "additionalProperties": False,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "options": {
                    "type": "object",
                    "properties": {"hourly": {"type": "boolean"}, "fields": {"type": "array", "items": {"type": "string", "enum": ["wind", "rain"]}}},
                    "required": ["hourly"],
                    "additionalProperties": False,
                },
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
SEARCH_TOOL = {
    "name": "search",  # flat shape
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string", "maxLength": 25}, "limit": {"type": "integer", "minimum": 1}},
        "required": ["query"],
        "additionalProperties": False,
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
CLOSERS = ('"', "}", "]", '"}', "\n", "</", "parameter", ">", "\n</parameter>\n", "</function>\n")


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path: Path = tmp_path_factory.mktemp("qwen_tokenizer")
    write_qwen_tokenizer_files(path)
    tok = Tokenizer.from_dir(path)
    grammar_tokenizer(tok, MODEL_VOCAB)  # the slow part, once
    return tok


def random_walk(matcher: Matcher, tok: Tokenizer, seed: int, *, budget: int = 60, limit: int = 600) -> str:
    """Text a uniformly random model writes under `matcher` (EOS ends it); asserts it ends."""
    rng = np.random.default_rng(seed)
    closers = {i for s in CLOSERS for i in tok.encode(s)}
    out: list[int] = []
    for step in range(limit):
        allowed = allowed_token_ids(matcher.allowed_tokens(), MODEL_VOCAB)
        assert allowed.size > 0
        assert allowed.max() < tok.vocab_size  # padding ids are never allowed
        preferred = [i for i in allowed if i in closers] if step >= budget else []
        if step >= budget and any(i in allowed for i in tok.eos_token_ids):
            preferred = list(tok.eos_token_ids[:1])
        token = int(rng.choice(preferred if preferred else allowed))
        if token in tok.eos_token_ids:
            assert matcher.is_accepting()
            return tok.decode(out)
        matcher.advance(token)
        out.append(token)
    raise AssertionError(f"no EOS after {limit} tokens: {tok.decode(out)!r}")


@pytest.mark.parametrize("seed", range(4))
def test_json_schema_random_model_validates(qwen_tok, seed):
    constraint = compile_constraint("json_schema", ISSUE_SCHEMA, qwen_tok, vocab_size=MODEL_VOCAB)
    text = random_walk(constraint.matcher(), qwen_tok, seed)
    jsonschema.validate(json.loads(text), ISSUE_SCHEMA)


@pytest.mark.parametrize("seed", range(3))
def test_json_object_random_model_yields_object(qwen_tok, seed):
    constraint = compile_constraint("json_object", None, qwen_tok, vocab_size=MODEL_VOCAB)
    assert isinstance(json.loads(random_walk(constraint.matcher(), qwen_tok, seed)), dict)


def _tool_schema(name: str) -> dict:
    tool = next(t for t in TOOLS if (t.get("function") or t)["name"] == name)
    return (tool.get("function") or tool)["parameters"]


@pytest.mark.parametrize("dialect", ["qwen_xml", "hermes_json", "llama3_json"])
@pytest.mark.parametrize(
    "tool_choice, parallel, seed",
    [("required", True, 0), ("required", False, 1), ({"type": "function", "function": {"name": "get_weather"}}, True, 2)],
)
def test_tool_call_random_model_yields_valid_calls(qwen_tok, dialect, tool_choice, parallel, seed):
    spec = {"tools": TOOLS, "tool_choice": tool_choice, "parallel_tool_calls": parallel, "dialect": dialect}
    constraint = compile_constraint("tool_calls", spec, qwen_tok, vocab_size=MODEL_VOCAB)
    text = random_walk(constraint.matcher(), qwen_tok, seed, budget=80)
    content, calls = get_dialect(dialect).parse(text, TOOLS)
    assert content.strip() == "", text
    assert len(calls) >= 1 and (parallel or len(calls) == 1), text
    for call in calls:
        if isinstance(tool_choice, dict):
            assert call.name == "get_weather"
        jsonschema.validate(call.arguments, _tool_schema(call.name))


def test_tool_choice_auto_allows_text_then_one_call(qwen_tok):
    spec = {"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False}  # template's dialect
    matcher = compile_constraint("tool_calls", spec, qwen_tok).matcher()
    call = "<tool_call>\n<function=search>\n<parameter=query>\nrain\n</parameter>\n</function>\n</tool_call>"
    for token in qwen_tok.encode("Let me look.\n" + call):
        matcher.advance(token)
    assert matcher.is_finished()  # a second call is not allowed
    with pytest.raises(ConstraintViolation):
        matcher.advance(qwen_tok.encode("\n")[0])


def test_llama3_auto_is_text_or_calls(qwen_tok):
    spec = {"tools": TOOLS, "tool_choice": "auto", "dialect": "llama3_json"}
    constraint = compile_constraint("tool_calls", spec, qwen_tok)
    for text in ("Sure, it is sunny.", '{"name": "search", "parameters": {"query": "rain"}}'):
        matcher = constraint.matcher()
        for token in qwen_tok.encode(text):
            matcher.advance(token)
        assert matcher.is_accepting()
    matcher = constraint.matcher()
    for token in qwen_tok.encode('{"name": "search", "parameters": {'):
        matcher.advance(token)
    with pytest.raises(ConstraintViolation):  # the call is held to the tool's schema
        for token in qwen_tok.encode('"nope": 1'):
            matcher.advance(token)


def test_reasoning_open_constrains_after_think(qwen_tok):
    matcher = compile_constraint("choice", ["yes", "no"], qwen_tok, reasoning_open=True).matcher()
    think_close = qwen_tok.token_to_id("</think>")
    for token in qwen_tok.encode("The sky is blue, so") + [think_close] + qwen_tok.encode("\n\nyes"):
        matcher.advance(token)
    assert matcher.is_finished()


def test_rollback_restores_the_mask(qwen_tok):
    matcher = compile_constraint("json_schema", ISSUE_SCHEMA, qwen_tok, vocab_size=MODEL_VOCAB).matcher()
    prefix = qwen_tok.encode('{"title": "x", "priority": "')
    for token in prefix[:2]:
        matcher.advance(token)
    before = matcher.allowed_tokens()
    for token in prefix[2:]:
        matcher.advance(token)
    assert not np.array_equal(matcher.allowed_tokens(), before)
    matcher.rollback(len(prefix) - 2)
    assert np.array_equal(matcher.allowed_tokens(), before)
    assert matcher.accepted_prefix(prefix[2:]) == len(prefix) - 2


def test_constraints_are_cached_and_bad_specs_refused(qwen_tok):
    a = compile_constraint("json_schema", ISSUE_SCHEMA, qwen_tok, vocab_size=MODEL_VOCAB)
    assert compile_constraint("json_schema", ISSUE_SCHEMA, qwen_tok, vocab_size=MODEL_VOCAB) is a
    assert a.matcher().allowed_tokens().shape == (bitmask_words(MODEL_VOCAB),)
    named_missing = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}
    for kind, spec in [("tool_calls", named_missing), ("regex", "a("), ("json_schema", [1]), ("yaml", None)]:
        with pytest.raises(ConstraintError):
            compile_constraint(kind, spec, qwen_tok)


def test_batch_bitmask_matches_each_row(qwen_tok):
    schema = compile_constraint("json_schema", ISSUE_SCHEMA, qwen_tok, vocab_size=MODEL_VOCAB)
    obj = compile_constraint("json_object", None, qwen_tok, vocab_size=MODEL_VOCAB)
    a, b, c = schema.matcher(), obj.matcher(), schema.matcher()
    for token in qwen_tok.encode('{"title": "Fix'):
        a.advance(token)
    for token in qwen_tok.encode('{"x": [1, '):
        b.advance(token)
    out = np.zeros((4, bitmask_words(MODEL_VOCAB)), dtype=np.int32)
    fill_batch_bitmask([a, None, b, c], out)
    for row, matcher in zip(out[[0, 2, 3]], (a, b, c)):
        np.testing.assert_array_equal(row, matcher.allowed_tokens())
    assert np.all(out[1] == -1)
    assert not np.array_equal(out[0], out[3])


@pytest.mark.parametrize("vocab", [MODEL_VOCAB, 1000, 33])
def test_apply_token_bitmask_masks_exactly_the_disallowed_ids(vocab):
    rng = np.random.default_rng(vocab)
    bitmask = rng.integers(-(2**31), 2**31, size=bitmask_words(vocab), dtype=np.int64).astype(np.int32)
    logits = rng.standard_normal(vocab).astype(np.float32)
    ids = np.arange(vocab)
    allowed = ((bitmask[ids >> 5].astype(np.int64) >> (ids & 31)) & 1).astype(bool)
    masked = apply_token_bitmask(logits, bitmask)
    assert masked.dtype == np.float32 and masked.shape == logits.shape
    np.testing.assert_array_equal(masked[allowed], logits[allowed])
    assert np.all(np.isneginf(masked[~allowed]))
    np.testing.assert_array_equal(allowed_token_ids(bitmask, vocab), ids[allowed])
    batch = apply_token_bitmask(np.stack([logits, logits]), np.stack([bitmask, ~bitmask]))
    assert np.all(np.isneginf(batch[1][allowed])) and np.all(batch[1][~allowed] == logits[~allowed])
