"""Logprobs in the OpenAI shapes: Chat's `logprobs.content` entries, Completions' parallel
arrays (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).

A token's text is its own decode (a byte-level piece of a multi-byte character shows as U+FFFD,
with its `bytes` as decoded). Knows nothing about HTTP or the engine beyond the tokenizer.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from ninfer_nb.engine.logprobs import TokenLogprobs

from .engine import TokenizerLike


class TokenTexts:
    """id -> text, cached (the top alternatives repeat a lot)."""

    def __init__(self, tokenizer: TokenizerLike) -> None:
        self._text = lru_cache(maxsize=65536)(lambda i: tokenizer.decode([i]))

    def __call__(self, token_id: int) -> str:
        return str(self._text(token_id))


def _finite(x: float) -> float | None:
    """JSON has no -inf: a token the model gives probability 0 reads as a very small logprob."""
    return x if x != float("-inf") else -9999.0


def chat_entry(lp: TokenLogprobs, text: TokenTexts) -> dict[str, Any]:
    def one(i: int, v: float) -> dict[str, Any]:
        t = text(i)
        return {"token": t, "logprob": _finite(v), "bytes": list(t.encode("utf-8"))}

    return {**one(lp.token_id, lp.logprob), "top_logprobs": [one(i, v) for i, v in lp.top]}


def chat_logprobs(lps: Iterable[TokenLogprobs], text: TokenTexts) -> dict[str, Any]:
    return {"content": [chat_entry(lp, text) for lp in lps], "refusal": None}


def completion_logprobs(lps: Sequence[TokenLogprobs | None], ids: Sequence[int], text: TokenTexts,
                        offset: int = 0) -> dict[str, Any]:
    """Completions' arrays for tokens `ids` (their logprobs, None for a prompt's first token),
    text offsets counted from `offset` characters into the choice's text."""
    tokens, values, tops, offsets = [], [], [], []
    for i, lp in zip(ids, lps):
        t = text(i)
        tokens.append(t)
        offsets.append(offset)
        offset += len(t)
        values.append(_finite(lp.logprob) if lp is not None else None)
        # the alternatives and the chosen token (vLLM's shape: up to k + 1 entries)
        tops.append(None if lp is None else
                    {**{text(j): _finite(v) for j, v in lp.top}, t: _finite(lp.logprob)})
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
            "text_offset": offsets}


def merge_completion_logprobs(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return b
    return {k: a[k] + b[k] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
