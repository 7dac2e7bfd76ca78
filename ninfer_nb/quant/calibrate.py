"""Activation statistics for error-weighted quantization (`ninfer convert --calibrate N`).

A linear weight's error matters in proportion to the inputs it multiplies: the output error of
y = W x is sum_k dW[n, k] x_k, whose mean square over the data is about
sum_k dW[n, k]^2 E[x_k^2]. Running the source model on calibration text (the CPU backend, its
linear ops wrapped to record E[x_k^2] per input column) gives that importance per column; the
scale search (quant/search.py) then minimises the importance-weighted error instead of the plain
one, the idea of llama.cpp's importance matrix. Fused projections share their input, so q / k /
v (or GDN's in_proj parts) get the same statistics; MoE experts and untied embeddings are left
unweighted. Knows nothing about formats.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_LINEAR_OPS = ("linear", "linear_add", "linear_swiglu", "linear_split")


class _Recording:
    """The CPU ops, with the linear ops recording sum x^2 per input column (full: sum x x^T)
    by weight record."""

    def __init__(self, ops: Any, full: bool) -> None:
        self._ops = ops
        self.full = full
        self.sums: dict[int, np.ndarray] = {}
        self.counts: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._ops, name)
        if name not in _LINEAR_OPS:
            return fn

        def recorded(x: Any, weight: Any, *args: Any, **kwargs: Any) -> Any:
            a = np.asarray(x, dtype=np.float64).reshape(-1, np.shape(x)[-1])
            key = id(weight)
            self.sums[key] = self.sums.get(key, 0.0) + (a.T @ a if self.full else np.square(a).sum(axis=0))
            self.counts[key] = self.counts.get(key, 0) + a.shape[0]
            return fn(x, weight, *args, **kwargs)

        return recorded


def _names(weights: Any, tied: bool) -> dict[int, list[str]]:
    """id(runtime record) -> the checkpoint tensor names whose input it sees."""
    out: dict[int, list[str]] = {}
    for i, layer in enumerate(weights.layers):
        p = f"model.layers.{i}."
        mixer, ffn = layer.mixer, layer.ffn
        if hasattr(mixer, "qkv"):
            out[id(mixer.qkv)] = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
            out[id(mixer.o)] = [p + "self_attn.o_proj.weight"]
        else:
            out[id(mixer.in_proj)] = [p + f"linear_attn.in_proj_{n}.weight" for n in ("qkv", "z", "a", "b")]
            out[id(mixer.out)] = [p + "linear_attn.out_proj.weight"]
        if hasattr(ffn, "top_k"):
            continue                      # experts see routed subsets: left unweighted
        out[id(ffn.gate_up)] = [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
        out[id(ffn.down)] = [p + "mlp.down_proj.weight"]
    out.setdefault(id(weights.lm_head), []).append("lm_head.weight")
    if tied:
        out[id(weights.lm_head)].append("model.embed_tokens.weight")
    return out


def activation_importance(model: str | None, windows: Sequence[Sequence[int]], *,
                          context: int, full: bool = False) -> dict[str, np.ndarray]:
    """Checkpoint tensor name -> E[x_k^2] per input column [K] (float32) over `windows` of token
    ids run through `model` on the CPU backend; full: E[x x^T] [K, K] (float64, GPTQ's H)."""
    from ..llm import LLM

    llm = LLM(model, device="cpu", max_context=context, prefill_chunk=context)
    recording = _Recording(llm.backend.ops, full)
    llm.backend.ops = recording                  # the generator reads backend.ops per forward
    for ids in windows:
        llm.logits(list(ids))
    weights = llm.engine.generator.decoder.weights
    out: dict[str, np.ndarray] = {}
    for key, names in _names(weights, llm.model_config.tie_word_embeddings).items():
        if key in recording.sums:
            mean = recording.sums[key] / max(recording.counts[key], 1)
            mean = mean if full else mean.astype(np.float32)
            for name in names:
                out[name] = mean
    return out


def calibration_windows(tokenizer: Any, text: str, tokens: int, context: int) -> list[list[int]]:
    """Windows of `context` ids, `tokens` in all, from the *end* of `text` (perplexity scores the
    start of the same default corpus, so calibration and evaluation do not overlap)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    n = max(1, tokens // context)
    tail = ids[-n * context:]
    return [tail[i * context:(i + 1) * context] for i in range(len(tail) // context)]
