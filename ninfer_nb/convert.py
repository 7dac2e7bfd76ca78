"""`ninfer convert SRC DEST --weights FORMAT`: write a checkpoint in the project's own artifact
(models/weights_format.py, docs/weights-format.md), its linear weights quantized.

SRC is anything the loader reads (HF directory, quantized HF checkpoint, GGUF file, or nothing:
the default model). Each tensor is read once, its float32 values quantized (round to nearest,
or `--method mse`: per-group scale search, quant/search.py) and appended to the output shard,
so memory holds about one tensor at a time. Which tensors are quantized: the matrices and
expert stacks of projections, the embedding and the LM head; norms, conv taps, A_log /
dt_bias, the MoE router and shared-expert gate, and GDN's small `in_proj_a` / `in_proj_b`
stay as stored. `--override PATTERN=FORMAT` (PATTERN a regular expression searched in the
tensor name, FORMAT a format name or `keep`) changes the choice per tensor, e.g.
`--override lm_head=int8-g128`. A group size that does not divide a matrix's columns falls back
to the largest one that does (int8-g128 on a 576-column matrix stores int8-g64). DEST must not
exist. Knows nothing about devices.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .errors import InvalidRequestError, NinferError
from .models.checkpoint import LoadedCheckpoint
from .models.weights import DenseWeight, QuantizedWeight
from .models.weights_format import ARTIFACT_KEY, ARTIFACT_VERSION, PlannedTensor, ShardWriter, planned_arrays
from .progress import Progress
from .quant.formats import GROUP_SIZES, QuantFormat, groupwise, quant_format
from .quant.rows import values

CHOICES = ("int4-g64", "int4-g128", "int8-g128", "fp8", "int4-g32", "int8-g64", "int8-g32")
KEEP = "keep"
SHARD_BYTES = 4 * 2**30
# tensors left as stored whatever --weights says (matched against the text-decoder name)
UNQUANTIZED = re.compile(r"(norm|conv1d|A_log|dt_bias|\.bias$|mlp\.gate\.weight$|shared_expert_gate"
                         r"|in_proj_a\.weight$|in_proj_b\.weight$)")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                   "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                   "vocab.json", "merges.txt", "tokenizer.model")


@dataclass(frozen=True)
class Override:
    pattern: re.Pattern[str]
    target: str                    # a format name or KEEP


def parse_override(text: str) -> Override:
    pattern, sep, target = text.rpartition("=")
    if not sep or not pattern:
        raise InvalidRequestError(f"--override {text!r}: expected PATTERN=FORMAT")
    if target != KEEP:
        quant_format(_checked_format(target))
    try:
        return Override(re.compile(pattern), target)
    except re.error as e:
        raise InvalidRequestError(f"--override {text!r}: bad pattern ({e})") from None


def _checked_format(name: str) -> str:
    try:
        quant_format(name)
    except ValueError as e:
        raise InvalidRequestError(str(e)) from None
    return name


def target_format(name: str, shape: tuple[int, ...], default: str, overrides: Sequence[Override]
                  ) -> QuantFormat | None:
    """The format tensor `name` of `shape` is written in (None: as stored)."""
    target = default if len(shape) in (2, 3) and not UNQUANTIZED.search(name) else KEEP
    for o in overrides:
        if o.pattern.search(name):
            target = o.target
    if target == KEEP or len(shape) not in (2, 3):
        return None
    fmt = quant_format(target)
    if fmt.layout == "groupwise" and shape[-1] % fmt.group_size:
        fits = [g for g in GROUP_SIZES if g <= fmt.group_size and shape[-1] % g == 0]
        if not fits:
            return None
        fmt = groupwise(fmt.bits, max(fits), fmt.zero_points)
    return fmt


GGUF_TYPES = {"int4-g32": "Q4_0", "int8-g32": "Q8_0"}


def quantize_values(w: np.ndarray, fmt: QuantFormat, method: str,
                    importance: np.ndarray | None = None) -> QuantizedWeight:
    """`w` [..., N, K] in `fmt`: rtn (round to nearest), mse (scale search) or gguf (the `gguf`
    package's own Q4_0 / Q8_0 quantizer, repacked losslessly: int4-g32 / int8-g32 only)."""
    from .quant.dequant import quantize
    from .quant.search import quantize_mse

    if method == "gguf":
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize as gguf_quantize

        from .quant.gguf import repack

        kind = GGUF_TYPES[fmt.name]
        blocks = gguf_quantize(np.ascontiguousarray(w, dtype=np.float32), GGMLQuantizationType[kind])
        return repack(blocks, kind)
    if method == "gptq" and importance is not None and importance.ndim == 2 and w.ndim == 2 \
            and fmt.layout == "groupwise" and not fmt.zero_points:
        from .quant.gptq import quantize_gptq

        return quantize_gptq(w, fmt, importance)
    if method in ("mse", "gptq"):
        if importance is not None and importance.ndim == 2:
            importance = np.diag(importance).astype(np.float32)
        return quantize_mse(w, fmt, importance=importance if w.ndim == 2 else None)
    return quantize(w, fmt)


def _stored(x: Any) -> np.ndarray:
    """A tensor kept as stored: its host array (records: their data; quantized: float32)."""
    if isinstance(x, DenseWeight):
        return np.asarray(x.data)
    if isinstance(x, QuantizedWeight):
        return values(x)
    return np.asarray(x)


def convert(src: LoadedCheckpoint, dest: Path, weights: str, *, overrides: Sequence[Override] = (),
            method: str = "rtn", show_progress: bool = False,
            quantizer: Callable[[np.ndarray, QuantFormat], QuantizedWeight] | None = None,
            importance: Mapping[str, np.ndarray] | None = None) -> Path:
    """Write `src` to the new directory `dest` with its linear weights in `weights`.
    `quantizer` replaces the quantization (tests); `importance`: E[x^2] per input column by
    tensor name (quant/calibrate.py) weights the `mse` search."""
    if dest.exists():
        raise InvalidRequestError(f"{dest} exists: convert never overwrites (remove it or pick another name)")
    default = _checked_format(weights)
    if method == "gguf" and (weights not in GGUF_TYPES or any(o.target not in (KEEP, *GGUF_TYPES) for o in overrides)):
        raise InvalidRequestError(f"--method gguf writes {' / '.join(GGUF_TYPES)} only (GGUF Q4_0 / Q8_0)")
    tensors = src.weights
    names = list(tensors.keys())
    shapes = {n: _shape(tensors, n) for n in names}
    plan: list[tuple[str, QuantFormat | None, list[PlannedTensor]]] = []
    for n in names:
        fmt = target_format(n, shapes[n], default, overrides)
        if fmt is not None:
            plan.append((n, fmt, planned_arrays(n, fmt, shapes[n])))
        else:
            dtype = _stored_dtype(tensors, n)
            plan.append((n, None, [PlannedTensor(n, dtype, shapes[n])]))
    shards = _split(plan)
    dest.mkdir(parents=True)
    try:
        _write(src, dest, shards, shapes, method, quantizer, show_progress, weights, overrides,
               importance or {})
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest


def _shape(tensors: Any, name: str) -> tuple[int, ...]:
    """A tensor's shape; lazily read checkpoints tell it without reading the data."""
    shape = tensors.shape_of(name) if hasattr(tensors, "shape_of") else tensors[name].shape
    return tuple(int(d) for d in shape)


def _stored_dtype(tensors: Any, name: str) -> np.dtype:
    if hasattr(tensors, "dtype_of"):
        return np.dtype(tensors.dtype_of(name))
    x = tensors[name]
    if isinstance(x, DenseWeight):
        return np.dtype(x.data.dtype)
    if isinstance(x, QuantizedWeight):
        return np.dtype(np.float32)
    return np.dtype(np.asarray(x).dtype if np.asarray(x).dtype != np.float64 else np.float32)


def _split(plan: list[tuple[str, QuantFormat | None, list[PlannedTensor]]]
           ) -> list[list[tuple[str, QuantFormat | None, list[PlannedTensor]]]]:
    shards: list[list[tuple[str, QuantFormat | None, list[PlannedTensor]]]] = [[]]
    size = 0
    for item in plan:
        nbytes = sum(t.nbytes for t in item[2])
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += nbytes
    return shards


def _write(src: LoadedCheckpoint, dest: Path, shards: list, shapes: dict[str, tuple[int, ...]], method: str,
           quantizer: Callable[[np.ndarray, QuantFormat], QuantizedWeight] | None,
           show_progress: bool, weights: str, overrides: Sequence[Override],
           importance: Mapping[str, np.ndarray]) -> None:
    total = sum(1 for shard in shards for _ in shard)
    bar = Progress(f"converting {src.name} to {weights}", total, enabled=show_progress)
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1
             else "model.safetensors" for i in range(len(shards))]
    weight_map: dict[str, str] = {}
    counts: dict[str, int] = {}
    for shard, fname in zip(shards, files):
        meta = {"format": "pt", ARTIFACT_KEY: json.dumps({
            "version": ARTIFACT_VERSION,
            "tensors": {n: {"format": f.name, "shape": list(shapes[n])}
                        for n, f, _ in shard if f is not None}})}
        writer = ShardWriter(dest / fname, [t for _, _, p in shard for t in p], meta)
        for name, fmt, planned in shard:
            x = src.weights[name]
            if fmt is None:
                writer.write(name, _stored(x).astype(planned[0].dtype, copy=False))
                counts["as stored"] = counts.get("as stored", 0) + 1
            else:
                w = values(x)
                q = (quantizer(w, fmt) if quantizer is not None
                     else quantize_values(w, fmt, method, importance.get(name)))
                for t in planned:
                    writer.write(t.name, np.asarray(q.arrays[t.name.rsplit(".", 1)[1]]))
                counts[fmt.name] = counts.get(fmt.name, 0) + 1
            for t in planned:
                weight_map[t.name] = fname
            bar.update()
        writer.close()
    if len(shards) > 1:
        (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    _write_config(src, dest, weights, overrides, method + ("+calibrated" if importance else ""), counts)
    _write_tokenizer(src, dest)
    bar.close(f"wrote {dest} ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))})")


def _write_config(src: LoadedCheckpoint, dest: Path, weights: str, overrides: Sequence[Override],
                  method: str, counts: dict[str, int]) -> None:
    raw = src.metadata.get("hf_config")
    if raw is None:
        from .models.loader import read_hf_config

        raw = read_hf_config(Path(src.source))
    config = {k: v for k, v in dict(raw).items()          # type: ignore[call-overload]
              if k not in ("quantization_config", "compression_config")}
    config["ninfer_weights"] = {"weights": weights, "method": method, "source": src.name,
                                "overrides": [f"{o.pattern.pattern}={o.target}" for o in overrides],
                                "tensors": counts}
    (dest / "config.json").write_text(json.dumps(config, indent=1))


def _write_tokenizer(src: LoadedCheckpoint, dest: Path) -> None:
    """Tokenizer files: copied from an HF source directory, or written from a GGUF's tokenizer."""
    source = Path(src.source)
    if source.is_dir():
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, dest / name)
        return
    tok = src.tokenizer
    if tok is None:
        return
    tok.backend.save(str(dest / "tokenizer.json"))
    cfg: dict[str, Any] = {"bos_token": tok.bos_token or None, "eos_token": tok.eos_token or None,
                           "add_bos_token": tok.add_bos}
    template = getattr(tok, "_chat_template", None)
    if template:
        cfg["chat_template"] = template
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": list(tok.eos_token_ids)}))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ninfer convert", description=(
        "Write a checkpoint with its linear weights quantized, in the project's own format "
        "(docs/weights-format.md); the loader reads it without repacking."))
    p.add_argument("src", help="HF checkpoint directory or .gguf file ('default': the default model)")
    p.add_argument("dest", type=Path, help="output directory (must not exist)")
    p.add_argument("--weights", required=True, choices=CHOICES, help="format of the linear weights")
    p.add_argument("--override", action="append", default=[], metavar="PATTERN=FORMAT",
                   help="per-tensor format (regex on the tensor name; FORMAT or 'keep'), "
                        "e.g. lm_head=int8-g128; later ones win")
    p.add_argument("--method", choices=["rtn", "mse", "gptq", "gguf"], default="mse",
                   help="rtn: round to nearest; mse: per-group scale search (default); gptq: GPTQ "
                        "rounding with --calibrate statistics; gguf: the gguf package's Q4_0 / Q8_0 "
                        "quantizer (--weights int4-g32 / int8-g32; for comparisons)")
    p.add_argument("--calibrate", type=int, default=0, metavar="TOKENS",
                   help="weight the mse search by the source model's input statistics over this many "
                        "tokens of the pydoc_data topics' end (default 0: unweighted)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    from .models.loader import load_checkpoint

    overrides = [parse_override(o) for o in args.override]
    if args.dest.exists():
        raise InvalidRequestError(f"{args.dest} exists: convert never overwrites (remove it or pick another name)")
    src = load_checkpoint(None if args.src == "default" else args.src, show_progress=not args.quiet)
    importance = None
    if args.method == "gptq" and args.calibrate <= 0:
        raise InvalidRequestError("--method gptq needs --calibrate TOKENS")
    if args.calibrate > 0:
        if args.method not in ("mse", "gptq") or src.tokenizer is None:
            raise InvalidRequestError("--calibrate needs --method mse or gptq and a model with a tokenizer")
        from .perplexity import default_text
        from .progress import Progress
        from .quant.calibrate import activation_importance, calibration_windows

        bar = Progress("calibrating", 1, enabled=not args.quiet)
        windows = calibration_windows(src.tokenizer, default_text(), args.calibrate, 512)
        importance = activation_importance(None if args.src == "default" else args.src, windows,
                                           context=512, full=args.method == "gptq")
        bar.close(f"calibrated on {sum(len(w) for w in windows)} tokens ({len(importance)} tensors)")
    convert(src, args.dest, args.weights, overrides=overrides, method=args.method,
            show_progress=not args.quiet, importance=importance)
    print(args.dest)
    return 0


__all__ = ["convert", "main", "NinferError"]
