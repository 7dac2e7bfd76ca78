"""`ninfer perplexity MODEL [--reference MODEL]`: perplexity over non-overlapping windows and,
against a reference model, the KL divergence and same-top-token rate, as llama.cpp's
`llama-perplexity --kl-divergence` reports them.

The text (a file, or by default the standard library's `pydoc_data` topics, which every Python
install has) is tokenized once with MODEL's tokenizer (a BOS token first when the tokenizer
adds one); windows of `--context` tokens are cut back to back, each run from an empty cache, and
as in llama.cpp only the second half of a window is scored (the logits at positions
[c/2, c - 1) predict tokens [c/2 + 1, c)), so every scored token has at least c/2 tokens of
context. Per scored token: NLL = -log softmax(logits)[next], KL(ref || model) =
sum p_ref (log p_ref - log p_model), top-1 agreement. Reported: PPL = exp(mean NLL) for both
models, mean / median / p99 / max KL, same-top rate. Both models must share the vocabulary.
Several models may be scored in one run against one pass of the reference (one JSON line each).
Knows nothing about weight formats.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .errors import InvalidRequestError

Logits = Callable[[list[int]], np.ndarray]          # ids [T] -> logits [T, V] float32


def default_text() -> str:
    """The standard library's pydoc topics (about 0.8 MB of English prose and code), in key
    order, so every install scores the same text."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@dataclass
class Report:
    model: str
    reference: str | None
    context: int
    windows: int
    scored_tokens: int
    ppl: float
    ppl_reference: float | None = None
    kl_mean: float | None = None
    kl_median: float | None = None
    kl_p99: float | None = None
    kl_max: float | None = None
    same_top: float | None = None

    def lines(self) -> list[str]:
        out = [f"model       {self.model}",
               f"windows     {self.windows} x {self.context} tokens, {self.scored_tokens} scored",
               f"PPL         {self.ppl:.4f}"]
        if self.reference is not None:
            out += [f"reference   {self.reference}",
                    f"PPL ref     {self.ppl_reference:.4f}  (ratio {self.ppl / (self.ppl_reference or 1):.4f})",
                    f"KL mean     {self.kl_mean:.6f}",
                    f"KL median   {self.kl_median:.6f}",
                    f"KL p99      {self.kl_p99:.6f}",
                    f"KL max      {self.kl_max:.6f}",
                    f"same top    {100 * (self.same_top or 0):.2f} %"]
        return out


def windows(ids: Sequence[int], context: int, limit: int | None) -> list[list[int]]:
    """Non-overlapping windows of `context` ids (the tail that does not fill one is dropped)."""
    n = len(ids) // context
    if limit is not None:
        n = min(n, limit)
    return [list(ids[i * context:(i + 1) * context]) for i in range(n)]


def evaluate(model: Logits, ids: Sequence[int], context: int, *, reference: Logits | None = None,
             limit: int | None = None, names: tuple[str, str | None] = ("model", None),
             on_window: Callable[[], None] | None = None) -> Report:
    """Scores `model` (and `reference`) over the windows of `ids`."""
    return evaluate_many([model], ids, context, reference=reference, limit=limit,
                         names=([names[0]], names[1]), on_window=on_window)[0]


def evaluate_many(models: Sequence[Logits], ids: Sequence[int], context: int, *,
                  reference: Logits | None = None, limit: int | None = None,
                  names: tuple[Sequence[str], str | None] = ((), None),
                  on_window: Callable[[], None] | None = None) -> list[Report]:
    """One report per model over the same windows; the reference runs once per window."""
    if context < 4:
        raise InvalidRequestError(f"--context must be >= 4, got {context}")
    chunks = windows(ids, context, limit)
    if not chunks:
        raise InvalidRequestError(f"the text has {len(ids)} tokens: fewer than one window of {context}")
    first = context // 2
    labels = list(names[0]) or [f"model {i}" for i in range(len(models))]
    nll: list[list[np.ndarray]] = [[] for _ in models]
    kls: list[list[np.ndarray]] = [[] for _ in models]
    same: list[list[np.ndarray]] = [[] for _ in models]
    nll_ref: list[np.ndarray] = []
    for chunk in chunks:
        target = np.asarray(chunk[first + 1:])
        rows = np.arange(len(target))
        lr = log_softmax(reference(chunk)[first:context - 1]) if reference is not None else None
        if lr is not None:
            nll_ref.append(-lr[rows, target])
        for i, model in enumerate(models):
            lp = log_softmax(model(chunk)[first:context - 1])              # [c/2 - 1, V]
            nll[i].append(-lp[rows, target])
            if lr is not None:
                if lr.shape != lp.shape:
                    raise InvalidRequestError(
                        f"the models' vocabularies differ ({lp.shape[-1]} vs {lr.shape[-1]})")
                kls[i].append(np.maximum((np.exp(lr) * (lr - lp)).sum(axis=-1), 0.0))
                same[i].append(lr.argmax(-1) == lp.argmax(-1))
        if on_window is not None:
            on_window()
    reports = []
    for i in range(len(models)):
        all_nll = np.concatenate(nll[i])
        report = Report(model=labels[i], reference=names[1], context=context, windows=len(chunks),
                        scored_tokens=int(all_nll.size), ppl=float(np.exp(all_nll.mean())))
        if reference is not None:
            kl = np.concatenate(kls[i])
            report.ppl_reference = float(np.exp(np.concatenate(nll_ref).mean()))
            report.kl_mean = float(kl.mean())
            report.kl_median = float(np.median(kl))
            report.kl_p99 = float(np.percentile(kl, 99))
            report.kl_max = float(kl.max())
            report.same_top = float(np.concatenate(same[i]).mean())
        reports.append(report)
    return reports


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ninfer perplexity", description=(
        "Perplexity over non-overlapping windows; with --reference also the KL divergence "
        "KL(reference || model) and the same-top-token rate (llama.cpp's --kl-divergence)."))
    p.add_argument("model", nargs="+", help="HF checkpoint directory or .gguf file ('default': the "
                   "default model); several share one pass of the reference")
    p.add_argument("--reference", default=None, help="the model to compare against (same vocabulary)")
    p.add_argument("--text", type=Path, default=None,
                   help="UTF-8 text file (default: the standard library's pydoc_data topics)")
    p.add_argument("--context", type=int, default=512, help="window length in tokens (default 512)")
    p.add_argument("--chunks", type=int, default=16, help="score at most this many windows (default 16; 0: all)")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N (default cpu)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    return p


def _load(model: str, device: str, context: int, quiet: bool) -> Any:
    from .llm import LLM

    return LLM(None if model == "default" else model, device=device, max_context=context,
               prefill_chunk=context, show_progress=not quiet)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from .progress import Progress

    if args.context < 4:
        raise InvalidRequestError(f"--context must be >= 4, got {args.context}")
    if args.text is not None:
        try:
            text = args.text.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidRequestError(f"--text: cannot read {args.text} ({e})") from None
    else:
        text = default_text()
    llms = [_load(m, args.device, args.context, args.quiet) for m in args.model]
    ref = _load(args.reference, args.device, args.context, args.quiet) if args.reference else None
    ids = llms[0].tokenizer.encode(text, add_special_tokens=True)
    limit = args.chunks or None
    total = min(len(ids) // args.context, limit or len(ids))
    bar = Progress("perplexity", total, enabled=not args.quiet)
    reports = evaluate_many([m.logits for m in llms], ids, args.context,
                            reference=ref.logits if ref else None, limit=limit,
                            names=(args.model, args.reference), on_window=bar.update)
    bar.close(f"scored {reports[0].scored_tokens} tokens in {reports[0].windows} windows")
    for report in reports:
        if args.json:
            print(json.dumps(asdict(report)))
        else:
            sys.stdout.write("\n".join(report.lines()) + "\n\n")
    return 0
