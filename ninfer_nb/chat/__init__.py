"""Text at the edges of the engine: tokenizer, chat template, incremental detokenizer,
reasoning split and tool-call parsing (Qwen XML, Hermes JSON, Llama 3 JSON dialects). The
engine itself speaks token ids only."""
from __future__ import annotations

from ninfer_nb.chat.detokenizer import IncrementalDetokenizer
from ninfer_nb.chat.messages import ChatDelta, ChatMessageOut, ToolCall, new_tool_call_id
from ninfer_nb.chat.output import ChatStreamParser, parse_chat_output, prompt_opens_reasoning
from ninfer_nb.chat.reasoning import ReasoningSplitter, split_reasoning
from ninfer_nb.chat.template import (
    DEFAULT_CHATML_TEMPLATE,
    ChatFormatter,
    format_chat,
    prepare_messages,
    render_chat,
    validate_messages,
)
from ninfer_nb.chat.tokenizer import Tokenizer
from ninfer_nb.chat.tool_calls import ToolCallStreamParser, parse_tool_calls
from ninfer_nb.chat.tool_dialects import (
    DIALECTS,
    ToolCallDialect,
    detect_dialect,
    get_dialect,
)

__all__ = [
    "DEFAULT_CHATML_TEMPLATE",
    "DIALECTS",
    "ChatDelta",
    "ChatFormatter",
    "ChatMessageOut",
    "ChatStreamParser",
    "IncrementalDetokenizer",
    "ReasoningSplitter",
    "Tokenizer",
    "ToolCall",
    "ToolCallDialect",
    "ToolCallStreamParser",
    "detect_dialect",
    "format_chat",
    "get_dialect",
    "new_tool_call_id",
    "parse_chat_output",
    "parse_tool_calls",
    "prepare_messages",
    "prompt_opens_reasoning",
    "render_chat",
    "split_reasoning",
    "validate_messages",
]
