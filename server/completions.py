"""POST /v1/completions (OpenAI legacy Completions) and vLLM's /tokenize and /detokenize.

A completion continues raw text (no chat template): `prompt` is a string, an array of strings,
an array of token ids or an array of those; each prompt gets `n` choices (index = prompt * n +
choice), each its own engine request (the prefix cache makes the prompt cheap after the first).
`echo` prepends the prompt; with `logprobs`, the prompt tokens' logprobs come first (the first
token's is null), computed from a full forward over the prompt (`LLM.logits`), which is what
log-likelihood evaluation (lm-evaluation-harness) asks for. `suffix` and `best_of` > 1 are
refused. Knows the engine through `stream(ids, params, cancel=)`, `logits(ids)` and its
tokenizer.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ninfer_nb.engine.logprobs import MAX_TOP_LOGPROBS, TokenLogprobs, prompt_logprobs
from ninfer_nb.outputs import StreamEvent
from ninfer_nb.params import SamplingParams

from .engine import ChatEngine
from .errors import BadRequest
from .fields import MAX_SEED, Fields, read_json
from .generation import (
    ChoiceEnd,
    Delta,
    Event,
    Finished,
    Generation,
    KeepAlive,
    Started,
    check_context,
    choice_params,
    run_choices,
    text_events,
)
from .logprobs_json import TokenTexts, completion_logprobs, merge_completion_logprobs
from .openai_chat import end_stream_with_error
from .openai_input import parse_n, penalty_fields
from .prompt import Prompt
from .route_fields import check_fields
from .sse import SSEWriter
from .state import STATE, ServerState, new_id, trace_of

DEFAULT_MAX_TOKENS = 16          # OpenAI's default for completions
MAX_CHOICES = 256                # prompts x n in one request
# echo + logprobs holds the logits of every prompt position on the host at once ([T, V] fp32):
# a prompt is refused past this many bytes of them (248K vocabulary: ~2160 tokens)
MAX_PROMPT_LOGITS_BYTES = 2 << 30
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "stop", "cancelled": "stop"}


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: list[str | list[int]]
    params: SamplingParams
    n: int
    echo: bool
    logprobs: int | None
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class PromptLogprobs:
    """The echoed prompt's token logprobs (first None), sent before the choices' tokens."""

    prompt_index: int
    ids: list[int]
    logprobs: list[TokenLogprobs | None]


def _prompts(raw: Any) -> list[str | list[int]]:
    """`prompt`: a string, an array of strings, of token ids, or of arrays of token ids."""
    def ids(v: Any, where: str) -> list[int]:
        if not v or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            raise BadRequest(f"{where} must be a non-empty array of token ids", param=where)
        return list(v)

    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw:
        if all(isinstance(p, str) for p in raw):
            return list(raw)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in raw):
            return [ids(raw, "prompt")]
        if all(isinstance(p, list) for p in raw):
            return [ids(p, f"prompt[{i}]") for i, p in enumerate(raw)]
    raise BadRequest("prompt must be a string, an array of strings, an array of token ids or "
                     "an array of arrays of token ids", param="prompt")


def parse_completion_request(state: ServerState, body: dict[str, Any]) -> CompletionRequest:
    f = Fields(body)
    check_fields("/v1/completions", body)
    model = f.string("model")
    state.check_model(model)
    if f.has("suffix") and f.raw("suffix") != "":
        raise BadRequest("suffix (fill-in-the-middle) is not supported", param="suffix",
                         code="suffix_not_supported")
    if not f.has("prompt"):
        raise BadRequest("prompt is required", param="prompt")
    prompts = _prompts(f.raw("prompt"))
    n = parse_n(f)
    echo = bool(f.boolean("echo", False))
    max_tokens = f.integer("max_tokens", DEFAULT_MAX_TOKENS, minimum=0)
    assert max_tokens is not None
    if max_tokens == 0 and not echo:
        raise BadRequest("max_tokens must be >= 1 (0 only with echo)", param="max_tokens")
    logprobs = f.integer("logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS)
    stream_opts = f.object("stream_options") or {}
    params = state.sampling(
        max(max_tokens, 1),
        stop=f.stop("stop"),
        temperature=f.number("temperature", lo=0.0, hi=2.0),
        top_p=f.number("top_p", lo=0.0, hi=1.0),
        top_k=f.integer("top_k", minimum=0),
        min_p=f.number("min_p", lo=0.0, hi=1.0),
        presence_penalty=f.number("presence_penalty", lo=-2.0, hi=2.0),
        frequency_penalty=f.number("frequency_penalty", lo=-2.0, hi=2.0),
        seed=f.integer("seed", minimum=0, maximum=MAX_SEED),
        ignore_eos=f.boolean("ignore_eos"),
        logprobs=logprobs,
        **penalty_fields(f, getattr(state.engine, "valid_vocab", None)),
    )
    if max_tokens == 0:
        params = params.replace(max_tokens=0)        # echo only: no engine request
    return CompletionRequest(model or state.model_id, prompts, params, n, echo, logprobs,
                             bool(f.boolean("stream", False)),
                             bool(stream_opts.get("include_usage", False)))


def _encode(engine: ChatEngine, prompts: list[str | list[int]]) -> list[list[int]]:
    """Token ids of every prompt (on the prompt threads): text with the tokenizer's special
    tokens (BOS where the model has one), ids checked against the vocabulary."""
    tok: Any = engine.tokenizer
    vocab = getattr(getattr(engine, "model_config", None), "vocab_size", None)
    out = []
    for i, p in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if isinstance(p, str):
            if not p:
                raise BadRequest(f"{where} is empty", param=where)
            try:
                ids = tok.encode(p, add_special_tokens=True)
            except TypeError:                             # a tokenizer without the flag
                ids = tok.encode(p)
        else:
            ids = p
            if vocab is not None and any(not 0 <= t < vocab for t in ids):
                raise BadRequest(f"{where} holds a token id outside [0, {vocab})", param=where)
        out.append(list(ids))
    return out


def completion_job(engine: Any, prompts: list[list[int]], req: CompletionRequest) -> Any:
    """The engine-thread body: prompt logprobs for echo, then every choice of every prompt."""

    def run(cancel: threading.Event) -> Iterator[Event | PromptLogprobs]:
        if req.echo and req.logprobs is not None:
            for pi, ids in enumerate(prompts):
                lps = prompt_logprobs(engine.logits(ids), ids, req.logprobs, engine.valid_vocab)
                yield PromptLogprobs(pi, ids, lps)
        total = sum(len(ids) for ids in prompts)
        if req.params.max_tokens == 0:                  # echo only
            yield Started(total)
            ends = tuple(ChoiceEnd(i, "length", 0) for i in range(len(prompts) * req.n))
            yield Finished("length", total, 0, choices=ends)
            return
        choices: list[tuple[SamplingParams, Iterator[Any]]] = []
        for ids in prompts:
            room = max(1, engine.max_context - len(ids))
            base = req.params.replace(max_tokens=min(req.params.max_tokens, room))
            for i in range(req.n):
                p = choice_params(base, i)
                events: Iterator[StreamEvent] = engine.stream(ids, p, cancel=cancel)
                choices.append((p, text_events(events)))
        yield from run_choices(engine, choices, total)

    return run


@dataclass
class _Choice:
    text: str = ""
    logprobs: dict[str, Any] | None = None
    finish: str | None = None


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    req = parse_completion_request(state, await read_json(request))
    trace_of(request).note(protocol="openai.completions", model=req.model, stream=req.stream)
    engine: Any = state.engine
    if not hasattr(engine, "stream") or not hasattr(engine, "logits"):
        raise BadRequest("this engine serves chat only", param="prompt")
    if len(req.prompts) * req.n > MAX_CHOICES:
        raise BadRequest(f"{len(req.prompts)} prompts x n={req.n} exceeds {MAX_CHOICES} choices",
                         param="prompt")
    prompts = await state.prompts.run(_encode, engine, req.prompts)
    vocab = int(getattr(engine, "valid_vocab", 0) or 0)
    for ids in prompts:
        check_context(engine, Prompt("", ids))
        if req.echo and req.logprobs is not None and len(ids) * vocab * 4 > MAX_PROMPT_LOGITS_BYTES:
            raise BadRequest(f"echo with logprobs takes prompts of at most "
                             f"{MAX_PROMPT_LOGITS_BYTES // (4 * vocab)} tokens here; this one has "
                             f"{len(ids)}", param="prompt")
    texts = TokenTexts(engine.tokenizer)
    echoes = [p if isinstance(p, str) else await state.prompts.run(engine.tokenizer.decode, p)
              for p in req.prompts] if req.echo else []
    gen = state.start_job(request, completion_job(engine, prompts, req))
    async with gen:
        if req.stream:
            return await _stream(request, gen, req, texts, echoes)
        choices: dict[int, _Choice] = {}
        prompt_lps: dict[int, dict[str, Any]] = {}
        async for ev in gen.events():
            if isinstance(ev, PromptLogprobs):
                prompt_lps[ev.prompt_index] = completion_logprobs(ev.logprobs, ev.ids, texts)
            elif isinstance(ev, Delta):
                c = choices.setdefault(ev.index, _Choice())
                _add_logprobs(c, ev.logprobs, texts, req, len(c.text))
                c.text += ev.text
            elif isinstance(ev, ChoiceEnd):
                c = choices.setdefault(ev.index, _Choice())
                _add_logprobs(c, ev.logprobs, texts, req, len(c.text))
                c.finish = _FINISH[ev.reason]
    fin = gen.finished
    if fin is None:
        raise RuntimeError("the generation ended without a final event")
    out = []
    for index in range(len(prompts) * req.n):
        c = choices.get(index, _Choice(finish="length"))
        pi = index // req.n
        text, lps = c.text, c.logprobs
        if req.echo:
            text = echoes[pi] + text
            if req.logprobs is not None:
                lps = _shifted(prompt_lps[pi], lps, len(echoes[pi]))
        elif req.logprobs is not None and lps is None:
            lps = completion_logprobs([], [], texts)
        out.append({"text": text, "index": index, "logprobs": lps,
                    "finish_reason": c.finish or "length"})
    return web.json_response({
        "id": new_id("cmpl-"), "object": "text_completion", "created": int(time.time()),
        "model": req.model, "choices": out, "usage": _usage(fin),
    })


def _add_logprobs(c: _Choice, lps: tuple[TokenLogprobs, ...], texts: TokenTexts,
                  req: CompletionRequest, offset: int) -> None:
    if req.logprobs is None or not lps:
        return
    part = completion_logprobs(list(lps), [lp.token_id for lp in lps], texts, offset)
    c.logprobs = merge_completion_logprobs(c.logprobs, part)


def _shifted(prompt: dict[str, Any], gen: dict[str, Any] | None, by: int) -> dict[str, Any]:
    """The prompt's logprobs, then the generated ones with their offsets moved past the echo."""
    if gen is None:
        return prompt
    moved = {**gen, "text_offset": [o + by for o in gen["text_offset"]]}
    return merge_completion_logprobs(prompt, moved)


def _usage(fin: Finished) -> dict[str, Any]:
    return {"prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
            "total_tokens": fin.total_tokens}


async def _stream(request: web.Request, gen: Generation, req: CompletionRequest,
                  texts: TokenTexts, echoes: list[str]) -> web.StreamResponse:
    sse = SSEWriter(request)
    head = {"id": new_id("cmpl-"), "object": "text_completion", "created": int(time.time()),
            "model": req.model}
    offsets: dict[int, int] = {}          # characters sent per choice (text_offset)

    def chunk(index: int, text: str, logprobs: dict[str, Any] | None,
              finish: str | None = None) -> dict[str, Any]:
        body = {**head, "choices": [{"text": text, "index": index, "logprobs": logprobs,
                                     "finish_reason": finish}]}
        if req.include_usage:
            body["usage"] = None
        return body

    def lp_json(index: int, lps: tuple[TokenLogprobs, ...]) -> dict[str, Any] | None:
        if req.logprobs is None:
            return None
        return completion_logprobs(list(lps), [lp.token_id for lp in lps], texts,
                                   offsets.get(index, 0))

    try:
        async for ev in gen.events():
            if isinstance(ev, KeepAlive):
                await sse.comment()
            elif isinstance(ev, PromptLogprobs):
                for i in range(req.n):
                    index = ev.prompt_index * req.n + i
                    await sse.send(chunk(index, echoes[ev.prompt_index],
                                         completion_logprobs(ev.logprobs, ev.ids, texts)))
                    offsets[index] = len(echoes[ev.prompt_index])
            elif isinstance(ev, Started):
                if req.echo and req.logprobs is None:
                    for index in range(len(echoes) * req.n):
                        await sse.send(chunk(index, echoes[index // req.n], None))
                        offsets[index] = len(echoes[index // req.n])
            elif isinstance(ev, Delta):
                body = chunk(ev.index, ev.text, lp_json(ev.index, ev.logprobs))
                offsets[ev.index] = offsets.get(ev.index, 0) + len(ev.text)
                await sse.send(body)
            elif isinstance(ev, ChoiceEnd):
                lps = lp_json(ev.index, ev.logprobs) if ev.logprobs else None
                await sse.send(chunk(ev.index, "", lps, _FINISH[ev.reason]))
            elif isinstance(ev, Finished) and req.include_usage:
                await sse.send({**head, "choices": [], "usage": _usage(ev)})
    except ConnectionError:
        raise
    except Exception as exc:
        if not sse.prepared:
            raise
        trace_of(request).failed(exc)
        await end_stream_with_error(sse, exc)
        return await sse.close()
    await sse.done()
    return await sse.close()


# --- /tokenize, /detokenize (vLLM's shapes) ---------------------------------------------------
async def tokenize(request: web.Request) -> web.Response:
    """`{prompt, add_special_tokens?}` or `{messages, add_generation_prompt?, ...}` ->
    `{count, max_model_len, tokens, token_strs}`."""
    state = request.app[STATE]
    body = await read_json(request)
    check_fields("/tokenize", body)
    f = Fields(body)
    if f.has("model"):
        state.check_model(f.string("model"))
    engine: Any = state.engine
    if f.has("messages"):
        from .openai_input import parse_messages  # the chat route's message rules

        messages = parse_messages(f.array("messages") or [])
        thinking = f.boolean("enable_thinking")
        if thinking is None:
            thinking = state.config.enable_thinking
        if f.boolean("add_generation_prompt", True) is False:
            raise BadRequest("add_generation_prompt: false is not supported",
                             param="add_generation_prompt")
        ids = (await state.prompts.build(messages, None, thinking)).ids
    elif f.has("prompt"):
        text = f.string("prompt") or ""
        special = f.boolean("add_special_tokens", True)

        def enc() -> list[int]:
            try:
                return list(engine.tokenizer.encode(text, add_special_tokens=bool(special)))
            except TypeError:
                return list(engine.tokenizer.encode(text))

        ids = await state.prompts.run(enc)
    else:
        raise BadRequest("prompt or messages is required", param="prompt")
    strs = None
    if f.boolean("return_token_strs", False):
        texts = TokenTexts(engine.tokenizer)
        strs = [texts(i) for i in ids]
    return web.json_response({"count": len(ids), "max_model_len": engine.max_context,
                              "tokens": ids, "token_strs": strs})


async def detokenize(request: web.Request) -> web.Response:
    """`{tokens: [ids]}` -> `{prompt: text}`."""
    state = request.app[STATE]
    body = await read_json(request)
    check_fields("/detokenize", body)
    f = Fields(body)
    if f.has("model"):
        state.check_model(f.string("model"))
    raw = f.array("tokens", required=True) or []
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in raw):
        raise BadRequest("tokens must be an array of token ids", param="tokens")
    vocab = getattr(getattr(state.engine, "model_config", None), "vocab_size", None)
    if vocab is not None and any(t >= vocab for t in raw):
        raise BadRequest(f"tokens holds an id outside [0, {vocab})", param="tokens")
    text = await state.prompts.run(state.engine.tokenizer.decode, list(raw))
    return web.json_response({"prompt": text})


async def tokenizer_info(request: web.Request) -> web.Response:
    """GET /tokenizer_info (vLLM's): the special tokens and the chat template, which remote
    tokenizer clients (lm-evaluation-harness) read with /tokenize and /detokenize."""
    state = request.app[STATE]
    tok: Any = state.engine.tokenizer
    return web.json_response({
        "tokenizer_class": type(tok).__name__,
        "eos_token": getattr(tok, "eos_token", None),
        "bos_token": getattr(tok, "bos_token", None),
        "pad_token": None,
        "chat_template": getattr(tok, "chat_template", None),
        "model_max_length": state.engine.max_context,
    })
