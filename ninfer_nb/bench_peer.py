"""Hugging Face transformers as `bench`'s peer, timed the way bench times ninfer_nb.

Two sources of weights:
* a checkpoint (HF dir or GGUF): the same weights ours loaded, in the bench process;
* a preset (`--random PRESET`): the preset's shapes with transformers' own random init, bf16 on
  the GPU. That model is as large as ours (54 GB for the 27B), and our engine keeps most of the
  device memory once loaded, so it runs in a subprocess *before* ours loads
  (`python -m ninfer_nb.bench_peer --random PRESET ...`, JSON on stdout) and its memory is gone
  with it.
Transformers uses its fast kernels when they are importable (flash-linear-attention and
causal-conv1d for the Gated DeltaNet layers); otherwise its reference PyTorch code, which it
says on stderr. Knows nothing about ninfer_nb's engine.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any, Sequence

import numpy as np

_HF_CLASSES = {  # preset model_type -> (config class, model class) in transformers
    "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
}


def _device(device: str) -> str:
    import torch

    if device == "cpu":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def preset_model(preset: str, device: str) -> Any:
    """A transformers model of the preset's shapes, randomly initialised by transformers,
    bf16 on the GPU (fp32 on the CPU), built directly on the device."""
    import torch
    import transformers as tf

    from .models.presets import PRESETS, preset_config

    preset_config(preset)                             # the same unknown-preset error as ours
    cfg = dict(PRESETS[preset])
    config_cls, model_cls = _HF_CLASSES[cfg.pop("model_type")]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = getattr(tf, model_cls)(getattr(tf, config_cls)(**cfg))
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def checkpoint_model(source: str | None, device: str) -> Any:
    """The checkpoint ours loaded, in transformers (GGUF llama-family: dequantized weights)."""
    import torch
    import transformers as tf

    from .models.loader import load_checkpoint

    ckpt = load_checkpoint(source)
    c = ckpt.config
    if c.architecture != "llama":
        model = tf.AutoModelForCausalLM.from_pretrained(ckpt.source, dtype=torch.float32)
    else:
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
            num_key_value_heads=c.num_kv_heads, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
            tie_word_embeddings=c.tie_word_embeddings))
        model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, np.float32))
                               for k, v in ckpt.weights.items()}, strict=False)
        model.tie_weights()
    return model.to(device, dtype=torch.bfloat16 if device == "cuda" else torch.float32).eval()


def time_model(model: Any, prompt_len: int, gen: int, device: str) -> dict[str, float]:
    """Prefill of `prompt_len` random ids (TTFT), then `gen - 1` greedy steps through the KV
    cache, after a warm-up generate on a prompt of the same length (as ours is warmed up)."""
    import torch

    ids = torch.tensor([np.random.default_rng(prompt_len).integers(100, 40000, prompt_len).tolist()],
                       device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        model.generate(ids.flip(1), max_new_tokens=4, do_sample=False)          # warm-up
        sync()
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        sync()
        t1 = time.perf_counter()
        past = out.past_key_values
        for _ in range(gen - 1):
            out = model(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        sync()
        t2 = time.perf_counter()
    return {"prompt_tokens": prompt_len, "ttft_ms": (t1 - t0) * 1e3,
            "prefill_tok_s": prompt_len / (t1 - t0), "decode_tok_s": (gen - 1) / (t2 - t1),
            "generated": gen}


def preset_rows_in_subprocess(preset: str, lens: Sequence[int], gen: int, device: str) -> list[dict[str, float]]:
    """Run the preset peer in a child process (its device memory is freed when it exits)."""
    cmd = [sys.executable, "-m", "ninfer_nb.bench_peer", "--random", preset, "--device", device,
           "--prompt-len", ",".join(str(n) for n in lens), "--gen", str(gen)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"the transformers peer failed (exit {r.returncode}); see its stderr above")
    return list(json.loads(r.stdout.strip().splitlines()[-1]))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ninfer_nb.bench_peer",
                                description="transformers on a preset's shapes, timed like bench")
    p.add_argument("--random", required=True, metavar="PRESET")
    p.add_argument("--device", default="auto")
    p.add_argument("--prompt-len", default="512")
    p.add_argument("--gen", type=int, default=128)
    args = p.parse_args(argv)
    device = _device(args.device)
    t = time.perf_counter()
    model = preset_model(args.random, device)
    sys.stderr.write(f"bench: peer transformers {args.random} on {device}, built in "
                     f"{time.perf_counter() - t:.1f} s\n")
    rows = []
    for n in (int(x) for x in args.prompt_len.split(",")):
        sys.stderr.write(f"bench: peer transformers, prompt {n}, generate {args.gen} ...\n")
        rows.append(time_model(model, n, args.gen, device))
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
