"""The engine surface the server uses, as a Protocol, so tests can inject a double.

`ninfer_nb.LLM` satisfies it. Generation runs on the engine thread only (the LLM is not
thread-safe), reached through `EngineWorker`; `render_chat` and the tokenizer's encode are
thread-safe and run on the PromptBuilder's threads. An engine that also has
`stream(prompt_ids, params, cancel=)` is handed the prompt already tokenized; one without it
(a test double) renders it again in `chat_stream`. Knows no HTTP.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from ninfer_nb.chat.tool_dialects import ToolCallDialect
from ninfer_nb.params import SamplingParams

Message = dict[str, Any]
Tool = dict[str, Any]


class TokenizerLike(Protocol):
    eos_token_ids: Sequence[int]
    tool_dialect: ToolCallDialect  # the syntax the chat template asks the model to call tools in

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ChatEngine(Protocol):
    model_id: str
    max_context: int

    @property
    def tokenizer(self) -> TokenizerLike: ...

    def render_chat(
        self,
        messages: list[Message],
        tools: list[Tool] | None = None,
        *,
        enable_thinking: bool | None = None,
    ) -> str: ...

    def chat_stream(
        self,
        messages: list[Message],
        tools: list[Tool] | None = None,
        params: SamplingParams | None = None,
        *,
        enable_thinking: bool | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Any]:
        """Yields ChatDelta(kind, text, tool_call) items, then a finished StreamEvent."""
        ...

    def count_tokens(
        self,
        messages: list[Message],
        tools: list[Tool] | None = None,
        *,
        enable_thinking: bool | None = None,
    ) -> int: ...

    def stats(self) -> dict[str, Any]: ...


def model_meta(engine: ChatEngine) -> dict[str, Any]:
    """llama.cpp-style `meta` for /v1/models, from whatever the engine exposes."""
    cfg = getattr(engine, "model_config", None)
    meta: dict[str, Any] = {"n_ctx": engine.max_context}
    if cfg is not None:
        meta["n_vocab"] = cfg.vocab_size
        meta["n_embd"] = cfg.hidden_size
        meta["n_ctx_train"] = cfg.max_position_embeddings
    return meta
