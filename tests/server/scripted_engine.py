"""ScriptedEngine: an engine double that replays a scripted reply as tokens.

Random tiny weights never call a tool or close `</think>`, so the tool-call and reasoning
shaping tests use this: the reply text is encoded with the real Qwen tokenizer and fed back one
token at a time through the real IncrementalDetokenizer, StopStringMatcher and ChatStreamParser,
with the prompt rendered by the real chat template. Only the model is replaced.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ninfer_nb.chat import (
    ChatDelta,
    ChatStreamParser,
    IncrementalDetokenizer,
    Tokenizer,
    format_chat,
    prompt_opens_reasoning,
)
from ninfer_nb.errors import ContextLengthExceededError
from ninfer_nb.outputs import StreamEvent, Timings
from ninfer_nb.params import SamplingParams
from ninfer_nb.stops import StopStringMatcher

Reply = Callable[[list[dict[str, Any]], str], str]


class ScriptedEngine:
    def __init__(
        self,
        tokenizer: Tokenizer,
        reply: Reply | str,
        *,
        model_id: str = "scripted-qwen",
        max_context: int = 4096,
        token_delay_s: float = 0.0,
        enable_thinking: bool = True,
        fail_after: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.reply: Reply = reply if callable(reply) else (lambda _m, _p, r=reply: r)
        self.model_id = model_id
        self.max_context = max_context
        self.token_delay_s = token_delay_s
        self.enable_thinking = enable_thinking
        self.fail_after = fail_after              # raise inside the engine after N tokens
        self.prompts: list[str] = []          # every rendered prompt, in order
        self.cancelled = 0                    # generations stopped early by a cancel
        self.stats_calls = 0

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    *, enable_thinking: bool | None = None) -> str:
        thinking = self.enable_thinking if enable_thinking is None else enable_thinking
        return format_chat(self.tokenizer, messages, tools, thinking)

    def count_tokens(self, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None = None,
                     *, enable_thinking: bool | None = None) -> int:
        return len(self.tokenizer.encode(self.render_chat(messages, tools,
                                                          enable_thinking=enable_thinking)))

    def stats(self) -> dict[str, Any]:
        self.stats_calls += 1
        return {"kv_cache_bytes": 1000, "kv_cache_used_bytes": 250,
                "max_context": self.max_context}

    def chat_stream(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    params: SamplingParams | None = None, *, enable_thinking: bool | None = None,
                    cancel: threading.Event | None = None) -> Iterator[ChatDelta | StreamEvent]:
        params = (params or SamplingParams()).validate()
        prompt = self.render_chat(messages, tools, enable_thinking=enable_thinking)
        prompt_ids = self.tokenizer.encode(prompt)
        if len(prompt_ids) >= self.max_context:
            raise ContextLengthExceededError(
                f"prompt has {len(prompt_ids)} tokens, the context holds {self.max_context}")
        self.prompts.append(prompt)
        reply_ids = self.tokenizer.encode(self.reply(messages, prompt))
        parser = ChatStreamParser(starts_in_reasoning=prompt_opens_reasoning(prompt), tools=tools,
                                  dialect=self.tokenizer.tool_dialect)
        budget = min(params.max_tokens, self.max_context - len(prompt_ids))
        return self._replay(reply_ids + [self.tokenizer.eos_token_ids[0]], len(prompt_ids),
                            params, budget, parser, cancel)

    def _replay(self, ids: list[int], n_prompt: int, params: SamplingParams, budget: int,
                parser: ChatStreamParser, cancel: threading.Event | None
                ) -> Iterator[ChatDelta | StreamEvent]:
        detok = IncrementalDetokenizer(self.tokenizer)
        stops = StopStringMatcher(params.stop)
        eos = set(self.tokenizer.eos_token_ids)
        t0 = time.perf_counter()
        finish, n = "length", 0
        try:
            for token in ids:
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    self.cancelled += 1
                    break
                time.sleep(self.token_delay_s)
                if self.fail_after is not None and n >= self.fail_after:
                    raise RuntimeError("scripted engine failure mid-stream")
                n += 1
                if token in eos:
                    finish = "stop"
                    yield StreamEvent(token_id=token, text="")
                    break
                text = stops.push(detok.push(token))
                yield from parser.push(text) if text else ()
                yield StreamEvent(token_id=token, text=text)
                if stops.stopped:
                    finish = "stop"
                    break
                if n >= budget:
                    break
        except GeneratorExit:  # the worker closed us after a cancel: stopped at this step
            self.cancelled += 1
            raise
        tail = "" if stops.stopped else stops.push(detok.flush()) + stops.flush()
        if tail:
            yield from parser.push(tail)
        yield from parser.finish()
        elapsed = time.perf_counter() - t0
        yield StreamEvent(token_id=None, text=tail, finished=True, finish_reason=finish,  # type: ignore[arg-type]
                          timings=Timings(prompt_tokens=n_prompt, completion_tokens=n,
                                          ttft_s=elapsed / max(n, 1), decode_s=elapsed))
