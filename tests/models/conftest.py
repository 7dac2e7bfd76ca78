"""Fixtures for the model tests: small GGUF files written with the `gguf` package's writer.

`hf_to_gguf` converts Hugging Face Llama-family weights the way llama.cpp's converter does:
GGUF tensor names, and for the "llama" architecture the Q/K row permutation. That permutation
is written here from its definition, independently of the loader: within each head of
`head_dim` rows, llama.cpp wants the rotary pairs interleaved (row 2*i+j holds HF row
j*head_dim/2+i), because its "normal" RoPE rotates adjacent pairs (x[2i], x[2i+1]) while HF's
rotate_half pairs x[i] with x[i + head_dim/2].
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

GgufTensors = Mapping[str, "tuple[np.ndarray, GGMLQuantizationType | None]"]
WriteGguf = Callable[[Path, str, Mapping[str, Any], GgufTensors], Path]
HfToGguf = Callable[..., "dict[str, tuple[np.ndarray, GGMLQuantizationType | None]]"]

_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF rotate-half rows -> llama.cpp interleaved rows, per head (see module docstring)."""
    half = w.shape[0] // n_heads // 2
    out = np.empty_like(w)
    for h in range(n_heads):
        base = h * 2 * half
        for i in range(half):
            for j in range(2):
                out[base + 2 * i + j] = w[base + j * half + i]
    return out


def _gguf_name(hf: str) -> str:
    if hf in _GLOBAL:
        return _GLOBAL[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[module]}.{kind}"


def _hf_to_gguf(
    weights: Mapping[str, np.ndarray], *, arch: str, n_heads: int, n_kv_heads: int,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
) -> dict[str, tuple[np.ndarray, GGMLQuantizationType | None]]:
    """GGUF tensors for HF weights: 2-D tensors stored as `qtype`, 1-D ones as F32."""
    out: dict[str, tuple[np.ndarray, GGMLQuantizationType | None]] = {}
    for name, w in weights.items():
        w = np.asarray(w, dtype=np.float32)
        if arch == "llama" and ".q_proj." in name:
            w = llama_cpp_permute(w, n_heads)
        elif arch == "llama" and ".k_proj." in name:
            w = llama_cpp_permute(w, n_kv_heads)
        if w.ndim == 1 or qtype == GGMLQuantizationType.F32:
            out[_gguf_name(name)] = (w, None)
        elif qtype == GGMLQuantizationType.F16:
            out[_gguf_name(name)] = (w.astype(np.float16), None)
        else:
            out[_gguf_name(name)] = (quantize(w, qtype), qtype)
    return out


def _write_gguf(
    path: Path, arch: str, metadata: Mapping[str, Any], tensors: GgufTensors
) -> Path:
    """Write a GGUF file: `metadata` key -> value (typed by Python type: bool, int as uint32,
    float as float32, str, list), `tensors` GGUF name -> (array, raw quant type or None).
    Arrays are in NumPy order ([out, in]); quantized ones are uint8 block bytes."""
    writer = GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))
    for name, (array, raw_dtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def write_gguf() -> WriteGguf:
    return _write_gguf


@pytest.fixture
def hf_to_gguf() -> HfToGguf:
    return _hf_to_gguf
