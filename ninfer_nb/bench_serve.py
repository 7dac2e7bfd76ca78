"""`ninfer bench serve`: load a running OpenAI-compatible server over HTTP, like `vllm bench serve`.

    ninfer bench serve --url http://127.0.0.1:8080 --concurrency 1,4,8 --num-prompts 64 \
        --input-len 512 --output-len 128 --range-ratio 0.25 --request-rate inf --output-json out.json

Each request streams (`stream_options.include_usage`) from `/v1/completions` with a prompt of
random token ids (exact input lengths; `--endpoint chat` sends random words to
`/v1/chat/completions` instead) and `ignore_eos`, so every request generates its drawn output
length. Lengths are drawn uniformly in [len * (1 - ratio), len * (1 + ratio)]; arrivals follow a
Poisson process at `--request-rate` (inf: all at once), at most `--concurrency` in flight (one
run per value). Per request: TTFT (send -> first text chunk), ITL (gaps between text chunks),
TPOT ((latency - TTFT) / (output tokens - 1)), E2E latency; per run: throughputs and the mean,
median and `--percentiles` of each, printed and written as JSON. Measures from the client side:
network and HTTP included. Knows nothing about the engine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

WORDS = ("time person year way day thing man world life hand part child eye woman place work "
         "week case point government company number group problem fact").split()


@dataclass
class RequestResult:
    input_len: int
    output_len: int = 0                 # tokens the server reports (usage)
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    ok: bool = False
    error: str = ""


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int] | str]
    input_lens: list[int]
    output_lens: list[int]


def _lengths(rng: random.Random, mean: int, ratio: float, n: int) -> list[int]:
    lo, hi = max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def make_workload(n: int, input_len: int, output_len: int, ratio: float, seed: int,
                  vocab: int, chat: bool) -> Workload:
    """Random prompts: token ids in [100, vocab) (completions) or words (chat)."""
    rng = random.Random(seed)
    ins, outs = _lengths(rng, input_len, ratio, n), _lengths(rng, output_len, ratio, n)
    prompts: list[list[int] | str] = []
    for k in ins:
        if chat:
            prompts.append(" ".join(rng.choice(WORDS) for _ in range(k)))
        else:
            prompts.append([rng.randrange(100, max(101, vocab)) for _ in range(k)])
    return Workload(prompts, ins, outs)


async def _one(client: httpx.AsyncClient, args: argparse.Namespace, model: str,
               prompt: list[int] | str, input_len: int, output_len: int) -> RequestResult:
    res = RequestResult(input_len)
    body: dict[str, Any] = {"model": model, "max_tokens": output_len, "stream": True,
                            "stream_options": {"include_usage": True}, "ignore_eos": True,
                            "temperature": args.temperature}
    if args.endpoint == "chat":
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt}]
        body["enable_thinking"] = False
    else:
        path = "/v1/completions"
        body["prompt"] = prompt
    t0 = time.perf_counter()
    last = t0
    try:
        async with client.stream("POST", args.url.rstrip("/") + path, json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    res.error = str(data["error"].get("message"))
                    return res
                if data.get("usage"):
                    res.output_len = int(data["usage"]["completion_tokens"])
                for c in data.get("choices", []):
                    delta = c.get("delta") or {}
                    text = c.get("text") or delta.get("content") or delta.get("reasoning_content")
                    if text:
                        now = time.perf_counter()
                        if res.ttft_s == 0.0:
                            res.ttft_s = now - t0
                        else:
                            res.itl_s.append(now - last)
                        last = now
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    res.latency_s = time.perf_counter() - t0
    res.ok = True
    return res


async def run_once(args: argparse.Namespace, model: str, work: Workload,
                   concurrency: int) -> dict[str, Any]:
    """One benchmark run at a concurrency limit: every prompt once; the summary dict."""
    sem = asyncio.Semaphore(concurrency)
    rng = np.random.default_rng(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=args.timeout, headers=headers, limits=limits) as client:
        async def limited(i: int) -> RequestResult:
            async with sem:
                return await _one(client, args, model, work.prompts[i], work.input_lens[i],
                                  work.output_lens[i])

        tasks = []
        t0 = time.perf_counter()
        for i in range(len(work.prompts)):
            tasks.append(asyncio.create_task(limited(i)))
            if args.request_rate != math.inf and i + 1 < len(work.prompts):
                await asyncio.sleep(float(rng.exponential(1.0 / args.request_rate)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    return summarize(results, duration, concurrency, args.request_rate, args.percentiles)


def _stats(name: str, values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """mean / median / pN of `values` in milliseconds (zeros when there are none)."""
    v = np.asarray(values, dtype=np.float64) * 1000.0
    out = {f"mean_{name}_ms": float(v.mean()) if v.size else 0.0,
           f"median_{name}_ms": float(np.median(v)) if v.size else 0.0}
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = float(np.percentile(v, p)) if v.size else 0.0
    return out


def summarize(results: Sequence[RequestResult], duration: float, concurrency: int,
              request_rate: float, percentiles: Sequence[float]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.input_len for r in ok)
    tpot = [(r.latency_s - r.ttft_s) / (r.output_len - 1) for r in ok if r.output_len > 1]
    summary: dict[str, Any] = {
        "concurrency": concurrency,
        "request_rate": "inf" if request_rate == math.inf else request_rate,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else 0.0,
    }
    summary.update(_stats("ttft", [r.ttft_s for r in ok], percentiles))
    summary.update(_stats("tpot", tpot, percentiles))
    summary.update(_stats("itl", [x for r in ok for x in r.itl_s], percentiles))
    summary.update(_stats("e2el", [r.latency_s for r in ok], percentiles))
    return summary


def _server_info(args: argparse.Namespace) -> tuple[str, int]:
    """The served model id (unless --model) and its vocabulary size (for random token ids)."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    r = httpx.get(args.url.rstrip("/") + "/v1/models", headers=headers, timeout=args.timeout)
    r.raise_for_status()
    model = r.json()["data"][0]
    vocab = int((model.get("meta") or {}).get("n_vocab") or 32000)
    return args.model or model["id"], vocab


def print_summary(s: dict[str, Any]) -> None:
    print(f"=== concurrency {s['concurrency']}, request rate {s['request_rate']} ===")
    print(f"  completed {s['completed']}  failed {s['failed']}  in {s['duration_s']:.2f} s")
    print(f"  throughput: {s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} "
          f"output tok/s, {s['total_token_throughput']:.1f} total tok/s")
    for name in ("ttft", "tpot", "itl", "e2el"):
        parts = [f"mean {s[f'mean_{name}_ms']:.1f}", f"median {s[f'median_{name}_ms']:.1f}"]
        parts += [f"{k.split('_')[0]} {v:.1f}" for k, v in s.items()
                  if k.startswith("p") and k.endswith(f"_{name}_ms")]
        print(f"  {name.upper():5s} ms: " + ", ".join(parts))
    for e in s["errors"]:
        print(f"  error: {e}")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ninfer bench serve", description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the server's base URL")
    p.add_argument("--model", default=None, help="model id (default: the server's first)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    p.add_argument("--concurrency", default="1", help="max requests in flight; a list runs each")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)]")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="Poisson arrivals per second (inf: all at once)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--percentiles", default="50,90,99")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--warmup", type=int, default=1, help="requests sent (unmeasured) first")
    p.add_argument("--output-json", default=None, help="write the runs as JSON here")
    args = p.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c]
        args.percentiles = [float(x) for x in str(args.percentiles).split(",") if x]
    except ValueError:
        p.error("--concurrency and --percentiles take comma-separated numbers")
    if not args.concurrency or min(args.concurrency) < 1 or args.num_prompts < 1:
        p.error("--concurrency values and --num-prompts must be >= 1")
    if not 0.0 <= args.range_ratio < 1.0 or args.input_len < 1 or args.output_len < 1:
        p.error("--range-ratio must be in [0, 1); --input-len / --output-len >= 1")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every concurrency in turn; {"config": ..., "runs": [summary, ...]}."""
    model, vocab = _server_info(args)
    work = make_workload(args.num_prompts, args.input_len, args.output_len, args.range_ratio,
                         args.seed, vocab, args.endpoint == "chat")
    if args.warmup:
        warm = make_workload(args.warmup, min(args.input_len, 16), 2, 0.0, args.seed + 1, vocab,
                             args.endpoint == "chat")
        asyncio.run(run_once(args, model, warm, 1))
    runs = [asyncio.run(run_once(args, model, work, c)) for c in args.concurrency]
    config = {k: v for k, v in vars(args).items() if k != "api_key"}
    config["request_rate"] = "inf" if args.request_rate == math.inf else args.request_rate
    return {"model": model, "config": config, "runs": runs}


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        out = run(args)
    except httpx.HTTPError as exc:
        print(f"ninfer bench serve: error: {args.url}: {exc}")
        return 2
    for s in out["runs"]:
        print_summary(s)
    if args.output_json:
        with open(args.output_json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0 if all(s["failed"] == 0 for s in out["runs"]) else 1

