"""Incremental detokenization: token ids in, only newly completed text out.

Byte-level BPE tokens can split one UTF-8 character across several tokens; decoding such a
prefix yields U+FFFD. The detokenizer keeps a short window of recent ids, decodes only that
window and holds text back while it ends in U+FFFD, so callers never see a broken character and
the concatenation of all pushes (plus `flush`) equals a full decode. Per-token work is bounded by
the window, not by the sequence length. It knows nothing about reasoning or tool calls.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ninfer_nb.chat.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
# A UTF-8 character has at most 4 bytes, so at most 3 tokens can be waiting for its tail; a
# longer run ending in U+FFFD is genuinely invalid (or a literal U+FFFD) and is released.
_MAX_PENDING = 4
# Tokens that decode to nothing (skipped specials) keep the older context in the window, because
# SentencePiece-style decoders need a preceding token to keep a leading space; up to this size.
_MAX_WINDOW = 16


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window (tokens already emitted, for context)
        self._read = 0  # first token whose text has not been emitted yet
        self._chunks: list[str] = []
        self._text_cache: str | None = ""

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self._ids[start:end], self.skip_special_tokens)

    def _release(self, force: bool) -> str:
        prefix_text = self._decode(self._prefix, self._read)
        full_text = self._decode(self._prefix, len(self._ids))
        pending = len(self._ids) - self._read
        if full_text.endswith(_REPLACEMENT) and not force and pending < _MAX_PENDING:
            return ""
        if full_text.startswith(prefix_text):
            new = full_text[len(prefix_text):]
        else:  # context changed how the window decodes (rare): emit past the common prefix
            common = 0
            for a, b in zip(prefix_text, full_text):
                if a != b:
                    break
                common += 1
            new = full_text[common:]
        old_read, self._read = self._read, len(self._ids)
        if new or self._read - self._prefix > _MAX_WINDOW:
            self._prefix = old_read
        if new:
            self._chunks.append(new)
            self._text_cache = None
        return new

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completed ("" while a character is unfinished)."""
        self._ids.append(int(token_id))
        return self._release(force=False)

    def push_many(self, token_ids: list[int]) -> str:
        return "".join(self.push(t) for t in token_ids)

    def flush(self) -> str:
        """Release whatever is held back (an unfinished character becomes U+FFFD)."""
        if self._read == len(self._ids):
            return ""
        return self._release(force=True)

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if self._text_cache is None:
            self._text_cache = "".join(self._chunks)
        return self._text_cache

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)
