"""Structured output: grammar constraints (JSON, JSON schema, regex, choice, enforced tool calls)
compiled with llguidance, a per-request `Matcher` yielding int32 token bitmasks, and the NumPy
reference that applies a bitmask to logits. Knows nothing about the engine or the server."""
from __future__ import annotations

from ninfer_nb.structured.bitmask import (
    allocate_bitmask,
    allowed_token_ids,
    apply_token_bitmask,
    bitmask_words,
)
from ninfer_nb.structured.constraint import (
    KINDS,
    Constraint,
    ConstraintError,
    ConstraintViolation,
    GrammarTokenizer,
    Matcher,
    compile_constraint,
    fill_batch_bitmask,
    grammar_tokenizer,
)

__all__ = [
    "KINDS",
    "Constraint",
    "ConstraintError",
    "ConstraintViolation",
    "GrammarTokenizer",
    "Matcher",
    "allocate_bitmask",
    "allowed_token_ids",
    "apply_token_bitmask",
    "bitmask_words",
    "compile_constraint",
    "fill_batch_bitmask",
    "grammar_tokenizer",
]
