"""A multi-shard float16 Llama checkpoint of about 200 MB (loading-memory and convert tests)
and a three-word tokenizer for checkpoints that need one to load."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HIDDEN, INTER, LAYERS, VOCAB = 1024, 2816, 8, 8192


def tiny_tokenizer(d: Path) -> None:
    from tokenizers import Tokenizer, models
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "</s>": 2, "b": 3, "c": 4}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))


def write_sharded(d: Path, layers_per_shard: int = 2, *, hidden: int = HIDDEN, inter: int = INTER,
                  layers: int = LAYERS, vocab: int = VOCAB) -> list[Path]:
    """A llama checkpoint in float16, one shard per `layers_per_shard` layers (+ embeddings)."""
    HIDDEN, INTER, LAYERS, VOCAB = hidden, inter, layers, vocab  # noqa: N806
    d.mkdir(parents=True)
    config = {"model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER,
              "num_hidden_layers": LAYERS, "num_attention_heads": 8, "num_key_value_heads": 8,
              "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "max_position_embeddings": 256,
              "tie_word_embeddings": True, "eos_token_id": 2}
    (d / "config.json").write_text(json.dumps(config))
    tiny_tokenizer(d)
    rng = np.random.default_rng(0)

    def mat(n: int, k: int) -> np.ndarray:
        return (rng.standard_normal((n, k), dtype=np.float32) * 0.02).astype(np.float16)

    weight_map: dict[str, str] = {}
    shards: list[Path] = []
    groups = [list(range(i, min(i + layers_per_shard, LAYERS))) for i in range(0, LAYERS, layers_per_shard)]
    for s, layers in enumerate(groups):
        t: dict[str, np.ndarray] = {}
        if s == 0:
            t["model.embed_tokens.weight"] = mat(VOCAB, HIDDEN)
            t["model.norm.weight"] = np.ones(HIDDEN, np.float16)
        for i in layers:
            p = f"model.layers.{i}."
            for n in ("q", "k", "v", "o"):
                t[p + f"self_attn.{n}_proj.weight"] = mat(HIDDEN, HIDDEN)
            t[p + "mlp.gate_proj.weight"] = mat(INTER, HIDDEN)
            t[p + "mlp.up_proj.weight"] = mat(INTER, HIDDEN)
            t[p + "mlp.down_proj.weight"] = mat(HIDDEN, INTER)
            t[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float16)
            t[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float16)
        name = f"model-{s + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(t, str(d / name))
        weight_map |= {k: name for k in t}
        shards.append(d / name)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return shards
