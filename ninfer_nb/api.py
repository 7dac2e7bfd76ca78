"""The Python front door: `LLM` loads a model and generates; `SamplingParams` says how.

    llm = LLM()                                   # default model: SmolLM2-135M-Instruct
    print(llm.chat([{"role": "user", "content": "Hi"}]).content)

`LLM` owns one model on one backend and one cached sequence (prefix reuse across calls). It
is not thread-safe: one thread calls it (front-ends use `engine.worker.EngineWorker`).
Text handling (templates, detokenizing, reasoning / tool-call parsing) comes from `chat/`.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from .chat import (ChatDelta, ChatStreamParser, IncrementalDetokenizer, ToolCall, format_chat,
                   prompt_opens_reasoning)
from .config import KV_CACHE_KINDS, EngineConfig
from .engine.backend import create_backend
from .engine.generator import Generator
from .engine.sampler import Sampler
from .errors import ContextLengthExceededError, InvalidRequestError
from .models import Decoder, build_weights
from .models.loader import load_checkpoint
from .models.presets import preset_config

RANDOM_PREFIX = "random:"
from .outputs import GenerationResult, StreamEvent, Timings
from .params import SamplingParams
from .stops import StopStringMatcher

__all__ = ["LLM", "SamplingParams", "ChatResult"]


@dataclass
class ChatResult:
    reasoning: str
    content: str
    tool_calls: list[ToolCall]
    result: GenerationResult
    deltas: list[ChatDelta] = field(default_factory=list, repr=False)


class LLM:
    def __init__(self, model: str | None = None, *, device: str = "auto", max_context: int = 4096,
                 prefill_chunk: int = 1024, enable_thinking: bool = True, cuda_graphs: bool = True,
                 kv_cache: str = "auto", show_progress: bool = False, prefill_gemm: str = "auto",
                 prefill_attention: str = "flash", pdl: bool = True, device_argmax: bool = True,
                 decode_ahead: bool = True, config: EngineConfig | None = None) -> None:
        cfg = config or EngineConfig(model=model, device=device, max_context=max_context,
                                     prefill_chunk=prefill_chunk, enable_thinking=enable_thinking,
                                     cuda_graphs=cuda_graphs, kv_cache=kv_cache,
                                     show_progress=show_progress, prefill_gemm=prefill_gemm,
                                     prefill_attention=prefill_attention, pdl=pdl, device_argmax=device_argmax,
                                     decode_ahead=decode_ahead)
        if cfg.kv_cache not in KV_CACHE_KINDS:
            raise InvalidRequestError(f"kv_cache must be auto, fp32, bf16 or int8, got {cfg.kv_cache!r}")
        if cfg.max_context < 2:
            raise InvalidRequestError(f"max_context must be >= 2, got {cfg.max_context}")
        self.engine_config = cfg
        if cfg.prefill_gemm not in ("auto", "mma", "wgmma"):
            raise InvalidRequestError(f"prefill_gemm must be auto, mma or wgmma, got {cfg.prefill_gemm!r}")
        if cfg.prefill_attention not in ("flash", "gemm", "simt", "mma"):
            raise InvalidRequestError(f"prefill_attention must be flash, gemm, simt or mma, got {cfg.prefill_attention!r}")
        self.backend = create_backend(cfg.device, prefill_gemm=cfg.prefill_gemm,
                                      prefill_attention=cfg.prefill_attention, pdl=cfg.pdl)
        if cfg.model is not None and cfg.model.startswith(RANDOM_PREFIX):
            # Benchmark shapes with random weights built on the device; token ids only.
            preset = cfg.model[len(RANDOM_PREFIX):]
            self.model_config = preset_config(preset)
            self.tokenizer = None  # type: ignore[assignment]
            self.model_id = self.source = cfg.model
            self.backend.check_model(self.model_config)
            weights = self.backend.random_weights(self.model_config, seed=cfg.seed or 0)
        else:
            ckpt = load_checkpoint(cfg.model, show_progress=cfg.show_progress)
            if ckpt.tokenizer is None:
                raise InvalidRequestError(f"{ckpt.source}: no tokenizer found")
            self.tokenizer = ckpt.tokenizer
            self.model_config = ckpt.config
            self.model_id = ckpt.name
            self.source = ckpt.source
            self.backend.check_model(ckpt.config)        # shapes the backend's kernels cannot run
            weights = self.backend.upload(build_weights(ckpt.config, ckpt.weights, ckpt.source))
            del ckpt
        self.max_context = min(cfg.max_context, max(self.model_config.max_position_embeddings, 2))
        self.kv_cache = cfg.kv_cache if cfg.kv_cache != "auto" else self.backend.default_kv_cache
        self._generator = Generator(self.model_config, Decoder(self.model_config, weights),
                                    self.backend, self.max_context, cfg.prefill_chunk,
                                    use_graphs=cfg.cuda_graphs, kv_dtype=self.kv_cache)  # type: ignore[arg-type]
        self.device_name = self.backend.device_name
        # Ids the sampler may produce: the tokenizer's, never the LM head's padding rows.
        tok_vocab = self.tokenizer.vocab_size if self.tokenizer else self.model_config.vocab_size
        self._valid_vocab = min(self.model_config.vocab_size, tok_vocab)
        if cfg.device_argmax and hasattr(self.backend, "argmax_vocab"):
            self.backend.argmax_vocab = self._valid_vocab                # before the first decode step
        tok_eos = set(self.tokenizer.eos_token_ids) if self.tokenizer else set()
        stop_ids = tok_eos | set(self.model_config.eos_token_ids)
        self._eos_ids = frozenset(i for i in stop_ids if i is not None)

    # --- chat text ---------------------------------------------------------------------
    def _thinking(self, enable_thinking: bool | None) -> bool:
        return self.engine_config.enable_thinking if enable_thinking is None else enable_thinking

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None, *,
                    enable_thinking: bool | None = None, add_generation_prompt: bool = True) -> str:
        return format_chat(self.tokenizer, messages, tools, self._thinking(enable_thinking),
                           add_generation_prompt)

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None, *,
                    enable_thinking: bool | None = None) -> list[int]:
        return self.tokenizer.encode(self.render_chat(messages, tools, enable_thinking=enable_thinking))

    def count_tokens(self, messages: list[dict], tools: list[dict] | None = None, *,
                     enable_thinking: bool | None = None) -> int:
        return len(self.encode_chat(messages, tools, enable_thinking=enable_thinking))

    # --- generation --------------------------------------------------------------------
    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError(f"{self.model_id} has no tokenizer: pass token ids")
            if not prompt.strip():
                raise InvalidRequestError("prompt is empty")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = [int(t) for t in prompt]
            bad = [t for t in ids if not 0 <= t < self.model_config.vocab_size]
            if bad:
                raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary")
        if not ids:
            raise InvalidRequestError("prompt is empty")
        if len(ids) >= self.max_context:
            raise ContextLengthExceededError(
                f"prompt has {len(ids)} tokens but the context holds {self.max_context} "
                f"(--max-context); shorten the prompt or raise the limit")
        return ids

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
               cancel: threading.Event | None = None) -> Iterator[StreamEvent]:
        """Yield one StreamEvent per generated token; the last has finished=True and timings."""
        params = (params or SamplingParams()).validate()
        t0 = time.perf_counter()
        ids = self._prompt_ids(prompt)
        return self._stream(ids, params, cancel, t0, self._turn_start(ids))

    def _turn_start(self, ids: list[int]) -> int | None:
        """Where the last chat turn starts (the last <|im_start|>): the next turn of the same
        conversation shares everything before it, so the engine snapshots state there."""
        marker = self.tokenizer.token_to_id("<|im_start|>") if self.tokenizer else None
        if marker is None:
            return None
        for i in range(len(ids) - 1, 0, -1):
            if ids[i] == marker:
                return i
        return None

    def _stream(self, ids: list[int], params: SamplingParams, cancel: threading.Event | None,
                t0: float, snapshot_at: int | None = None) -> Iterator[StreamEvent]:
        gen = self._generator
        timings = Timings(prompt_tokens=len(ids))
        sampler = Sampler(params, self._valid_vocab, seed=self.engine_config.seed)
        detok = IncrementalDetokenizer(self.tokenizer) if self.tokenizer else None
        stops = StopStringMatcher(params.stop)
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self._eos_ids))
        budget = min(params.max_tokens, self.max_context - len(ids))
        try:
            logits, timings.cached_tokens = gen.prefill(ids, snapshot_at)
        except BaseException:
            gen.forget()
            raise
        t_first = time.perf_counter()
        timings.prefill_s = t_first - t0
        finish = "length"
        n = 0
        # greedy, or temperature alone, without penalties: the next token is picked on the device
        # (Generator.decode_token: argmax / Gumbel-max); else the host samples the logits row
        pick = sampler.device_pick() if self.engine_config.device_argmax else None
        if pick is not None and pick[0] > 0.0 and not gen.picks_on_device(self._valid_vocab):
            pick = None                          # no decode graph (CPU): the host samples
        ahead = self.engine_config.decode_ahead
        nxt: int | None = None
        try:
            while True:
                token = sampler.sample(logits) if nxt is None else nxt
                n += 1
                if n == 1:                    # decode time runs from the first token on
                    t_first = time.perf_counter()
                    timings.ttft_s = t_first - t0
                sampler.observe(token)
                if token in stop_ids:
                    finish = "stop"
                    yield StreamEvent(token_id=token, text="")
                    break
                text = stops.push(detok.push(token)) if detok else ""
                yield StreamEvent(token_id=token, text=text)
                if stops.stopped:
                    finish = "stop"
                    break
                if n >= budget:
                    break
                if cancel is not None and cancel.is_set():
                    finish = "cancelled"
                    break
                if pick is not None:   # the step after the next token queued too, unless that token is the last
                    nxt = gen.decode_token(token, self._valid_vocab, ahead=ahead and n + 1 < budget,
                                           temperature=pick[0], seed=pick[1], offset=n)
                else:
                    logits = gen.decode(token)
        except GeneratorExit:
            raise
        except BaseException:
            gen.forget()
            raise
        tail = "" if stops.stopped or detok is None else stops.push(detok.flush()) + stops.flush()
        timings.completion_tokens = n
        timings.decode_s = time.perf_counter() - t_first if n > 1 else 0.0
        yield StreamEvent(token_id=None, text=tail, finished=True, finish_reason=finish,  # type: ignore[arg-type]
                          timings=timings)

    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> GenerationResult:
        ids = self._prompt_ids(prompt)                      # encoded once, reported back below
        text, tokens, final = [], [], None
        for ev in self.stream(ids, params):
            text.append(ev.text)
            if ev.token_id is not None:
                tokens.append(ev.token_id)
            if ev.finished:
                final = ev
        assert final is not None and final.timings is not None
        return GenerationResult(text="".join(text), token_ids=tokens,
                                finish_reason=final.finish_reason or "stop",
                                prompt_token_ids=ids, timings=final.timings)

    # --- chat --------------------------------------------------------------------------
    def chat_stream(self, messages: list[dict], tools: list[dict] | None = None,
                    params: SamplingParams | None = None, *, enable_thinking: bool | None = None,
                    cancel: threading.Event | None = None) -> Iterator[ChatDelta | StreamEvent]:
        """Deltas split into reasoning / content / tool calls, then the final StreamEvent.
        Non-final StreamEvents (one per token) are yielded too, for live token counting."""
        prompt = self.render_chat(messages, tools, enable_thinking=enable_thinking)
        events = self.stream(self.tokenizer.encode(prompt), params, cancel=cancel)
        return self._chat_events(events, ChatStreamParser(
            starts_in_reasoning=prompt_opens_reasoning(prompt), tools=tools))

    @staticmethod
    def _chat_events(events: Iterator[StreamEvent], parser: ChatStreamParser) -> Iterator[ChatDelta | StreamEvent]:
        for ev in events:
            if ev.text:
                yield from parser.push(ev.text)
            if ev.finished:
                yield from parser.finish()
                yield ev
            else:
                yield ev

    def chat(self, messages: list[dict], tools: list[dict] | None = None,
             params: SamplingParams | None = None, *, enable_thinking: bool | None = None) -> ChatResult:
        reasoning, content, calls, deltas, tokens = [], [], [], [], []
        final: StreamEvent | None = None
        texts = []
        for item in self.chat_stream(messages, tools, params, enable_thinking=enable_thinking):
            if isinstance(item, ChatDelta):
                deltas.append(item)
                if item.kind == "reasoning":
                    reasoning.append(item.text)
                elif item.kind == "content":
                    content.append(item.text)
                elif item.tool_call is not None:
                    calls.append(item.tool_call)
            else:
                texts.append(item.text)
                if item.token_id is not None:
                    tokens.append(item.token_id)
                if item.finished:
                    final = item
        assert final is not None and final.timings is not None
        result = GenerationResult(text="".join(texts), token_ids=tokens,
                                  finish_reason=final.finish_reason or "stop",
                                  timings=final.timings)
        return ChatResult("".join(reasoning), "".join(content), calls, result, deltas)

    # --- introspection -----------------------------------------------------------------
    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits at every position, [len(token_ids), vocab] float32 (no cache reuse)."""
        ids = [int(t) for t in token_ids]
        if not ids:
            raise InvalidRequestError("token_ids is empty")
        return np.asarray(self._generator.logits_all(ids), dtype=np.float32)

    def stats(self) -> dict[str, Any]:
        used, total = self.backend.memory_info()
        state = self._generator.state
        kv_total = state.kv_bytes()
        ctx = len(self._generator.tokens)
        return {
            "context_tokens": ctx,
            "max_context": self.max_context,
            "kv_cache": self.kv_cache,
            "kv_cache_bytes": kv_total,
            "kv_cache_used_bytes": int(kv_total * ctx / max(self.max_context, 1)),
            "state_bytes": state.nbytes(),
            "device": self.device_name,
            "device_memory_used": used,
            "device_memory_total": total,
            "model_id": self.model_id,
            "architecture": self.model_config.architecture,
        }
