"""Compile an output constraint once, then follow it per request with a `Matcher` (llguidance).

`compile_constraint(kind, spec, tokenizer)` → `Constraint`, cached by (kind, spec, options) per
tokenizer; the tokenizer's grammar-side view (`GrammarTokenizer`, seconds to build at the 248K
Qwen vocabulary) is built once per tokenizer and vocabulary size. Kinds and their spec:

- `json_object`: spec ignored; any JSON object.
- `json_schema`: the schema (a dict); the output is JSON valid against it.
- `regex`: a regular expression (Rust `regex` syntax) the whole output matches.
- `choice`: a list of strings; the output is one of them.
- `tool_calls`: `{"tools": [...], "tool_choice": ..., "parallel_tool_calls": bool,
  "dialect": "qwen_xml" | "hermes_json" | None}` (None: the tokenizer's chat template's dialect);
  see tool_grammars.

`reasoning_open=True` lets free text run up to `</think>` first (the prompt opened a think block).
A `Matcher` gives the int32 bitmask [ceil(V/32)] of the next step's allowed ids and advances by the
sampled id; EOS is allowed exactly where the grammar may end. `fill_batch_bitmask` fills a batch's
rows [B, words] in parallel (unconstrained rows all ones). This module knows nothing about
sampling, batching or the server's request fields.
"""
from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import llguidance
import numpy as np

from ninfer_nb.chat.tokenizer import Tokenizer
from ninfer_nb.errors import NinferError
from ninfer_nb.structured.bitmask import bitmask_words
from ninfer_nb.structured.grammars import (
    choice_rules,
    json_object_rules,
    json_schema_rules,
    regex_rules,
    wrap_start,
)
from ninfer_nb.structured.tool_grammars import tool_call_rules

__all__ = [
    "KINDS",
    "Constraint",
    "ConstraintError",
    "ConstraintViolation",
    "GrammarTokenizer",
    "Matcher",
    "compile_constraint",
    "fill_batch_bitmask",
    "grammar_tokenizer",
]

KINDS = ("json_object", "json_schema", "regex", "choice", "tool_calls")
_CACHE_SIZE = 256


class ConstraintError(NinferError):
    """The request's schema / grammar / tool_choice cannot be compiled into a constraint."""

    code = "invalid_constraint"
    http_status = 400


class ConstraintViolation(RuntimeError):
    """A token the constraint's mask did not allow was fed to `Matcher.advance`."""


@dataclass(eq=False)
class GrammarTokenizer:
    """A tokenizer as the grammar library sees it, plus the compiled-constraint cache."""

    tokenizer: Tokenizer
    vocab_size: int  # the logits' width: >= the tokenizer's, padding ids never allowed
    ll: llguidance.LLTokenizer
    _cache: OrderedDict = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def marker_id(self, text: str) -> int | None:
        """The id of `text` when it is one special (added) token, else None."""
        ids = self.tokenizer.encode(text)
        if len(ids) == 1 and self.ll.is_special_token(ids[0]) and self.tokenizer.decode(ids) == text:
            return ids[0]
        return None


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


def grammar_tokenizer(tokenizer: Tokenizer, vocab_size: int | None = None) -> GrammarTokenizer:
    """The grammar library's view of `tokenizer` for logits of width `vocab_size` (built once)."""
    width = max(vocab_size or 0, tokenizer.vocab_size)
    with _TOKENIZERS_LOCK:
        per_width = _TOKENIZERS.setdefault(tokenizer, {})
        if width not in per_width:
            ll = llguidance.LLTokenizer(
                tokenizer.backend.to_str(), n_vocab=width, eos_token=list(tokenizer.eos_token_ids)
            )
            per_width[width] = GrammarTokenizer(tokenizer, width, ll)
        return per_width[width]


class Matcher:
    """One request's position in a constraint: mask the next step, advance by the sampled id."""

    def __init__(self, constraint: Constraint, ll_matcher: llguidance.LLMatcher) -> None:
        self.constraint = constraint
        self._m = ll_matcher
        self.words = bitmask_words(constraint.vocab_size)

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Write the allowed ids into `out`, a C-contiguous int32 row [words] (e.g. a batch row)."""
        if out.dtype != np.int32 or out.shape != (self.words,) or not out.flags["C_CONTIGUOUS"]:
            raise ValueError(f"bitmask row must be C-contiguous int32 [{self.words}]")
        self._m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def allowed_tokens(self) -> np.ndarray:
        """int32 bitmask [ceil(V/32)] of the ids allowed next."""
        out = np.empty(self.words, dtype=np.int32)
        self.fill_bitmask(out)
        return out

    def advance(self, token_id: int) -> None:
        """Consume a sampled id; raises `ConstraintViolation` when the grammar does not allow it."""
        if not self._m.consume_token(int(token_id)):
            raise ConstraintViolation(self._m.get_error() or f"token {token_id} not allowed")

    def accepted_prefix(self, token_ids: list[int]) -> int:
        """How many leading ids of a draft the grammar accepts now (speculative decoding)."""
        return self._m.validate_tokens([int(t) for t in token_ids])

    def forced_tokens(self) -> list[int]:
        """Ids the grammar forces next, whatever the model says (may be empty)."""
        return list(self._m.compute_ff_tokens())

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` advances (rejected speculative tokens)."""
        if not self._m.rollback(int(num_tokens)):
            raise ConstraintViolation(self._m.get_error() or f"cannot roll back {num_tokens} tokens")

    def is_accepting(self) -> bool:
        """The output so far is complete: EOS is allowed now."""
        return self._m.is_accepting()

    def is_finished(self) -> bool:
        """Nothing but EOS may follow (or EOS was consumed)."""
        return self._m.is_stopped()


_EXECUTOR: list[llguidance.LLExecutor] = []  # one thread pool per process, made on first use


def fill_batch_bitmask(rows: Sequence[Matcher | None], out: np.ndarray) -> None:
    """Masks for a batch: `out` [B, words] int32, row b from `rows[b]` (None: all allowed).

    The constrained rows are computed in parallel on llguidance's thread pool, so one slow
    grammar step does not serialize the others."""
    if out.dtype != np.int32 or out.ndim != 2 or out.shape[0] != len(rows) or not out.flags["C_CONTIGUOUS"]:
        raise ValueError(f"batch bitmask must be C-contiguous int32 [{len(rows)}, words]")
    work: list[tuple[Matcher, int]] = []
    for b, matcher in enumerate(rows):
        if matcher is None:
            out[b] = -1
        elif matcher.words != out.shape[1]:
            raise ValueError(f"row {b}: matcher masks {matcher.words} words, the batch {out.shape[1]}")
        else:
            work.append((matcher, b))
    if len(work) == 1:
        matcher, b = work[0]
        matcher.fill_bitmask(out[b])
    elif work:
        if not _EXECUTOR:
            _EXECUTOR.append(llguidance.LLExecutor())
        pairs = [(m._m, b) for m, b in work]
        _EXECUTOR[0].unsafe_compute_mask_ptr(pairs, out.ctypes.data, out.shape[1] * 4, out.shape[0])


@dataclass(frozen=True, eq=False)
class Constraint:
    """A compiled grammar for one tokenizer; `matcher()` starts a request at its beginning."""

    kind: str
    grammar: str  # llguidance Lark text
    tokenizer: GrammarTokenizer
    _template: llguidance.LLMatcher

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def matcher(self) -> Matcher:
        return Matcher(self, self._template.deep_copy())


def _rules(kind: str, spec: Any, gtok: GrammarTokenizer) -> list[str]:
    if kind == "json_object":
        return json_object_rules()
    if kind == "json_schema":
        if not isinstance(spec, dict):
            raise ValueError("json_schema needs the schema as a JSON object")
        return json_schema_rules(spec)
    if kind == "regex":
        if not isinstance(spec, str):
            raise ValueError("regex needs the pattern as a string")
        return regex_rules(spec)
    if kind == "choice":
        if not isinstance(spec, (list, tuple)) or not all(isinstance(c, str) for c in spec):
            raise ValueError("choice needs a list of strings")
        return choice_rules(spec)
    if kind == "tool_calls":
        if not isinstance(spec, dict) or not isinstance(spec.get("tools"), list):
            raise ValueError('tool_calls needs {"tools": [...], "tool_choice": ...}')
        return tool_call_rules(
            spec["tools"],
            dialect=spec.get("dialect") or gtok.tokenizer.tool_dialect.name,
            tool_choice=spec.get("tool_choice", "required"),
            parallel_tool_calls=bool(spec.get("parallel_tool_calls", True)),
            marker_ids=gtok.marker_id,
        )
    raise ValueError(f"unknown constraint kind {kind!r}; known: {', '.join(KINDS)}")


def compile_constraint(
    kind: str,
    spec: Any,
    tokenizer: Tokenizer,
    *,
    vocab_size: int | None = None,
    reasoning_open: bool = False,
) -> Constraint:
    """The compiled constraint (cached); raises `ConstraintError` on a spec it cannot enforce."""
    gtok = grammar_tokenizer(tokenizer, vocab_size)
    try:
        key = (kind, json.dumps(spec, ensure_ascii=False), reasoning_open)
    except (TypeError, ValueError) as exc:
        raise ConstraintError(f"{kind}: spec is not JSON: {exc}") from None
    with gtok._lock:
        if key in gtok._cache:
            gtok._cache.move_to_end(key)
            return gtok._cache[key]
    try:
        grammar = wrap_start(_rules(kind, spec, gtok), gtok.marker_id, reasoning_open=reasoning_open)
    except ValueError as exc:
        raise ConstraintError(f"{kind}: {exc}") from None
    template = llguidance.LLMatcher(gtok.ll, grammar, log_level=0)
    if template.is_error():
        raise ConstraintError(f"{kind}: {template.get_error()}")
    constraint = Constraint(kind, grammar, gtok, template)
    with gtok._lock:
        gtok._cache[key] = constraint
        while len(gtok._cache) > _CACHE_SIZE:
            gtok._cache.popitem(last=False)
    return constraint
