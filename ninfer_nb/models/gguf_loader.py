"""Load a GGUF file into a `LoadedCheckpoint`: HF-style config, float32 weights, tokenizer.

Supports the dense Llama-family GGUF architectures "llama", "qwen2" and "qwen3". Tensors are
renamed to Hugging Face names, one at a time from the memory map, and kept in their stored
format where the engine has one: Q8_0 / Q4_0 / Q4_1 repacked losslessly into QuantizedWeight
records (quant/gguf.py), F16 as float16, BF16 as bfloat16, F32 as is; the other quantized
types (Q5_0, Q5_1, K-quants) are dequantized to float32 `[out, in]` arrays. For "llama",
llama.cpp's converter reorders the rows of every Q and K head from HF's rotate-half layout
(first half / second half of the head) to interleaved pairs; `unpermute_rope_rows` undoes that
so the weights equal the HF checkpoint's. The qwen35 / qwen35moe hybrids are mapped by
`gguf_qwen35`. The header and metadata are parsed by `gguf_header`; tensors are views of a
memory map, dequantized by the gguf package. It does not know the model code, rope scaling,
or SentencePiece vocabularies.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, ReaderField, ReaderTensor
from gguf.quants import dequantize, quant_shape_to_byte_shape

from ..config import ModelConfig
from ..errors import ModelFormatError, ModelNotFoundError, UnsupportedModelError
from ..progress import Progress
from ..quant.gguf import REPACKED, repack
from ..quant.rows import take_rows
from . import gguf_qwen35
from .checkpoint import LoadedCheckpoint
from .gguf_header import MAGIC, GgufHeader, GgufMetadata, TensorInfo, read_header
from .gguf_rope import ROPE_FREQS, with_gguf_rope
from .gguf_tokenizer import tokenizer_from_gguf

Q = GGMLQuantizationType
SUPPORTED_TYPES: frozenset[GGMLQuantizationType] = frozenset(
    {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K}
)
SUPPORTED_ARCHS: dict[str, str] = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_QUANT_SUFFIX_RE = re.compile(r"[.-](i?q\d\w*|f16|f32|bf16)$", re.IGNORECASE)


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor, or None if it has no HF counterpart here."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        return None
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def unpermute_rope_rows(w: Any, n_heads: int) -> Any:
    """Undo llama.cpp's Q/K row permutation: per head, interleaved pairs -> halves.

    llama.cpp stores row `2*i + j` of a head (i < head_dim/2, j in {0, 1}) from HF row
    `j*head_dim/2 + i`. Works on weights `[rows, in]` (arrays or quantized records) and biases
    `[rows]`.
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ModelFormatError(f"Q/K tensor with {rows} rows does not split into {n_heads} heads")
    half = rows // n_heads // 2
    order = np.arange(rows).reshape(n_heads, half, 2).swapaxes(1, 2).reshape(-1)
    if isinstance(w, np.ndarray) and w.ndim == 1:
        return np.ascontiguousarray(w[order])
    if isinstance(w, np.ndarray):
        return np.ascontiguousarray(w[order])
    return take_rows(w, order)


def load_gguf(path: str | Path, *, show_progress: bool = False) -> LoadedCheckpoint:
    """Read a GGUF file: config, dequantized float32 weights under HF names, tokenizer."""
    path = Path(path)
    fields, tensors = open_gguf(path)
    arch = str(fields.get("general.architecture", ""))
    qwen35 = arch in gguf_qwen35.ARCHITECTURES          # the hybrids: gguf_qwen35 maps them
    raw_config = (gguf_qwen35.hf_config if qwen35 else _hf_config)(arch, fields, tensors, path)
    config = ModelConfig.from_hf(raw_config)
    config = with_gguf_rope(config, arch, fields, tensors, path.name)   # rope_freqs, rope.scaling.*
    if qwen35:
        weights, unmapped = gguf_qwen35.load_weights(path, tensors, config, load_tensor,
                                                     show_progress)
    else:
        weights, unmapped = _load_weights(path, tensors, config, arch, show_progress)
    unmapped = [n for n in unmapped if n != ROPE_FREQS]
    tokenizer = tokenizer_from_gguf(fields) if "tokenizer.ggml.model" in fields else None
    return LoadedCheckpoint(
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        source=str(path),
        name=_QUANT_SUFFIX_RE.sub("", path.name.removesuffix(".gguf")),
        metadata={
            "format": "gguf",
            "gguf_architecture": arch,
            "general.name": fields.get("general.name"),
            "tensor_types": dict(Counter(t.tensor_type.name for t in tensors.values())),
            "unmapped_tensors": unmapped,
            "hf_config": raw_config,
        },
    )


def open_gguf(path: Path) -> tuple[GgufMetadata, dict[str, ReaderTensor]]:
    """The file's metadata (decoded on access) and its tensors as views of a memory map: what
    GGUFReader's `fields` (`.contents()`) and `tensors` hold, without parsing every string."""
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {path}")
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
    if magic != MAGIC:
        raise ModelFormatError(f"{path} is not a GGUF file (bad magic {magic!r})")
    header = read_header(path)
    data = np.memmap(path, mode="r")
    tensors = [_tensor(path, data, header, info) for info in header.tensors]
    return header.metadata, {t.name: t for t in tensors}


# numpy item type of the unquantized ggml types; other types are viewed as raw block bytes
_ITEM_TYPES: dict[GGMLQuantizationType, type[np.generic]] = {
    Q.F16: np.float16, Q.F32: np.float32, Q.F64: np.float64,
    Q.I8: np.int8, Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64,
}


def _tensor(path: Path, data: np.ndarray, header: GgufHeader, info: TensorInfo) -> ReaderTensor:
    """The ReaderTensor GGUFReader would build: `.data` a view of the file in numpy order
    ([out, in]); quantized types as uint8 `[..., bytes per row]`."""
    try:
        qtype = GGMLQuantizationType(info.ggml_type)
    except ValueError:
        raise ModelFormatError(
            f"{path}: tensor {info.name!r} has unknown GGUF tensor type {info.ggml_type}"
        ) from None
    block, type_size = GGML_QUANT_SIZES[qtype]
    shape = tuple(reversed(info.dims))
    n_elements = math.prod(shape)
    n_bytes = n_elements * type_size // block
    start = header.data_offset + info.offset
    if start + n_bytes > data.size:
        raise ModelFormatError(
            f"{path}: truncated GGUF file: tensor {info.name!r} ends at byte {start + n_bytes}, "
            f"the file has {data.size}"
        )
    item = _ITEM_TYPES.get(qtype)
    raw = data[start:start + n_bytes]
    try:
        if item is None:
            view = raw.reshape(quant_shape_to_byte_shape(shape, qtype))
        else:
            view = raw.view(np.dtype(header.byte_order + np.dtype(item).char)).reshape(shape)
    except ValueError as exc:        # e.g. a row length that is not a whole number of blocks
        raise ModelFormatError(f"{path}: tensor {info.name!r} of shape {shape}: {exc}") from None
    return ReaderTensor(
        name=info.name, tensor_type=qtype, shape=np.array(info.dims, dtype=np.uint64),
        n_elements=n_elements, n_bytes=n_bytes, data_offset=start, data=view,
        field=ReaderField(start, info.name),
    )


def _hf_config(
    arch: str, fields: Mapping[str, Any], tensors: dict[str, ReaderTensor], path: Path
) -> dict[str, Any]:
    if arch not in SUPPORTED_ARCHS:
        known = ", ".join(sorted([*SUPPORTED_ARCHS, *gguf_qwen35.ARCHITECTURES]))
        raise UnsupportedModelError(
            f"{path.name}: unsupported GGUF architecture {arch!r} (supported: {known})"
        )

    def get(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelFormatError(f"{path.name}: missing GGUF metadata key {arch}.{key}")
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    kv_heads = get("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        if len(set(kv_heads)) != 1:
            raise UnsupportedModelError(f"{path.name}: per-layer KV head counts are not supported")
        kv_heads = kv_heads[0]
    head_dim = int(get("attention.key_length", hidden // heads))
    rope_dims = int(get("rope.dimension_count", head_dim))
    if "token_embd.weight" in tensors:          # the embedding is the truth (vocab may be padded)
        vocab = int(tensors["token_embd.weight"].shape[-1])
    else:
        vocab = fields.get(f"{arch}.vocab_size") or len(fields.get("tokenizer.ggml.tokens") or ())
    eos = [fields.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                   "tokenizer.ggml.eom_token_id")]
    return {
        "model_type": SUPPORTED_ARCHS[arch],
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads),
        "head_dim": head_dim,
        "partial_rotary_factor": rope_dims / head_dim,
        "intermediate_size": int(get("feed_forward_length")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": int(vocab),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": list(dict.fromkeys(int(e) for e in eos if e is not None)),
    }


def load_tensor(t: ReaderTensor) -> Any:
    """One GGUF tensor in the engine's nearest format: a QuantizedWeight for the types that
    repack exactly (Q8_0, Q4_0, Q4_1; matrices and expert stacks), float16 / bfloat16 / float32
    arrays as stored, float32 values for the other quantized types. Read once from the map."""
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    if t.tensor_type.name in REPACKED and len(shape) >= 2:
        return repack(np.asarray(t.data), t.tensor_type.name)
    if t.tensor_type == Q.F16:
        return np.array(t.data, dtype=np.float16).reshape(shape)
    if t.tensor_type == Q.BF16:
        return np.array(t.data, dtype=np.uint8).view(ml_dtypes.bfloat16).reshape(shape)
    if t.tensor_type == Q.F32:
        return np.array(t.data, dtype=np.float32).reshape(shape)
    return _dequantize(t)


def _dequantize(t: ReaderTensor) -> np.ndarray:
    if t.tensor_type not in SUPPORTED_TYPES:
        raise UnsupportedModelError(
            f"tensor {t.name!r} has unsupported GGUF type {t.tensor_type.name}"
        )
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    try:
        out = dequantize(t.data, t.tensor_type)
    except ValueError as exc:
        raise ModelFormatError(f"tensor {t.name!r} could not be decoded: {exc}") from None
    return np.array(out, dtype=np.float32, copy=True).reshape(shape)


def _load_weights(
    path: Path, tensors: dict[str, ReaderTensor], config: ModelConfig, arch: str,
    show_progress: bool,
) -> tuple[dict[str, Any], list[str]]:
    weights: dict[str, Any] = {}
    unmapped: list[str] = []
    bar = Progress(f"loading {path.name}", sum(int(t.n_bytes) for t in tensors.values()),
                   enabled=show_progress)
    for name, t in tensors.items():
        hf = hf_tensor_name(name)
        if hf is None:
            unmapped.append(name)
        else:
            w = load_tensor(t)
            if arch == "llama" and ".self_attn.q_proj." in hf:
                w = unpermute_rope_rows(w, config.num_heads)
            elif arch == "llama" and ".self_attn.k_proj." in hf:
                w = unpermute_rope_rows(w, config.num_kv_heads)
            weights[hf] = w
        bar.update(int(t.n_bytes))
    bar.close()
    if "model.embed_tokens.weight" not in weights:
        raise ModelFormatError(f"{path.name}: GGUF file has no token_embd.weight tensor")
    _check_shapes(path, weights, config)
    return weights, unmapped


def _check_shapes(path: Path, weights: dict[str, Any], config: ModelConfig) -> None:
    """The attention and embedding shapes the metadata promises (others fail in the model)."""
    c = config
    expected = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}.self_attn."
        expected |= {
            p + "q_proj.weight": (c.num_heads * c.head_dim, c.hidden_size),
            p + "k_proj.weight": (c.num_kv_heads * c.head_dim, c.hidden_size),
            p + "v_proj.weight": (c.num_kv_heads * c.head_dim, c.hidden_size),
        }
    for name, shape in expected.items():
        if name not in weights:
            raise ModelFormatError(f"{path.name}: tensor {name} is missing")
        if tuple(weights[name].shape) != shape:
            raise ModelFormatError(
                f"{path.name}: tensor {name} has shape {weights[name].shape}, "
                f"the metadata implies {shape}"
            )
