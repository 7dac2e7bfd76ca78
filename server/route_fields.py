"""Which top-level request fields each POST route reads, and which it accepts without effect.

A field that is neither is refused with a 400 `unsupported_field` naming it, so nothing a client
sends is silently dropped (server/README.md has the table with each field's rule). Fields the
route reads may still refuse some values (the parsers say which). Nested objects are checked
by the parsers. Knows no protocol shapes.
"""
from __future__ import annotations

from typing import Any

from .errors import BadRequest

_SAMPLING = {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "logit_bias", "seed", "ignore_eos"}

# read (honoured or refused value by value) by the route's parser
READ: dict[str, frozenset[str]] = {
    "/v1/chat/completions": frozenset(_SAMPLING | {
        "model", "messages", "max_tokens", "max_completion_tokens", "stop", "stream",
        "stream_options", "tools", "tool_choice", "parallel_tool_calls", "response_format", "n",
        "best_of", "logprobs", "top_logprobs", "reasoning_effort", "enable_thinking",
        "chat_template_kwargs", "functions", "function_call"}),
    "/v1/completions": frozenset(_SAMPLING | {
        "model", "prompt", "suffix", "max_tokens", "stop", "stream", "stream_options", "n",
        "best_of", "logprobs", "echo"}),
    "/v1/responses": frozenset({
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
        "previous_response_id", "store", "include", "reasoning", "max_output_tokens",
        "temperature", "top_p", "top_k", "seed", "text", "metadata", "stream", "background",
        "enable_thinking", "top_logprobs"}),
    "/v1/messages": frozenset({
        "model", "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p",
        "top_k", "tools", "tool_choice", "thinking", "stream", "output_config"}),
    "/tokenize": frozenset({"model", "prompt", "messages", "add_special_tokens",
                            "add_generation_prompt", "return_token_strs", "enable_thinking"}),
    "/detokenize": frozenset({"model", "tokens"}),
}
READ["/v1/responses/input_tokens"] = READ["/v1/responses"]
READ["/v1/messages/count_tokens"] = READ["/v1/messages"]

# accepted and without effect by design: identification / billing / caching hints
IGNORED: dict[str, frozenset[str]] = {
    "/v1/chat/completions": frozenset({"user", "metadata", "store", "service_tier",
                                       "prompt_cache_key", "safety_identifier"}),
    "/v1/completions": frozenset({"user"}),
    "/v1/responses": frozenset({"user", "service_tier", "prompt_cache_key", "safety_identifier",
                                "truncation"}),
    "/v1/messages": frozenset({"metadata", "service_tier"}),
}
IGNORED["/v1/responses/input_tokens"] = IGNORED["/v1/responses"]
IGNORED["/v1/messages/count_tokens"] = IGNORED["/v1/messages"]


def check_fields(route: str, body: dict[str, Any]) -> None:
    """A 400 naming the first field of `body` that `route` neither reads nor ignores."""
    known = READ[route] | IGNORED.get(route, frozenset())
    unknown = sorted(k for k in body if k not in known)
    if unknown:
        raise BadRequest(f"{unknown[0]!r} is not supported on {route}", param=unknown[0],
                         code="unsupported_field")
    if route.startswith("/v1/responses") and body.get("truncation") not in (None, "disabled"):
        raise BadRequest("truncation must be 'disabled' (the context is never truncated)",
                         param="truncation")
