"""`InProcessClient`: the engine runs inside this process, owned by one `EngineWorker`
thread (the LLM is not thread-safe; every call to it goes through that worker).

Translates the LLM's `ChatDelta` / `StreamEvent` stream into `tui.events`. Knows nothing
about Textual; the model is loaded only when `start()` is awaited.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ninfer_nb.engine.worker import EngineWorker
from ninfer_nb.errors import NinferError

from .client import ClientError
from .events import (
    ChatEvent,
    ContentDelta,
    Done,
    EngineStats,
    ModelInfo,
    ReasoningDelta,
    ToolCall,
    ToolCallDelta,
    TurnTimings,
    spec_per_position,
)
from .rate import RateMeter
from .settings import ChatSettings
from .sysmon import LocalProbe, SystemProbe, gpu_index
from .turn import Turn

LlmFactory = Callable[[], Any]


def describe_error(exc: BaseException) -> str | None:
    if isinstance(exc, (NinferError, ClientError)):
        return exc.message
    return None


class InProcessClient:
    remote = False

    def __init__(
        self,
        model: str | None,
        *,
        device: str = "auto",
        max_context: int = 4096,
        prefill_chunk: int = 1024,
        factory: LlmFactory | None = None,
    ) -> None:
        self.model = model
        self.device = device
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self._factory = factory or self._default_factory
        self._worker = EngineWorker(max_pending=1, name="ninfer-tui-engine")
        self._llm: Any = None
        self.info: ModelInfo | None = None

    @property
    def description(self) -> str:
        return f"in-process: {self.model or 'default model'}"

    def _default_factory(self) -> Any:
        from ninfer_nb import LLM  # heavy import, on the engine thread

        return LLM(
            self.model,
            device=self.device,
            max_context=self.max_context,
            prefill_chunk=self.prefill_chunk,
            show_progress=False,
        )

    async def start(self) -> ModelInfo:
        if self.info is not None:
            return self.info
        try:
            self._llm = await self._worker.call(self._factory)
            # the engine's decode slots: that many of this client's generations run at once
            self._worker.max_active = max(1, int(getattr(self._llm, "max_concurrency", 1)))
            info = await self._worker.call(self._describe)
        except NinferError as exc:
            raise ClientError(f"could not load model: {exc.message}") from exc
        except Exception as exc:  # the user needs the reason, not a traceback
            raise ClientError(f"could not load model: {type(exc).__name__}: {exc}") from exc
        self.info = info
        return info

    def _describe(self) -> ModelInfo:
        llm = self._llm
        cfg = llm.model_config
        details: list[tuple[str, str]] = [
            ("architecture", str(getattr(cfg, "architecture", "?"))),
            ("layers", str(getattr(cfg, "num_layers", "?"))),
            ("hidden size", str(getattr(cfg, "hidden_size", "?"))),
            ("vocabulary", str(getattr(cfg, "vocab_size", "?"))),
        ]
        if getattr(cfg, "is_moe", False):
            details.append(("experts", f"{cfg.num_experts} ({cfg.num_experts_per_tok} active)"))
        return ModelInfo(
            model_id=str(llm.model_id),
            backend="in-process",
            device=str(llm.device_name),
            max_context=int(llm.max_context),
            details=tuple(details),
        )

    def chat(self, messages: list[dict[str, Any]], settings: ChatSettings) -> Turn:
        return Turn(self._events(messages, settings), describe_error)

    async def _events(
        self, messages: list[dict[str, Any]], settings: ChatSettings
    ) -> AsyncIterator[ChatEvent]:
        if self._llm is None:
            raise ClientError("no model is loaded")
        from ninfer_nb.params import SamplingParams

        params = SamplingParams(
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=settings.seed,
        ).validate()
        llm = self._llm

        def job(cancel: Any) -> Any:
            return llm.chat_stream(
                messages, params=params, enable_thinking=settings.thinking, cancel=cancel
            )

        meter = RateMeter()
        async with self._worker.submit_stream(job) as stream:
            async for item in stream:
                kind = getattr(item, "kind", None)
                if kind is not None:
                    ev = _delta_event(item)
                    if ev is not None:
                        yield ev
                    continue
                if getattr(item, "finished", False):
                    yield Done(str(item.finish_reason or "stop"), _timings(item.timings))
                    return
                if getattr(item, "token_id", None) is not None:
                    tick = meter.add(1, time.monotonic())
                    if tick is not None:
                        yield tick
        yield Done("cancelled", TurnTimings(completion_tokens=meter.tokens or None))

    async def stats(self) -> EngineStats:
        if self._llm is None:
            return EngineStats(max_context=self.max_context)
        try:
            raw = await self._worker.call(self._llm.stats)
        except Exception:  # stats are best effort; the panel shows "n/a"
            return EngineStats(max_context=self.max_context)
        return stats_from_dict(raw if isinstance(raw, dict) else {})

    def system_probe(self) -> SystemProbe:
        device = self.info.device if self.info is not None else self.device
        return LocalProbe(gpu_index(device.lower()))

    async def close(self) -> None:
        import asyncio

        await asyncio.get_running_loop().run_in_executor(None, self._worker.close, 2.0)


def _delta_event(d: Any) -> ChatEvent | None:
    if d.kind == "reasoning" and d.text:
        return ReasoningDelta(str(d.text))
    if d.kind == "content" and d.text:
        return ContentDelta(str(d.text))
    if d.kind == "tool_call" and d.tool_call is not None:
        c = d.tool_call
        return ToolCallDelta(ToolCall(str(c.id), str(c.name), str(c.arguments)))
    return None


def _timings(t: Any) -> TurnTimings:
    if t is None:
        return TurnTimings()
    return TurnTimings(
        prompt_tokens=int(t.prompt_tokens),
        cached_tokens=int(t.cached_tokens),
        completion_tokens=int(t.completion_tokens),
        ttft_s=float(t.ttft_s),
        prefill_tok_s=float(t.prefill_tok_s),
        decode_tok_s=float(t.decode_tok_s),
        draft_tokens=_opt_int(getattr(t, "draft_tokens", None)),
        draft_accepted=_opt_int(getattr(t, "draft_accepted", None)),
    )


def _opt_int(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _opt_float(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def stats_from_dict(raw: dict[str, Any]) -> EngineStats:
    """Map `LLM.stats()` to EngineStats; unknown or missing keys are fine."""
    acceptance = _opt_float(raw.get("spec_acceptance"))
    drafted = _opt_int(raw.get("spec_draft_tokens"))
    accepted = _opt_int(raw.get("spec_accepted_tokens", raw.get("spec_accepted")))
    if acceptance is None and drafted:
        acceptance = (accepted or 0) / drafted
    rounds = raw.get("decode_batch_sizes")
    batch = None
    if isinstance(rounds, dict) and rounds:
        n = sum(int(c) for c in rounds.values())
        batch = sum(int(b) * int(c) for b, c in rounds.items()) / n if n else None
    queries, hits = _opt_int(raw.get("prefix_cache_queries")), _opt_int(raw.get("prefix_cache_hits"))
    at = raw.get("spec_accepted_per_pos")
    per_pos = spec_per_position({i: float(v) for i, v in enumerate(at)} if isinstance(at, list) else {},
                                _opt_float(raw.get("spec_drafts")))
    return EngineStats(
        context_tokens=_opt_int(raw.get("context_tokens")),
        max_context=_opt_int(raw.get("max_context")),
        kv_cache_used_bytes=_opt_int(raw.get("kv_cache_used_bytes")),
        kv_cache_bytes=_opt_int(raw.get("kv_cache_bytes")),
        spec_acceptance=acceptance,
        device=str(raw["device"]) if raw.get("device") is not None else None,
        device_memory_used=_opt_int(raw.get("device_memory_used")),
        device_memory_total=_opt_int(raw.get("device_memory_total")),
        requests_running=_opt_int(raw.get("num_requests_running")),
        requests_waiting=_opt_int(raw.get("num_requests_waiting")),
        batch_size=batch,
        prefix_hit_rate=hits / queries if queries and hits is not None else None,
        spec_per_pos=per_pos,
    )
