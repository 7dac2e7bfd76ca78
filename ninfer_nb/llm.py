"""The Python front door: `LLM` loads a model and generates; `SamplingParams` says how.

    llm = LLM()                                   # default model: SmolLM2-135M-Instruct
    print(llm.chat([{"role": "user", "content": "Hi"}]).content)

`LLM` owns one model on one backend and an `LLMEngine` (engine/llm_engine.py) that runs the
token loop in requests and steps, with prefix reuse across calls. This module is the text edge:
prompts to ids, ids back to text, stop strings (which finish the request through the engine),
chat templates and parsing (from `chat/`). It is not thread-safe: one thread calls it
(front-ends use `engine.worker.EngineWorker`).
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from .chat import ChatDelta, ChatStreamParser, IncrementalDetokenizer, ToolCall, format_chat, prompt_opens_reasoning
from .config import KV_CACHE_KINDS, EngineConfig
from .engine.backend import create_backend
from .engine.kv_pages import pages_for
from .engine.llm_engine import LLMEngine
from .engine.request import Request, RequestOutput, RequestStatus
from .engine.spec.adaptive import AdaptiveK
from .errors import ContextLengthExceededError, InvalidRequestError
from .models import Decoder, build_weights
from .models.loader import load_checkpoint
from .models.presets import preset_config
from .models.state import PAGE_SIZE, KVDtype, gdn_bytes_per_slot, kv_bytes_per_token
from .outputs import FinishReason, GenerationResult, StreamEvent, Timings
from .params import SamplingParams
from .stops import StopStringMatcher

if TYPE_CHECKING:
    from .structured import Constraint

__all__ = ["LLM", "SamplingParams", "ChatResult"]

log = logging.getLogger("ninfer")

RANDOM_PREFIX = "random:"


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
                 kv_cache: str = "auto", show_progress: bool = False, spec: str = "off",
                 draft_tokens: int | str = 3, max_concurrency: int | None = None,
                 prefix_cache: bool = True, host_cache_mib: int = 0, kv_cache_fraction: float = 0.9,
                 config: EngineConfig | None = None) -> None:
        """`config` replaces every other argument (bench and tests pass kernel / decode choices
        through it). max_concurrency: requests decoding at once (None: the backend's default,
        `default_concurrency`). draft_tokens: K, or "auto" / "auto:K" (K from the measured
        acceptance, up to 5 / K). prefix_cache: prefixes shared across requests (paged lanes);
        host_cache_mib: host memory its evicted pages move to; kv_cache_fraction: the share of the
        device memory left after the weights that the KV page pool takes (CUDA, paged lanes)."""
        try:
            draft_k, adaptive = AdaptiveK.parse(draft_tokens)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from exc
        cfg = config or EngineConfig(model=model, device=device, max_context=max_context,
                                     prefill_chunk=prefill_chunk, enable_thinking=enable_thinking,
                                     cuda_graphs=cuda_graphs, kv_cache=kv_cache,
                                     show_progress=show_progress, spec=spec, draft_tokens=draft_k,
                                     adaptive_draft=adaptive, max_concurrency=max_concurrency,
                                     prefix_cache=prefix_cache, host_cache_mib=host_cache_mib,
                                     kv_cache_fraction=kv_cache_fraction)
        if cfg.kv_cache not in KV_CACHE_KINDS:
            raise InvalidRequestError(f"kv_cache must be auto, fp32, bf16 or int8, got {cfg.kv_cache!r}")
        if cfg.weights is not None and not (cfg.model or "").startswith(RANDOM_PREFIX):
            raise InvalidRequestError("weights: a format for random:PRESET models only "
                                      "(a checkpoint loads in its own format)")
        if cfg.max_context < 2:
            raise InvalidRequestError(f"max_context must be >= 2, got {cfg.max_context}")
        if cfg.host_cache_mib < 0:
            raise InvalidRequestError(f"host_cache_mib must be >= 0, got {cfg.host_cache_mib}")
        if cfg.max_concurrency is not None and cfg.max_concurrency < 1:
            raise InvalidRequestError(f"max_concurrency must be >= 1, got {cfg.max_concurrency}")
        self.engine_config = cfg
        self.backend = create_backend(cfg.device, choices=cfg.kernels)
        if cfg.model is not None and cfg.model.startswith(RANDOM_PREFIX):
            # Benchmark shapes with random weights built on the device; token ids only.
            preset = cfg.model[len(RANDOM_PREFIX):]
            self.model_config = preset_config(preset)
            self.tokenizer: Any = None
            self.model_id = self.source = cfg.model
            self.backend.check_model(self.model_config)
            weights = self.backend.random_weights(self.model_config, seed=cfg.seed or 0, weights=cfg.weights)
        else:
            ckpt = load_checkpoint(cfg.model, show_progress=cfg.show_progress)
            if ckpt.tokenizer is None:
                raise InvalidRequestError(f"{ckpt.source}: no tokenizer found")
            self.tokenizer = ckpt.tokenizer
            self.model_config = ckpt.config
            self.model_id = ckpt.name
            self.source = ckpt.source
            self.backend.check_model(ckpt.config)        # shapes the backend's kernels cannot run
            # each layer goes to the backend as soon as it is built (host holds one at a time)
            weights = build_weights(ckpt.config, ckpt.weights, ckpt.source, place=self.backend.upload)
            del ckpt
        self.max_context = min(cfg.max_context, max(self.model_config.max_position_embeddings, 2))
        self.kv_cache = cfg.kv_cache if cfg.kv_cache != "auto" else self.backend.default_kv_cache
        self.device_name = self.backend.device_name
        self.max_concurrency = cfg.max_concurrency or default_concurrency(
            self.backend.name, self.backend.cache_budget(), gdn_bytes_per_slot(self.model_config))
        # n-gram speculation runs on batched lanes while a request runs alone; MTP needs the
        # one-sequence graphs
        if self.max_concurrency > 1 and cfg.spec == "mtp" and self.backend.decode_graphs:
            if cfg.max_concurrency is None:
                self.max_concurrency = 1
                log.warning("ninfer: --spec %s runs one request at a time on %s (max_concurrency 1)",
                            cfg.spec, self.backend.name)
            else:
                log.warning("ninfer: --spec %s does not run on batched lanes (max_concurrency %d) on %s: "
                            "plain decoding", cfg.spec, self.max_concurrency, self.backend.name)
        # Ids the sampler may produce: the tokenizer's, never the LM head's padding rows.
        tok_vocab = self.tokenizer.vocab_size if self.tokenizer else self.model_config.vocab_size
        tok_eos = set(self.tokenizer.eos_token_ids) if self.tokenizer else set()
        stop_ids = tok_eos | set(self.model_config.eos_token_ids)
        self.engine = LLMEngine(
            self.model_config, Decoder(self.model_config, weights), self.backend,
            max_context=self.max_context, prefill_chunk=cfg.prefill_chunk,
            valid_vocab=min(self.model_config.vocab_size, tok_vocab),
            eos_ids=frozenset(i for i in stop_ids if i is not None), use_graphs=cfg.cuda_graphs,
            kv_dtype=_kv_dtype(self.kv_cache), seed=cfg.seed, decode=cfg.decode,
            spec=cfg.spec, draft_tokens=cfg.draft_tokens, adaptive_draft=cfg.adaptive_draft,
            max_concurrency=self.max_concurrency, kv_pages=self._kv_pool_pages(cfg),
            prefix_cache=cfg.prefix_cache, prefix_snapshots=cfg.prefix_snapshots,
            host_cache_mib=cfg.host_cache_mib)
        self._request_ids = itertools.count()
        self._outputs: dict[str, collections.deque[RequestOutput]] = {}   # per request, not yet read

    def _kv_pool_pages(self, cfg: EngineConfig) -> int | None:
        """The KV page pool of paged lanes: `kv_pages` when given; else, on a device with a memory
        budget, `kv_cache_fraction` of what is left after the weights (less the GDN slots),
        at least one full context (like vLLM's gpu_memory_utilization); else None (every lane's
        full context, the CPU)."""
        free = self.backend.cache_budget() if cfg.kv_pages is None and self.max_concurrency > 1 else None
        if free is None:
            return cfg.kv_pages
        if not 0.0 < cfg.kv_cache_fraction <= 1.0:
            raise InvalidRequestError(f"kv_cache_fraction must be in (0, 1], got {cfg.kv_cache_fraction}")
        c = self.max_concurrency
        slots = 2 * c + (cfg.prefix_snapshots if cfg.prefix_snapshots is not None else 2 * c + 4)
        left = int(free * cfg.kv_cache_fraction)
        budget = left - slots * gdn_bytes_per_slot(self.model_config)
        page = PAGE_SIZE * kv_bytes_per_token(self.model_config, _kv_dtype(self.kv_cache))
        return max(pages_for(self.max_context), budget // page)

    @property
    def valid_vocab(self) -> int:
        """Ids the model may generate (the tokenizer's vocabulary, not the LM head's padding)."""
        return self.engine.valid_vocab

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
               cancel: threading.Event | None = None,
               constraint: Constraint | None = None) -> Iterator[StreamEvent]:
        """Yield one StreamEvent per generated token; the last has finished=True and timings.
        `constraint` (ninfer_nb.structured.compile_constraint) restricts the tokens to a grammar."""
        params = (params or SamplingParams()).validate()
        t0 = time.perf_counter()
        ids = self._prompt_ids(prompt)
        request = Request(f"req-{next(self._request_ids)}", ids, params, turn_start=self._turn_start(ids),
                          cancel=cancel or threading.Event(), arrival_time=t0, constraint=constraint)
        return self._stream(request)

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

    def _stream(self, request: Request) -> Iterator[StreamEvent]:
        """Step the engine until `request` finishes; its tokens become text here (detokenizer,
        stop strings: a stop string finishes the request through the engine)."""
        engine, rid = self.engine, request.request_id
        detok = IncrementalDetokenizer(self.tokenizer) if self.tokenizer else None
        stops = StopStringMatcher(request.params.stop)
        engine.add_request(request)             # on the first next(): an unread stream queues nothing
        self._outputs[rid] = collections.deque()
        finish: FinishReason | None = None
        timings: Timings | None = None
        n_out = 0                               # tokens yielded (index into request.logprobs)
        try:
            while finish is None:
                out = self._next_output(rid)
                for i, token in enumerate(out.new_token_ids):
                    lp = request.logprobs[n_out] if n_out < len(request.logprobs) else None
                    n_out += 1
                    if out.finish_reason == "stop" and i == len(out.new_token_ids) - 1:
                        yield StreamEvent(token_id=token, text="", logprobs=lp)   # the stop token: no text
                        continue
                    yield StreamEvent(token_id=token, text=stops.push(detok.push(token)) if detok else "",
                                      logprobs=lp)
                    if stops.stopped:
                        final = engine.finish(rid, RequestStatus.FINISHED_STOPPED)
                        finish, timings = "stop", (final or out).timings
                        break
                if finish is None and out.finished:
                    if out.error is not None:           # a step of another stream's turn ended it
                        raise out.error
                    finish, timings = out.finish_reason, out.timings
        finally:
            self._outputs.pop(rid, None)
            if not request.finished:            # the caller closed the stream early
                engine.abort(rid)
        tail = "" if stops.stopped or detok is None else stops.push(detok.flush()) + stops.flush()
        yield StreamEvent(token_id=None, text=tail, finished=True, finish_reason=finish, timings=timings)

    def _next_output(self, request_id: str) -> RequestOutput:
        """The next engine output for this request, stepping the engine as needed (outputs of
        other requests are kept for their own streams)."""
        queue = self._outputs[request_id]
        while not queue:
            if not self.engine.has_unfinished_requests():
                raise RuntimeError(f"{request_id}: the engine finished it without a final output")
            for out in self.engine.step():
                if out.request_id in self._outputs:          # else its stream has ended
                    self._outputs[out.request_id].append(out)
        return queue.popleft()

    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                 constraint: Constraint | None = None) -> GenerationResult:
        ids = self._prompt_ids(prompt)                      # encoded once, reported back below
        text, tokens, final = [], [], None
        for ev in self.stream(ids, params, constraint=constraint):
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
                    cancel: threading.Event | None = None,
                    constraint: Constraint | None = None) -> Iterator[ChatDelta | StreamEvent]:
        """Deltas split into reasoning / content / tool calls, then the final StreamEvent.
        Non-final StreamEvents (one per token) are yielded too, for live token counting."""
        prompt = self.render_chat(messages, tools, enable_thinking=enable_thinking)
        events = self.stream(self.tokenizer.encode(prompt), params, cancel=cancel, constraint=constraint)
        return self._chat_events(events, ChatStreamParser(
            starts_in_reasoning=prompt_opens_reasoning(prompt), tools=tools,
            dialect=self.tokenizer.tool_dialect))

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
             params: SamplingParams | None = None, *, enable_thinking: bool | None = None,
             constraint: Constraint | None = None) -> ChatResult:
        reasoning, content, calls, deltas, tokens = [], [], [], [], []
        final: StreamEvent | None = None
        texts = []
        for item in self.chat_stream(messages, tools, params, enable_thinking=enable_thinking,
                                     constraint=constraint):
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
        return np.asarray(self.engine.logits_all(ids), dtype=np.float32)

    def stats(self) -> dict[str, Any]:
        used, total = self.backend.memory_info()
        state = self.engine.generator.state
        kv_total = state.kv_bytes()
        ctx = self.engine.context_tokens
        sched, cache = self.engine.scheduler, self.engine.prefix_cache
        # a page pool: the pages held (running requests and idle lanes' cached prefixes)
        kv_used = (int(kv_total * sched.usage()) if sched.allocator is not None
                   else int(kv_total * ctx / max(self.max_context, 1)))
        return {
            "context_tokens": ctx,
            "max_context": self.max_context,
            "kv_cache": self.kv_cache,
            "kv_cache_bytes": kv_total,
            "kv_cache_used_bytes": kv_used,
            "state_bytes": kv_total + state.gdn_slot_bytes(),       # the KV cache + one GDN slot
            "max_concurrency": self.max_concurrency,
            "num_requests_running": self.engine.num_running,
            "num_requests_waiting": self.engine.num_waiting,
            "num_preemptions": sched.preemptions,
            # prompt tokens looked up in / served by the prefix cache, and computed by prefill
            "prefix_cache_queries": cache.query_tokens if cache is not None else 0,
            "prefix_cache_hits": cache.hit_tokens if cache is not None else 0,
            "prefix_cache_pages": cache.num_pages if cache is not None else 0,
            "prefill_tokens": self.engine.prefill_tokens,
            "decode_batch_sizes": dict(self.engine.batch_sizes),    # rows per decode round -> rounds
            "device": self.device_name,
            "device_memory_used": used,
            "device_memory_total": total,
            "model_id": self.model_id,
            "architecture": self.model_config.architecture,
            **self.engine.spec_stats.as_metrics(),
        }


DEFAULT_CPU_CONCURRENCY = 8
# CUDA: batched lanes (decode rounds queued ahead, so one request alone runs as fast as on the
# one-sequence graph; a second client's first token waits one prefill chunk, not a whole
# generation), as many as fit: every lane's GDN state slots (running + verify, and as many
# prefix-cache snapshots, engine defaults) take at most GDN_SLOT_SHARE of the device memory
# left after the weights. --max-concurrency 1: the one-sequence path.
DEFAULT_CUDA_CONCURRENCY = 16
GDN_SLOT_SHARE = 0.25


def default_concurrency(backend: str, budget: int | None = None, slot_bytes: int = 0) -> int:
    """Requests decoding at once when the user did not say: on CUDA DEFAULT_CUDA_CONCURRENCY,
    fewer where the GDN slots of that many lanes would take more than GDN_SLOT_SHARE of
    `budget` (bytes free after the weights; slot_bytes: one slot, 0 for a model without GDN);
    DEFAULT_CPU_CONCURRENCY on the CPU (NumPy reads each weight once per round)."""
    if backend != "cuda":
        return DEFAULT_CPU_CONCURRENCY
    if budget is None or slot_bytes <= 0:
        return DEFAULT_CUDA_CONCURRENCY
    fit = int(budget * GDN_SLOT_SHARE // slot_bytes - 4) // 4      # 4 c + 4 slots for c lanes
    return max(1, min(DEFAULT_CUDA_CONCURRENCY, fit))


_KV_DTYPES: dict[str, KVDtype] = {"fp32": "fp32", "bf16": "bf16", "int8": "int8"}


def _kv_dtype(kind: str) -> KVDtype:
    if kind not in _KV_DTYPES:
        raise InvalidRequestError(f"kv_cache must be auto, fp32, bf16 or int8, got {kind!r}")
    return _KV_DTYPES[kind]
