"""`python -m ninfer_nb` / `ninfer`: one-shot answers, plus `pull` and `bench` subcommands.

The answer streams to stdout; reasoning, loading progress and the timing line go to stderr.
Every user error is one line on stderr and exit status 2 (no traceback).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from .config import KV_CACHE_KINDS
from .errors import InvalidRequestError, NinferError
from .params import SamplingParams


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ninfer",
        description="Run a Qwen3.5/3.6 hybrid or Llama-family model. Subcommands: "
                    "`ninfer pull` (fetch the default model), `ninfer bench ...`, `ninfer convert SRC DEST "
                    "--weights FORMAT`, `ninfer perplexity MODEL [--reference MODEL]`.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", "-p", help="user message to answer (rendered with the chat template)")
    src.add_argument("--messages", type=Path, help="JSON file: a list of chat messages, or "
                     "{\"messages\": [...], \"tools\": [...]}")
    p.add_argument("--raw", action="store_true", help="send --prompt as raw text, without the chat template")
    p.add_argument("--model", "-m", default=None,
                   help="HF checkpoint directory or .gguf file (default: SmolLM2-135M-Instruct, pulled once)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--max-new", type=int, default=512, help="maximum generated tokens (default 512)")
    p.add_argument("--max-context", type=int, default=4096, help="context window in tokens (default 4096)")
    p.add_argument("--prefill-chunk", type=int, default=1024, help="prefill chunk length (default 1024)")
    p.add_argument("--no-cuda-graph", action="store_true", help="decode with eager kernel launches (debugging)")
    p.add_argument("--kv-cache", choices=list(KV_CACHE_KINDS), default="auto",
                   help="KV cache storage (default auto: bf16 on CUDA, fp32 on the CPU; int8: one scale per 64 values)")
    p.add_argument("--spec", choices=["off", "ngram", "mtp"], default="off",
                   help="speculative decoding: ngram = prompt lookup; mtp = the checkpoint's MTP head "
                        "(Qwen3.5 / 3.6 mtp.* weights; CPU backend so far)")
    p.add_argument("--draft-tokens", default="3",
                   help="draft tokens per verify round: K (default 3), or auto / auto:K to adapt K to the "
                        "measured acceptance, up to 5 / K")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (temperature 0)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--no-thinking", action="store_true", help="disable <think> reasoning (Qwen3.5+)")
    p.add_argument("--print-token-ids", action="store_true", help="print generated token ids to stderr")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress or timing on stderr")
    return p


def _sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_new, temperature=0.0 if args.greedy else args.temperature,
        top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        seed=args.seed, stop=tuple(args.stop),
    ).validate()


def _read_messages(path: Path) -> tuple[list[dict], list[dict] | None]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise InvalidRequestError(f"--messages: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise InvalidRequestError(f"--messages: {path} is not valid JSON ({e})") from None
    if isinstance(data, dict):
        messages, tools = data.get("messages"), data.get("tools")
    else:
        messages, tools = data, None
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError(f"--messages: {path} must hold a non-empty list of messages")
    return messages, tools


def run_answer(args: argparse.Namespace) -> int:
    from .chat import ChatDelta
    from .llm import LLM

    if args.prompt is None and args.messages is None:
        raise InvalidRequestError("nothing to answer: pass --prompt TEXT or --messages FILE (see -h)")
    if args.prompt is not None and not args.prompt.strip():
        raise InvalidRequestError("--prompt is empty")
    if args.max_context < 2:
        raise InvalidRequestError(f"--max-context must be >= 2, got {args.max_context}")
    params = _sampling(args)
    messages, tools = (_read_messages(args.messages) if args.messages
                       else ([{"role": "user", "content": args.prompt}], None))
    llm = LLM(args.model, device=args.device, max_context=args.max_context,
              prefill_chunk=args.prefill_chunk, enable_thinking=not args.no_thinking,
              cuda_graphs=not args.no_cuda_graph, kv_cache=args.kv_cache, show_progress=not args.quiet,
              spec=args.spec, draft_tokens=args.draft_tokens)
    out, err = sys.stdout, sys.stderr
    if args.raw:
        events = llm.stream(args.prompt or "", params)
    else:
        events = llm.chat_stream(messages, tools, params)  # type: ignore[assignment]
    token_ids: list[int] = []
    final = None
    in_reasoning = False
    for item in events:
        if isinstance(item, ChatDelta):
            if item.kind == "reasoning":
                if not in_reasoning and not args.quiet:
                    err.write("[thinking] ")
                in_reasoning = True
                if not args.quiet:
                    err.write(item.text)
                    err.flush()
            elif item.kind == "content":
                if in_reasoning and not args.quiet:
                    err.write("\n")
                in_reasoning = False
                out.write(item.text)
                out.flush()
            elif item.tool_call is not None:
                out.write(json.dumps({"tool_call": {"name": item.tool_call.name,
                                                    "arguments": item.tool_call.arguments}}) + "\n")
            continue
        if args.raw and item.text:
            out.write(item.text)
            out.flush()
        if item.token_id is not None:
            token_ids.append(item.token_id)
        if item.finished:
            final = item
    out.write("\n")
    out.flush()
    if args.print_token_ids:
        err.write("token ids: " + " ".join(map(str, token_ids)) + "\n")
    if final is not None and final.timings is not None and not args.quiet:
        err.write(f"[{llm.model_id} on {llm.device_name}] {final.timings.summary()} "
                  f"| finish: {final.finish_reason}\n")
    return 0


def run_pull(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="ninfer pull", description="Fetch the default model "
                                "(SmolLM2-135M-Instruct, Q4_1 GGUF) into the cache directory.")
    p.add_argument("--force", action="store_true", help="download again even if present")
    args = p.parse_args(list(argv))
    from .pull import pull_default_model

    path = pull_default_model(show_progress=True, force=args.force)
    print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "pull":
            return run_pull(argv[1:])
        if argv and argv[0] == "convert":
            from .convert import main as convert_main

            return convert_main(argv[1:])
        if argv and argv[0] == "perplexity":
            from .perplexity import main as perplexity_main

            return perplexity_main(argv[1:])
        if argv and argv[0] == "bench":
            from .bench import main as bench_main

            return bench_main(argv[1:])
        return run_answer(build_parser().parse_args(argv))
    except NinferError as e:
        sys.stderr.write(f"ninfer: error: {e.message}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("\nninfer: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
