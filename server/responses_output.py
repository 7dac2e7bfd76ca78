"""ResponseBuilder: output items and streaming events of one OpenAI Response (§4).

Fed the generation's deltas in order; every call returns the SSE events it implies (the
non-streaming path ignores them) and `snapshot()` is the response object at any moment.
Knows no HTTP and no engine.
"""
from __future__ import annotations

import copy
import time
from typing import Any

from .errors import ApiError
from .generation import Finished, ToolCallOut
from .messages import dump_arguments
from .responses_input import ResponsesRequest
from .state import new_id

SUMMARY_PLACEHOLDER = "Reasoning summaries are not available on this server."


class ResponseBuilder:
    def __init__(self, response_id: str, req: ResponsesRequest) -> None:
        self.id = response_id
        self.req = req
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete: dict[str, Any] | None = None
        self.reasoning = ""
        self.content = ""
        self.calls: list[dict[str, Any]] = []
        self._seq = 0
        self._open: dict[str, Any] | None = None

    # --- snapshots ------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        done = self.status in ("completed", "incomplete", "failed", "cancelled")
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": self.status, "completed_at": int(time.time()) if done else None,
            "error": self.error, "incomplete_details": self.incomplete,
            "model": self.req.model, "output": copy.deepcopy(self.output),
            "previous_response_id": self.req.previous_response_id, "store": self.req.store,
            "truncation": "disabled", "service_tier": "default", "background": False,
            "usage": self.usage, "user": None, **self.req.echo,
        }

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        ev = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return ev

    def start(self) -> list[dict[str, Any]]:
        return [self._event("response.created", response=self.snapshot()),
                self._event("response.in_progress", response=self.snapshot())]

    # --- items ----------------------------------------------------------------------------
    def _where(self) -> dict[str, Any]:
        assert self._open is not None, "no open output item"
        return {"item_id": self._open["id"], "output_index": len(self.output) - 1}

    def _open_item(self, kind: str) -> list[dict[str, Any]]:
        events = self._close()
        if kind == "reasoning":
            item: dict[str, Any] = {"id": new_id("rs_", 32), "type": "reasoning",
                                    "status": "in_progress", "summary": [], "content": []}
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            item = {"id": new_id("msg_", 32), "type": "message", "status": "in_progress",
                    "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.output.append(item)
        self._open = item
        events.append(self._event("response.output_item.added", output_index=len(self.output) - 1,
                                  item=copy.deepcopy(item)))
        if kind == "reasoning" and self.req.echo["reasoning"].get("summary"):
            events += self._summary()
        item["content"].append(part)
        events.append(self._event("response.content_part.added", **self._where(),
                                  content_index=0, part=copy.deepcopy(part)))
        return events

    def _summary(self) -> list[dict[str, Any]]:
        part = {"type": "summary_text", "text": SUMMARY_PLACEHOLDER}
        assert self._open is not None
        self._open["summary"].append(part)
        at = {**self._where(), "summary_index": 0}
        return [self._event("response.reasoning_summary_part.added", **at,
                            part={"type": "summary_text", "text": ""}),
                self._event("response.reasoning_summary_text.delta", **at,
                            delta=SUMMARY_PLACEHOLDER),
                self._event("response.reasoning_summary_text.done", **at,
                            text=SUMMARY_PLACEHOLDER),
                self._event("response.reasoning_summary_part.done", **at, part=part)]

    def _close(self) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        part = item["content"][0]
        kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
        item["status"] = "completed"
        if item["type"] == "reasoning" and self.req.include_reasoning:
            item["encrypted_content"] = part["text"]
        events = [
            self._event(f"response.{kind}.done", **self._where(), content_index=0,
                        text=part["text"]),
            self._event("response.content_part.done", **self._where(), content_index=0,
                        part=copy.deepcopy(part)),
            self._event("response.output_item.done", output_index=len(self.output) - 1,
                        item=copy.deepcopy(item)),
        ]
        self._open = None
        return events

    def delta(self, kind: str, text: str,
              logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Text of one channel; `logprobs`: Chat-shaped entries of its tokens (output text only,
        with `top_logprobs` / `include: message.output_text.logprobs`)."""
        want = "reasoning" if kind == "reasoning" else "message"
        events = [] if self._open and self._open["type"] == want else self._open_item(want)
        assert self._open is not None
        self._open["content"][0]["text"] += text
        if want == "reasoning":
            self.reasoning += text
            events.append(self._event("response.reasoning_text.delta", **self._where(),
                                      content_index=0, delta=text))
        else:
            self.content += text
            self._open["content"][0]["logprobs"].extend(logprobs or [])
            events.append(self._event("response.output_text.delta", **self._where(),
                                      content_index=0, delta=text, logprobs=logprobs or []))
        return events

    def _function_call(self, call: ToolCallOut) -> list[dict[str, Any]]:
        args = dump_arguments(call.arguments)
        item = {"id": new_id("fc_", 32), "type": "function_call", "status": "in_progress",
                "call_id": new_id("call_", 32), "name": call.name, "arguments": ""}
        self.output.append(item)
        index = len(self.output) - 1
        at = {"item_id": item["id"], "output_index": index}
        events = [
            self._event("response.output_item.added", output_index=index,
                        item=copy.deepcopy(item)),
            self._event("response.function_call_arguments.delta", **at, delta=args),
        ]
        item.update(arguments=args, status="completed")
        self.calls.append(item)
        events += [self._event("response.function_call_arguments.done", **at, name=call.name,
                               arguments=args),
                   self._event("response.output_item.done", output_index=index,
                               item=copy.deepcopy(item))]
        return events

    # --- terminal -------------------------------------------------------------------------
    def call(self, call: ToolCallOut) -> list[dict[str, Any]]:
        """A function call item, added when the call is parsed (after the open item closes)."""
        return self._close() + self._function_call(call)

    def finish(self, fin: Finished, calls: list[ToolCallOut]) -> list[dict[str, Any]]:
        events = self._close()
        status = {"length": "incomplete", "cancelled": "cancelled"}.get(fin.reason, "completed")
        if status == "completed" and not self.output and not calls:  # (calls: added at the end)
            events += self._open_item("message") + self._close()  # an empty answer
        for call in calls:
            events += self._function_call(call)
        self.status = status
        if status == "incomplete":
            self.incomplete = {"reason": "max_output_tokens"}
        self.usage = {
            "input_tokens": fin.prompt_tokens,
            "input_tokens_details": {"cached_tokens": fin.cached_tokens},
            "output_tokens": fin.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": fin.reasoning_tokens},
            "total_tokens": fin.total_tokens,
        }
        events.append(self._event(f"response.{status}", response=self.snapshot()))
        return events

    def fail(self, err: ApiError) -> list[dict[str, Any]]:
        events = self._close()
        self.status = "failed"
        self.error = {"code": err.code or "internal_error", "message": err.message}
        events.append(self._event("response.failed", response=self.snapshot()))
        return events
