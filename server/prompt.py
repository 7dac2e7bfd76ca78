"""PromptBuilder: chat template rendering and tokenization on a small thread pool of its own.

Compiling a request's output constraint (server/constraints.py) runs here too, and the
grammar's view of the tokenizer is built here once, in the background, from the start.
Neither runs on the engine thread (one huge prompt must not stall other requests' steps) nor on
the event loop. The Hugging Face tokenizer's batch encode releases the GIL, so a prompt of
megabytes costs other requests nothing but a core; a single encode would hold the GIL for its
whole run. Knows the engine only through `render_chat` and its tokenizer; knows no HTTP.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ninfer_nb.chat import Tokenizer
from ninfer_nb.structured import Constraint

from .constraints import OutputRequest, compile_output, warm_grammar
from .engine import ChatEngine, Message, TokenizerLike, Tool

T = TypeVar("T")


@dataclass(frozen=True)
class Prompt:
    text: str          # the rendered chat template, ending in the generation prompt
    ids: list[int]     # its token ids, as the engine would encode them

    def __len__(self) -> int:
        return len(self.ids)


def encode_releasing_gil(tokenizer: TokenizerLike, text: str) -> list[int]:
    """`tokenizer.encode(text)`, through the GIL-free batch path when the tokenizer has one."""
    backend: Any = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "encode_batch"):
        return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)
    return tokenizer.encode(text)


class PromptBuilder:
    def __init__(self, engine: ChatEngine, *, threads: int = 4) -> None:
        self.engine = engine
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="ninfer-prompt")
        if isinstance(engine.tokenizer, Tokenizer):  # the grammar library reads a real one
            self._pool.submit(warm_grammar, engine)

    def _build(self, messages: list[Message], tools: list[Tool] | None,
               enable_thinking: bool) -> Prompt:
        text = self.engine.render_chat(messages, tools, enable_thinking=enable_thinking)
        return Prompt(text, encode_releasing_gil(self.engine.tokenizer, text))

    async def build(self, messages: list[Message], tools: list[Tool] | None,
                    enable_thinking: bool) -> Prompt:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._build, messages, tools,
                                          enable_thinking)

    async def constraint(self, want: OutputRequest, prompt: Prompt) -> Constraint:
        """`want` compiled for this prompt (a 400 naming its field when it cannot be)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, compile_output, self.engine, want,
                                          prompt.text)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the prompt threads (tokenizing plain text, detokenizing)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def count(self, messages: list[Message], tools: list[Tool] | None,
                    enable_thinking: bool) -> int:
        return len(await self.build(messages, tools, enable_thinking))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
