"""`ninfer bench`: prefill / decode speed against the memory-bandwidth limit and a peer.

In one run: the device's copy bandwidth, then for each prompt length a cold prefill (TTFT,
prefill tok/s) and a steady-state decode (after warm-up), the bytes read per decode token and
the achieved fraction of the measured bandwidth; `--peer hf` runs Hugging Face transformers in
the same command (bench_peer.py: the same checkpoint, or a preset's shapes with random weights
in a subprocess that runs first). A table prints last; `--json` keeps every figure.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

import numpy as np

from .config import KV_CACHE_KINDS, DecodeChoices, EngineConfig
from .ops.kernel_choices import (
    DECODE_ATTENTIONS,
    GDN_PREPARES,
    GDN_STATES,
    PREFILL_ATTENTIONS,
    PREFILL_GEMMS,
    KernelChoices,
)
from .params import SamplingParams
from .quant.formats import FORMATS


def process_start_time() -> float:
    """Wall-clock time this process started (the command's start), from /proc when available."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # no psutil / no /proc: fall back to interpreter start of this module
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


def copy_bandwidth(device: str, nbytes: int = 256 << 20) -> float:
    """Bytes/s moved (read + write) by a large device-local copy, best of 5."""
    if device == "cpu":
        src = np.ones(nbytes // 4, dtype=np.float32)
        dst = np.empty_like(src)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t)
        return 2 * nbytes / best
    from .runtime._drv import check, driver
    from .runtime.arena import DeviceArena
    from .runtime.events import Event
    from .runtime.stream import Stream

    stream, arena = Stream(), DeviceArena(2 * nbytes + (1 << 20))
    a, b = arena.empty((nbytes,), np.uint8), arena.empty((nbytes,), np.uint8)
    best = float("inf")
    for _ in range(6):
        e0, e1 = Event().record(stream), None
        check(driver().cuMemcpyDtoDAsync(b.ptr, a.ptr, nbytes, stream.cu))
        e1 = Event().record(stream)
        e1.synchronize()
        best = min(best, e0.elapsed_ms(e1) / 1e3)
    arena.close()
    return 2 * nbytes / best


def decode_bytes(llm: Any, context: int) -> int:
    """Bytes one decode token must read: every weight but the embedding table (one row), the
    KV cache up to `context`, and the GDN state (read and written)."""
    from .models.weights import MoEWeights, unique_arrays

    w = llm.engine.generator.decoder.weights
    total = sum(int(a.nbytes) for a in unique_arrays(w))
    if w.lm_head is not w.embed:               # untied: the table is read one row a token
        total -= int(w.embed.nbytes)
    for layer in w.layers:                     # MoE: only the routed experts are read
        ffn = layer.ffn
        if isinstance(ffn, MoEWeights):
            experts = int(ffn.gate_up.nbytes + ffn.down.nbytes)
            active = ffn.top_k + int(ffn.shared_slot)          # a folded shared expert always runs
            total -= int(experts * (1.0 - active / ffn.gate_up.shape[0]))
    state = llm.engine.generator.state
    kv = state.kv_bytes() * context // max(state.max_context, 1)
    gdn = state.gdn_slot_bytes()
    return total + kv + 2 * gdn


def arena_used(arena: Any, scratch: Any) -> int:
    """Bytes of `arena` really used: its high-water mark with the per-step `scratch` region (carved
    whole from it at start) counted at the scratch's own high-water mark, not its size."""
    return int(arena.peak) - int(scratch.capacity) + int(scratch.peak)


def device_memory(llm: Any) -> dict[str, int] | None:
    """The device memory a run used (CUDA; None elsewhere). `arena_used`: the arena's high-water
    mark of what was allocated (weights, KV cache for the whole max context, GDN state, rings,
    graph buffers) plus the scratch's high-water mark; `outside_arena`: what the device holds
    beyond the arena now (total - free - arena size: the CUDA context, kernel images, graph
    executables; on a shared device also other processes'); `peak` their sum. The arena itself
    takes most of the free memory at start, so its size says nothing."""
    backend = llm.backend
    arena, scratch = getattr(backend, "arena", None), getattr(backend, "scratch", None)
    if arena is None or scratch is None:
        return None
    from .runtime import device as dev

    backend.stream.synchronize()
    free, total = dev.mem_info()
    used = arena_used(arena, scratch)
    outside = max(0, total - free - int(arena.capacity))
    return {"arena_used": used, "outside_arena": outside, "peak": used + outside,
            "weights": weight_bytes(llm), "scratch_peak": int(scratch.peak), "device_total": total}


def weight_bytes(llm: Any) -> int:
    """Bytes of every weight array on the device (shared records once)."""
    from .models.weights import unique_arrays

    return sum(int(a.nbytes) for a in unique_arrays(llm.engine.generator.decoder.weights))


def run_ours(llm: Any, prompt_len: int, gen: int, repeat: int = 3, temperature: float = 0.0,
             constraint: Any = None, **sampling: Any) -> dict[str, Any]:
    """Warm-up, then `repeat` cold prefills of prompts that differ in their first token (no
    prefix reuse), the last one followed by `gen` tokens (greedy, or sampled at `temperature`
    with `sampling`'s SamplingParams fields: top-k, top-p, min-p, penalties; `constraint`: each
    run under that grammar, which may end it early). TTFT and prefill tok/s are the medians
    over the prefills (single runs of the same code vary widely); decode tok/s comes from the
    last run."""
    rng = np.random.default_rng(prompt_len)
    vocab = llm.valid_vocab
    ids = [int(t) for t in rng.integers(100, vocab - 1, prompt_len)]
    params = SamplingParams(max_tokens=gen, temperature=temperature, ignore_eos=True, seed=0, **sampling)
    # Warm-up on another prompt of the same length: every kernel the timed run takes (the
    # tensor-core GEMM, the grouped MoE, the chunked GDN start at longer chunks) is compiled
    # or read from the cache outside the timing; a different first token defeats prefix reuse.
    warm = [int(t) for t in np.random.default_rng(prompt_len + 1).integers(100, vocab - 1, prompt_len)]
    if warm[0] == ids[0]:
        warm[0] = (warm[0] + 1) % vocab
    llm.generate(warm, params.replace(max_tokens=4), constraint=constraint)
    prefills = []
    for r in range(repeat - 1):
        other = [(ids[0] + 1 + r) % vocab] + ids[1:]
        prefills.append(llm.generate(other, params.replace(max_tokens=1), constraint=constraint).timings)
    t = llm.generate(ids, params, constraint=constraint).timings
    prefills.append(t)
    return {"prompt_tokens": prompt_len, "ttft_ms": float(np.median([p.ttft_s for p in prefills])) * 1e3,
            "prefill_tok_s": float(np.median([p.prefill_tok_s for p in prefills])),
            "ttft_ms_runs": [p.ttft_s * 1e3 for p in prefills],
            "decode_tok_s": t.decode_tok_s, "generated": t.completion_tokens}


def device_step_us(llm: Any, replays: int = 16) -> float | None:
    """The decode step on the device alone (Backend.time_decode_steps: the captured graph
    replayed back to back, ending at the current context). None without a captured graph. The
    replays write the caches past what the engine knows, so it forgets its prefix afterwards."""
    start = max(0, llm.engine.context_tokens - replays - 1)
    us = llm.backend.time_decode_steps(start, replays)
    if us is not None:
        llm.engine.forget()
    return us


PROFILE_REPEAT = 8      # copies of one op per captured graph (bench --profile)
PROFILE_REPLAYS = 4


class _ProfiledOps:
    """Wraps a backend's ops: times each call (events on the GPU, a synchronised clock on the
    CPU) and counts the bytes of its array arguments and results, per op name (linear layers
    per weight shape N x K)."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.ops = backend, backend.ops
        self.stats: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.ops, name)
        if name == "scope":
            return fn                     # scratch bookkeeping, no kernel

        def call(*args: Any, **kwargs: Any) -> Any:
            if name in ("split", "normed") and args[0].shape[0] == 1:
                return fn(*args)          # one token: pointer views / a deferred norm, no kernel
            if self.backend.name == "cuda":
                # Kernel time without Python launch gaps (runtime.graph.time_in_graph). In-place
                # ops update their state many times: the profile runs after the timed
                # benchmark, on a state nobody reads again.
                from .runtime.graph import time_in_graph

                dt, out = time_in_graph(self.backend.stream, lambda: fn(*args, **kwargs), self.ops.scope,
                                        PROFILE_REPEAT, PROFILE_REPLAYS)
            else:
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                dt = time.perf_counter() - t0
            outs = out if isinstance(out, tuple) else (out,)
            if name == "embedding":           # reads one table row per token, not the table
                nbytes = 2 * sum(int(o.nbytes) for o in outs)
            elif name == "moe_experts":       # reads only the routed experts' rows
                x, ids, _, gate_up, down = args
                frac = min(1.0, ids.shape[0] * ids.shape[1] / gate_up.shape[0])
                nbytes = int(frac * (gate_up.nbytes + down.nbytes)) + 2 * int(x.nbytes)
            elif name == "moe":               # the router and the routed (+ shared) experts' rows
                x, router, top_k, _, shared_slot, gate_up, down = args[:7]
                frac = min(1.0, x.shape[0] * (top_k + int(shared_slot)) / gate_up.shape[0])
                nbytes = int(frac * (gate_up.nbytes + down.nbytes)) + int(router.nbytes)
            else:
                nbytes = sum(int(getattr(a, "nbytes", 0)) for a in (*args, *outs))
            key = name
            if name in ("linear", "linear_split", "linear_add"):   # per weight shape: the per-linear target
                key = f"linear {args[1].shape[0]}x{args[1].shape[1]}"
            elif name == "linear_swiglu":             # the MLP's gate_up GEMV and its SwiGLU
                key = f"linear_swiglu {args[1].shape[0]}x{args[1].shape[1]}"
            row = self.stats.setdefault(key, [0.0, 0.0, 0.0])
            row[0] += dt
            row[1] += nbytes
            row[2] += 1
            return out

        return call


def profile_step(llm: Any, n_tokens: int = 1, start: int | None = None) -> list[dict[str, Any]]:
    """One eager forward of `n_tokens` tokens, op family by op family (after the timed runs).

    n_tokens = 1 is a decode step at the current context; more is one prefill chunk placed so
    that it ends at the current context (it attends to everything before it)."""
    from .engine.batch import ForwardBatch
    from .engine.generator import RUNNING_SLOT

    gen = llm.engine.generator
    prof = _ProfiledOps(gen.backend)
    gen.backend.begin_step()
    context = len(gen.tokens)
    if start is None:
        start = max(0, context - n_tokens) if n_tokens > 1 else context
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(1, min(gen.cfg.vocab_size, 30000), n_tokens)]
    ids, pos = gen.backend.ids(tokens, start)
    gen.decoder.forward(prof, ForwardBatch.single(ids, pos, RUNNING_SLOT), gen.state)
    total = sum(v[0] for v in prof.stats.values())
    rows = [{"op": k, "calls": int(v[2]), "time_us": v[0] * 1e6, "bytes": int(v[1]),
             "GBps": v[1] / v[0] / 1e9 if v[0] > 0 else 0.0, "share": v[0] / total}
            for k, v in prof.stats.items()]
    return sorted(rows, key=lambda r: -r["time_us"])


def _print_profile(title: str, profile: list[dict[str, Any]], copy_gbps: float) -> None:
    """One row per op family (linear: per weight shape); "of copy" = achieved GB/s over the
    measured copy bandwidth (the issue's per-linear target is >= 85 % at one token)."""
    print(f"\n{title}, each op timed alone ({sum(r['time_us'] for r in profile):.0f} us in all):")
    print(f"{'op':<26}{'calls':>6}{'time us':>10}{'GB/s':>9}{'of copy':>8}{'share':>7}")
    for r in profile:
        print(f"{r['op']:<26}{r['calls']:>6}{r['time_us']:>10.1f}{r['GBps']:>9.1f}"
              f"{r['GBps'] / copy_gbps:>8.0%}{r['share']:>7.1%}")


# sampling flags measured against greedy in the same run: (flag, type, default, help)
SAMPLING_FLAGS = [("--top-k", int, 0, "top-k (Qwen recommends 20)"), ("--top-p", float, 1.0, "top-p (0.95)"),
                  ("--min-p", float, 0.0, "min-p"), ("--presence-penalty", float, 0.0, "presence penalty (1.0)"),
                  ("--frequency-penalty", float, 0.0, "frequency penalty"),
                  ("--repetition-penalty", float, 1.0, "repetition penalty")]


def sampling_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The SamplingParams fields the sampling flags set away from their defaults."""
    out = {}
    for flag, _, default, _ in SAMPLING_FLAGS:
        name = flag[2:].replace("-", "_")
        if getattr(args, name) != default:
            out[name] = getattr(args, name)
    return out


# bench --json-schema builtin: a tool-parameters-like schema (strings, enums, nested objects,
# arrays, numbers), dev/structured_probe.py's
BUILTIN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string"}, "summary": {"type": "string"},
        "priority": {"type": "string", "enum": ["low", "medium", "high", "urgent"]},
        "assignees": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "role"],
            "properties": {"name": {"type": "string"}, "email": {"type": "string"},
                           "role": {"type": "string", "enum": ["owner", "reviewer", "watcher"]}}}},
        "due": {"type": "object", "additionalProperties": False, "required": ["year", "month", "day"],
                "properties": {"year": {"type": "integer"}, "month": {"type": "integer"}, "day": {"type": "integer"}}},
        "estimate_hours": {"type": "number"}, "labels": {"type": "array", "items": {"type": "string"}},
        "blocking": {"type": "boolean"},
    },
    "required": ["title", "summary", "priority", "assignees", "due", "blocking"],
    "additionalProperties": False,
}


def schema_constraint(llm: Any, spec: str, tokenizer_dir: str | None) -> tuple[Any, tuple[int, ...]]:
    """(the compiled json_schema constraint of --json-schema FILE | builtin, the tokenizer's EOS
    ids) for the model's tokenizer, or --tokenizer DIR's (random weights have none)."""
    from .chat.tokenizer import Tokenizer
    from .structured import compile_constraint

    tok = Tokenizer.from_dir(tokenizer_dir) if tokenizer_dir else llm.tokenizer
    if tok is None:
        raise SystemExit("bench: --json-schema on random weights needs --tokenizer DIR (a tokenizer.json)")
    if spec == "builtin":
        schema = BUILTIN_SCHEMA
    else:
        with open(spec) as f:
            schema = json.load(f)
    t0 = time.perf_counter()
    c = compile_constraint("json_schema", schema, tok, vocab_size=llm.model_config.vocab_size)
    sys.stderr.write(f"bench: json_schema constraint ready in {time.perf_counter() - t0:.1f} s "
                     f"(the grammar tokenizer at {c.vocab_size} ids, once per tokenizer)\n")
    return c, tuple(tok.eos_token_ids)


def _experimental_names(arg: str) -> frozenset[str]:
    """--experimental's names, each checked against ops/cuda.py EXPERIMENTAL (before the model
    loads; imports the CUDA ops module only when names are given)."""
    names = frozenset(n.strip() for n in arg.split(",") if n.strip())
    if names:
        from .ops.cuda import EXPERIMENTAL

        unknown = sorted(names - EXPERIMENTAL.keys())
        if unknown:
            known = ", ".join(sorted(EXPERIMENTAL)) or "none at present"
            raise SystemExit(f"bench: --experimental: unknown kernel name(s) {unknown} "
                             f"(ops/cuda.py EXPERIMENTAL: {known})")
    return names


def kernel_choices(args: argparse.Namespace) -> KernelChoices:
    """The CUDA kernel A/B choices bench's flags name."""
    return KernelChoices(prefill_gemm=args.gemm, prefill_attention=args.attention,
                         decode_attention=args.decode_attention, gdn_state=args.gdn_state,
                         gdn_prepare=args.gdn_prepare, pdl=not args.no_pdl)


def main(argv: Sequence[str]) -> int:
    if argv and argv[0] == "serve":         # a running server over HTTP (bench_serve.py)
        from .bench_serve import main as serve_main

        return serve_main(argv[1:])
    p = argparse.ArgumentParser(prog="ninfer bench", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF dir or .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--random", default=None, metavar="PRESET",
                   help="random weights of a preset's shapes (qwen3.6-27b, qwen3.6-35b-a3b, tiny-qwen3.5, ...)")
    p.add_argument("--weights", default=None, choices=list(FORMATS), metavar="FORMAT",
                   help="with --random: the matrices in this quantized format (int4-g64, int8-g128, ...; "
                        "the embedding, the MoE routers and the shared-expert gate stay bf16)")
    p.add_argument("--prefill-chunk", type=int, default=1024)
    p.add_argument("--max-context", type=int, default=None, metavar="N",
                   help="the context the engine allocates (KV cache, scratch) for; default: the longest "
                        "prompt + --gen + 8. With a prompt that fills it, the peak column is the footprint "
                        "of that context (e.g. --max-context 32768 --prompt-len 32704 --gen 32)")
    p.add_argument("--no-cuda-graph", action="store_true")
    p.add_argument("--kv-cache", choices=list(KV_CACHE_KINDS), default="auto",
                   help="KV cache storage (auto: bf16 on CUDA, fp32 on the CPU)")
    p.add_argument("--gemm", choices=list(PREFILL_GEMMS), default="auto",
                   help="prefill GEMM: wgmma (Hopper), mma.sync, or auto (wgmma on cc 9.0)")
    p.add_argument("--attention", choices=list(PREFILL_ATTENTIONS), default="flash",
                   help="prefill attention: mma.sync flash kernel, head dim 256 (flash; else as gemm), "
                        "tensor-core GEMMs + softmax (gemm), fp32 flash kernel (simt)")
    p.add_argument("--no-pdl", action="store_true",
                   help="decode graph without programmatic dependent launch (cc >= 9.0 uses it by default)")
    p.add_argument("--host-argmax", action="store_true",
                   help="decode copies the logits row back and the host picks the token (np.argmax, or the "
                        "host sampler), instead of the decode graph's pick kernel (4 bytes back per token; "
                        "the default)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="also decode by sampling at this temperature, measured after greedy in the same run "
                        "(default 0: greedy only); sampled in the decode graph (kernels/sample_pick.py), "
                        "--host-argmax samples on the host")
    for flag, kind, default, what in SAMPLING_FLAGS:
        p.add_argument(flag, type=kind, default=default, help=f"with --temperature: {what}")
    p.add_argument("--json-schema", default=None, metavar="FILE|builtin",
                   help="also decode greedily under this JSON schema (structured output: each step's grammar "
                        "mask), measured after the plain run in the same command; builtin: a tool-parameters schema")
    p.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="also decode greedily with logprobs (each token's and its top K, 0..20), measured after "
                        "the plain run in the same command")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="with --json-schema on --random weights: the tokenizer (a dir with tokenizer.json) "
                        "whose vocabulary the grammar masks")
    p.add_argument("--no-decode-ahead", action="store_true",
                   help="greedy decode waits for each token on the host before queueing the next step "
                        "(the default queues it first: the graph's argmax feeds the next step)")
    p.add_argument("--decode-attention", choices=list(DECODE_ATTENTIONS), default="auto",
                   help="decode attention: auto (tensor cores on bf16 KV caches, else CUDA cores) or "
                        "simt (always the per-q-head CUDA-core kernel, for A/B runs)")
    p.add_argument("--gdn-state", choices=list(GDN_STATES), default="mma",
                   help="the chunked GDN's state pass: TF32 tensor cores (mma) or fp32 FMAs (simt)")
    p.add_argument("--gdn-prepare", choices=list(GDN_PREPARES), default="auto",
                   help="the chunked GDN's prepare kernel: auto (mma from a key head dim of 64), mma, simt")
    p.add_argument("--experimental", default="", metavar="NAME[,NAME]",
                   help="turn on opt-in CUDA kernel choices by name: kernels not yet validated on a GPU, "
                        "or earlier builds kept for A/B runs (ops/cuda.py EXPERIMENTAL; an unknown name lists "
                        "them)")
    p.add_argument("--profile", action="store_true", help="time one decode step kernel family by kernel family")
    p.add_argument("--device", default="auto")
    p.add_argument("--prompt-len", default="512", help="comma-separated prompt lengths")
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3, help="cold prefills per prompt length (median reported)")
    p.add_argument("--peer", choices=["hf"], default=None)
    p.add_argument("--json", default=None, help="write every figure to this file")
    p.add_argument("--spec", choices=["off", "oracle", "ngram", "mtp"], default="off",
                   help="speculative decoding vs plain decode in the same run (engine/spec/bench.py): "
                        "ngram / mtp on a repeat-a-passage prompt; oracle drafts the plain run's own "
                        "greedy continuation (100 %% acceptance: the verify machinery's upper bound; "
                        "random weights work; prompt length: the first --prompt-len)")
    p.add_argument("--draft-tokens", default="3", help="comma-separated draft counts K (--spec)")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="--spec mtp: draft over the LM head's first N rows only (a shortlist head)")
    p.add_argument("--prefix-cache", type=int, default=None, metavar="CTX",
                   help="the prefix cache's benchmark instead (bench_prefix.py): a conversation of about CTX "
                        "tokens re-sent after two others ran; each request's TTFT and prefilled tokens")
    p.add_argument("--concurrency", default=None, metavar="C[,C]",
                   help="requests at once, e.g. 1,2,4,8: per level C requests of the first --prompt-len "
                        "start together (bench_concurrency.py: aggregate and per-request decode tok/s, "
                        "TTFT); without it one request runs at a time (max_concurrency 1)")
    args = p.parse_args(list(argv))
    if args.prefix_cache is not None:
        from .bench_prefix import main as prefix_main

        source = ["--random", args.random] if args.random else (["--model", args.model] if args.model else [])
        return prefix_main([*source, "--device", args.device, "--context", str(args.prefix_cache),
                            "--prefill-chunk", str(args.prefill_chunk), *(["--json", args.json] if args.json else [])])
    experimental = _experimental_names(args.experimental)      # before the peer run and the load
    if args.weights and not args.random:
        p.error("--weights needs --random (a checkpoint loads in its own format)")
    if (args.json_schema or args.logprobs is not None) and (args.concurrency or args.spec != "off"):
        p.error("--json-schema / --logprobs run with one request at a time (not with --concurrency / --spec)")
    from .llm import LLM

    lens = [int(x) for x in args.prompt_len.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")] if args.concurrency else []
    if any(c < 1 for c in levels):
        p.error("--concurrency levels must be >= 1")
    model = f"random:{args.random}" if args.random else args.model
    preset_peer: dict[int, dict[str, float]] = {}
    peer_s = 0.0                                   # kept out of command-to-first-token
    if args.peer == "hf" and args.random:          # before ours takes the device memory
        from .bench_peer import preset_rows_in_subprocess

        sys.stderr.write(f"bench: peer transformers on {args.random} (random weights, subprocess) ...\n")
        t_peer = time.perf_counter()
        preset_peer = {int(r["prompt_tokens"]): r
                       for r in preset_rows_in_subprocess(args.random, lens, args.gen, args.device)}
        peer_s = time.perf_counter() - t_peer
    needed = max(lens + ([768] if args.spec in ("ngram", "mtp") else [])) + args.gen + 8
    if args.max_context is not None and args.max_context < max(lens) + args.gen:
        p.error(f"--max-context {args.max_context} is shorter than the longest prompt + --gen")
    t_load = time.perf_counter()
    llm = LLM(config=EngineConfig(
        model, device=args.device, show_progress=True,
        max_context=max(needed, args.max_context or 0),
        prefill_chunk=args.prefill_chunk, cuda_graphs=not args.no_cuda_graph, kv_cache=args.kv_cache,
        kernels=kernel_choices(args), weights=args.weights,
        decode=DecodeChoices(device_pick=not args.host_argmax, decode_ahead=not args.no_decode_ahead),
        spec="ngram" if args.spec == "oracle" else args.spec,
        draft_tokens=max(int(k) for k in args.draft_tokens.split(",")) if args.spec != "off" else 1,
        max_concurrency=max(levels, default=1)))
    load_s = time.perf_counter() - t_load
    if levels:
        from .bench_concurrency import print_rows, run_concurrency_bench

        llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))   # warm
        sampled = {"temperature": args.temperature, **sampling_fields(args)} if args.temperature > 0 else None
        conc_rows = run_concurrency_bench(llm, levels, lens[0], args.gen, sampled)
        print_rows(conc_rows, f"{llm.model_id} on {llm.device_name}: {lens[0]}-token prompts, {args.gen} "
                              f"tokens each, C requests started together")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": llm.model_id, "device": llm.device_name, "concurrency": conc_rows}, f,
                          indent=1)
        return 0
    if args.spec != "off":
        from .engine.spec.bench import run_spec_bench

        if args.draft_vocab is not None:
            set_vocab = getattr(llm.engine.proposer, "set_draft_vocab", None)
            if set_vocab is None:
                raise SystemExit("bench: --draft-vocab needs --spec mtp")
            set_vocab(args.draft_vocab)

        spec_rows = run_spec_bench(llm, args.spec, [int(k) for k in args.draft_tokens.split(",")], args.gen,
                                   lens[0], profile=args.profile)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": llm.model_id, "device": llm.device_name, "spec": spec_rows}, f, indent=1)
        return 0
    if experimental or args.decode_attention != "auto":
        if llm.backend.name != "cuda":
            raise SystemExit(f"bench: --experimental / --decode-attention need the CUDA backend "
                             f"(this run is on {llm.backend.name})")
        llm.backend.ops.experimental = experimental
    # one token: compiles what a decode step runs, not the 2..16-token GEMVs nothing timed here takes
    first = llm.generate([1], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    start_to_first_token = time.time() - process_start_time() - peer_s
    sys.stderr.write(f"bench: {llm.model_id} on {llm.device_name}; loaded in {load_s:.1f} s, "
                     f"first token {start_to_first_token:.1f} s after the command started "
                     f"({first.timings.ttft_s * 1e3:.0f} ms TTFT, kernels compiled or read from cache)\n")
    bw = copy_bandwidth(llm.backend.name)
    sampling = sampling_fields(args)
    if sampling and args.temperature <= 0:
        raise SystemExit("bench: --top-k / --top-p / --min-p / penalties need --temperature > 0")
    schema, eos = schema_constraint(llm, args.json_schema, args.tokenizer) if args.json_schema else (None, ())
    rows = []
    for n in lens:
        sys.stderr.write(f"bench: prompt {n}, generate {args.gen} ...\n")
        ours = run_ours(llm, n, args.gen, max(1, args.repeat))
        nbytes = decode_bytes(llm, n + args.gen // 2)
        limit = bw / nbytes                # HBM/DRAM bandwidth is shared by reads and writes
        row: dict[str, Any] = {"engine": "ninfer_nb", **ours, "bytes_per_token": nbytes,
                               "limit_tok_s": limit, "fraction_of_limit": ours["decode_tok_s"] / limit}
        mem = device_memory(llm)                  # the run so far: the arena's marks only grow
        if mem is not None:
            row["peak_device_bytes"], row["device_memory"] = mem["peak"], mem
        step_us = device_step_us(llm)
        if step_us is not None and ours["decode_tok_s"] > 0:   # what the host adds to a token
            row["device_step_us"] = step_us
            row["host_gap_us"] = 1e6 / ours["decode_tok_s"] - step_us
        rows.append(row)
        if args.temperature > 0 or sampling:     # the same prompt sampled, right after greedy
            sampled = run_ours(llm, n, args.gen, 1, args.temperature, **sampling)
            rows.append({"engine": "sampled", **sampled, "sampling": {"temperature": args.temperature, **sampling},
                         "decode_vs_greedy": sampled["decode_tok_s"] / ours["decode_tok_s"]})
        if schema is not None:                   # the same prompt under the grammar, greedy
            constrained = run_ours(llm, n, args.gen, 1, constraint=schema, stop_token_ids=eos)
            rows.append({"engine": "json-schema", **constrained,
                         "decode_vs_plain": constrained["decode_tok_s"] / ours["decode_tok_s"]})
        if args.logprobs is not None:            # the same prompt with logprobs, greedy
            with_lp = run_ours(llm, n, args.gen, 1, logprobs=args.logprobs)
            rows.append({"engine": f"logprobs={args.logprobs}", **with_lp,
                         "decode_vs_plain": with_lp["decode_tok_s"] / ours["decode_tok_s"]})
        if args.peer == "hf":
            if args.random:
                peer = preset_peer[n]
            else:
                from .bench_peer import checkpoint_model, time_model

                sys.stderr.write("bench: peer transformers ...\n")
                dev = "cuda" if llm.backend.name == "cuda" else "cpu"
                peer = time_model(checkpoint_model(llm.engine_config.model, dev), n, args.gen, dev)
            rows.append({"engine": "transformers", **peer})
            row["decode_vs_peer"] = ours["decode_tok_s"] / peer["decode_tok_s"]
    # at the last prompt's context after its decode (the KV rows up to there hold that run's
    # keys; device_step_us made the generator forget the token ids, not the cache)
    context = max(lens) + args.gen - 1
    profile = profile_step(llm, start=context) if args.profile else []
    chunk = min(args.prefill_chunk, max(lens))
    prefill_profile = profile_step(llm, chunk, start=max(0, context + 1 - chunk)) if args.profile else []
    step_gap = {}
    if profile:   # the profile runs at the last prompt's context, like that prompt's decode
        last = [r for r in rows if r["engine"] == "ninfer_nb"][-1]
        step_gap = {"decode_step_us": 1e6 / last["decode_tok_s"],
                    "decode_ops_us": sum(r["time_us"] for r in profile),
                    "decode_ops": sum(r["calls"] for r in profile)}
    report = {"model": llm.model_id, "weights": args.weights, "max_context": llm.max_context, "profile": profile, "prefill_profile": prefill_profile, **step_gap,
              "load_s": load_s,
              "start_to_first_token_s": start_to_first_token, "device": llm.device_name,
              "kv_cache": llm.kv_cache, "decode_attention": args.decode_attention, "temperature": args.temperature,
              "decode_graph_pdl": llm.backend.name == "cuda" and llm.engine_config.kernels.pdl
              and not args.no_cuda_graph,
              "device_argmax": llm.engine.picks_on_device,
              "decode_ahead": llm.engine_config.decode.decode_ahead and llm.engine.picks_on_device,
              "copy_bandwidth_GBps": bw / 1e9, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if profile:
        _print_profile("One decode step by op", profile, bw / 1e9)
        gap = step_gap["decode_step_us"] - step_gap["decode_ops_us"]
        print(f"The timed decode step took {step_gap['decode_step_us']:.0f} us: {gap:.0f} us "
              f"({gap / step_gap['decode_step_us']:.1%}) more than its {step_gap['decode_ops']} ops timed "
              f"alone (launch gaps between kernels, and the host's share of a step: the logits row's copy "
              f"and the sampler, or the device argmax's 4 bytes)")
        _print_profile(f"One {chunk}-token prefill chunk ending at context {max(lens) + args.gen} by op",
                       prefill_profile, bw / 1e9)
    print(f"\n{llm.model_id}{f' ({args.weights} weights)' if args.weights else ''} on {llm.device_name}; copy bandwidth {bw / 1e9:.1f} GB/s (read+write); "
          f"command to first token {start_to_first_token:.1f} s; {llm.kv_cache} KV cache; decode graph "
          f"{'with' if report['decode_graph_pdl'] else 'without'} programmatic dependent launch"
          f"{f', sampled: temperature {args.temperature} ' + ' '.join(f'{k} {v}' for k, v in sampling.items()) if args.temperature > 0 else ''}"
          f"{', tokens picked on the device' if report['device_argmax'] else ''}"
          f"{', each step queued before the last token is read' if report['decode_ahead'] else ''}")
    print(f"{'engine':<13}{'prompt':>7}{'TTFT ms':>9}{'prefill t/s':>12}{'decode t/s':>11}"
          f"{'limit t/s':>10}{'of limit':>9}{'vs peer':>8}{'step us':>9}{'host us':>8}{'peak GiB':>9}")
    nan = float("nan")
    for r in rows:
        print(f"{r['engine']:<13}{r['prompt_tokens']:>7}{r['ttft_ms']:>9.1f}{r['prefill_tok_s']:>12.1f}"
              f"{r['decode_tok_s']:>11.1f}{r.get('limit_tok_s', nan):>10.1f}"
              f"{r.get('fraction_of_limit', nan):>9.2f}{r.get('decode_vs_peer', nan):>8.2f}"
              f"{r.get('device_step_us', nan):>9.1f}{r.get('host_gap_us', nan):>8.1f}"
              f"{r.get('peak_device_bytes', nan) / 2**30:>9.2f}")
    mems = [r["device_memory"] for r in rows if "device_memory" in r]
    if mems:
        m = mems[-1]
        print(f"peak GiB: device memory used up to that row: the arena's high-water mark "
              f"({m['arena_used'] / 2**30:.2f} GiB at the end: weights {m['weights'] / 2**30:.2f}, KV cache and "
              f"state for a {llm.max_context}-token context, scratch peak {m['scratch_peak'] / 2**30:.2f}) "
              f"+ {m['outside_arena'] / 2**30:.2f} GiB outside it (CUDA context, kernels, graphs)")
    if any("device_step_us" in r for r in rows):
        print("step us: the decode graph replayed back to back (the device alone); host us: what a token "
              "took beyond it, end to end")
    for r in rows:
        if "decode_vs_plain" in r:
            print(f"{r['engine']} decode at prompt {r['prompt_tokens']}: {r['decode_tok_s']:.1f} tok/s over "
                  f"{r['generated']} tokens = {r['decode_vs_plain']:.1%} of unconstrained greedy "
                  f"({1.0 - r['decode_vs_plain']:.1%} cost)")
        if "decode_vs_greedy" in r:
            print(f"sampled decode ({' '.join(f'{k}={v}' for k, v in r['sampling'].items())}) at prompt "
                  f"{r['prompt_tokens']}: {r['decode_tok_s']:.1f} tok/s = {r['decode_vs_greedy']:.1%} of greedy")
    return 0
