"""`ninfer-serve` command line → ServerConfig (+ engine settings). Parsing only; no I/O.

Flags follow serving-api.md §14; sampling flags set the server-wide defaults that request
fields override.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence

from ninfer_nb.config import KV_CACHE_KINDS

from .config import SamplingDefaults, ServerConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ninfer-serve",
        description="Serve a model over OpenAI Chat Completions / Responses and Anthropic "
                    "Messages. With no MODEL, serves the default embedded model.",
    )
    p.add_argument("model", nargs="?", default=None,
                   help="Hugging Face checkpoint directory or .gguf file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--model-id", default=None, help="served model name (default: the model's)")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` or `x-api-key: KEY`")
    p.add_argument("--max-context", type=int, default=4096, help="tokens per request")
    p.add_argument("--prefill-chunk", type=int, default=1024)
    p.add_argument("--kv-cache", choices=list(KV_CACHE_KINDS), default="auto",
                   help="KV cache storage (default auto: bf16 on CUDA, fp32 on the CPU; int8: one scale per 64 values)")
    p.add_argument("--default-max-tokens", type=int, default=8192,
                   help="output limit when a request gives none")
    p.add_argument("--max-pending", type=int, default=16,
                   help="requests allowed to wait behind the running ones (then 429)")
    p.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                   help="requests generating at once (default: 8 on the CPU; up to 16 on CUDA, sized by memory)")
    p.add_argument("--spec", choices=["off", "ngram", "mtp"], default="off",
                   help="speculative decoding: ngram = prompt lookup; mtp = the checkpoint's MTP head")
    p.add_argument("--draft-tokens", default="3", metavar="K|auto|auto:K",
                   help="draft tokens per verify round (--spec); auto: K from the measured acceptance "
                        "(up to 5, or K)")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="no prefix shared across requests (the prefix cache of paged lanes)")
    p.add_argument("--host-cache-mib", type=int, default=0, metavar="N",
                   help="host memory the prefix cache moves evicted pages and snapshots to (0: none)")
    p.add_argument("--kv-cache-fraction", type=float, default=0.9, metavar="F",
                   help="share of the device memory left after the weights that the KV page pool takes "
                        "(CUDA, paged lanes)")
    p.add_argument("--max-request-mib", type=float, default=32.0, help="request body limit")
    p.add_argument("--cors", action="store_true", help="allow any origin (OPTIONS → 204)")
    p.add_argument("--no-thinking", action="store_true", help="thinking off by default")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--request-log", default=None, metavar="FILE",
                   help="append one JSON line per request event")
    p.add_argument("--no-warmup", action="store_true", help="skip the start-up warm-up request")
    p.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGINT/SIGTERM, seconds running requests get to finish")
    s = SamplingDefaults()
    p.add_argument("--temperature", type=float, default=s.temperature)
    p.add_argument("--top-p", type=float, default=s.top_p)
    p.add_argument("--top-k", type=int, default=s.top_k)
    p.add_argument("--min-p", type=float, default=s.min_p)
    p.add_argument("--presence-penalty", type=float, default=s.presence_penalty)
    p.add_argument("--frequency-penalty", type=float, default=s.frequency_penalty)
    p.add_argument("--seed", type=int, default=None)
    return p


def parse_args(argv: Sequence[str] | None = None) -> ServerConfig:
    parser = build_parser()
    a = parser.parse_args(argv)
    if not 0 <= a.port < 65536:
        parser.error(f"--port must be in 0..65535 (0 = any free port), got {a.port}")
    for name in ("max_context", "default_max_tokens", "prefill_chunk"):
        if getattr(a, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.max_pending < 0:
        parser.error("--max-pending must be >= 0")
    if a.max_concurrency is not None and a.max_concurrency < 1:
        parser.error("--max-concurrency must be >= 1")
    if a.max_request_mib <= 0:
        parser.error("--max-request-mib must be > 0")
    if a.shutdown_timeout < 0:
        parser.error("--shutdown-timeout must be >= 0")
    from ninfer_nb.engine.spec.adaptive import AdaptiveK

    try:
        k, adaptive = AdaptiveK.parse(a.draft_tokens)
    except ValueError as exc:
        parser.error(f"--draft-tokens: {exc}")
    draft_tokens: int | str = a.draft_tokens.strip().lower() if adaptive else k
    if a.host_cache_mib < 0:
        parser.error("--host-cache-mib must be >= 0")
    if not 0.0 < a.kv_cache_fraction <= 1.0:
        parser.error("--kv-cache-fraction must be in (0, 1]")
    sampling = SamplingDefaults(
        temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, min_p=a.min_p,
        presence_penalty=a.presence_penalty, frequency_penalty=a.frequency_penalty, seed=a.seed,
    )
    try:
        sampling.params(1).validate()
    except Exception as exc:
        parser.error(str(exc))
    return ServerConfig(
        model=a.model, model_id=a.model_id, host=a.host, port=a.port, api_key=a.api_key,
        device=a.device, max_context=a.max_context, prefill_chunk=a.prefill_chunk,
        kv_cache=a.kv_cache,
        default_max_tokens=a.default_max_tokens, max_pending=a.max_pending,
        max_concurrency=a.max_concurrency, spec=a.spec, draft_tokens=draft_tokens,
        prefix_cache=not a.no_prefix_cache, host_cache_mib=a.host_cache_mib,
        kv_cache_fraction=a.kv_cache_fraction,
        max_request_bytes=int(a.max_request_mib * 1024 * 1024), cors=a.cors,
        enable_thinking=not a.no_thinking, request_log=a.request_log,
        warmup=not a.no_warmup, sampling=sampling, shutdown_timeout_s=a.shutdown_timeout,
    )
