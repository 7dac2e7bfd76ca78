"""Tiny random Qwen3.5 hybrids that exist on no disk and need no torch: one config, one set of
NumPy weights, identical on the CPU and the CUDA backend.

`twin_llm(monkeypatch, name, device, ...)` builds an `LLM` on the model `TWINS[name]`: the
`random:` model path with its config and its weights swapped for these (`preset_config` in
ninfer_nb.llm, each backend's `random_weights`), so the rest is the engine users run: the
backend, the upload policy, the decoder, the generator, the sampler. Weights are drawn from a
fixed seed (NumPy PCG64, replayable): matrices and expert stacks rounded to bfloat16 values,
as in the bf16 checkpoints users load, so the CUDA upload keeps them bf16 and the default
tensor-core paths run; norms, conv taps and the GDN decay vectors random around their usual
values. The GPU configs have the real models' head dims (attention 256, GDN 128; "small" is for CPU
tests) and a long `max_position_embeddings` (262144, the Qwen3.6 models'). Token ids only: no tokenizer.

`cpu_reference(...)`: the CPU logits with the rounding the GPU's prefill GEMMs make (their
input rows in bf16), the reference the default GPU path is measured against.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from ninfer_nb.config import EngineConfig, ModelConfig
from ninfer_nb.models.presets import random_weights
from ninfer_nb.models.weights import ModelWeights

TWIN_PREFIX = "random:twin-"
VOCAB = 8192                       # 4 blocks of the device token pick (2,048 logits each)
LONG_CONTEXT = 262144
_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, full_attention_interval=4,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=LONG_CONTEXT,
    tie_word_embeddings=False, rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25},
    eos_token_id=1,
)
TWINS: dict[str, dict[str, Any]] = {
    # dense: 3 Gated DeltaNet layers, then gated attention (8 q heads over 2 kv heads)
    "hybrid": dict(_COMMON, model_type="qwen3_5_text", intermediate_size=512),
    # MoE as the 35B lays it out: the shared expert as wide as the routed ones (a slot)
    "moe": dict(_COMMON, model_type="qwen3_5_moe_text", num_experts=16, num_experts_per_tok=4,
                moe_intermediate_size=64, shared_expert_intermediate_size=64),
    # CPU-only tests (engine logic, long positions): small heads, so each step is cheap
    "small": dict(_COMMON, model_type="qwen3_5_text", hidden_size=128, intermediate_size=256,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                  linear_key_head_dim=32, linear_value_head_dim=32),
}


def twin_config(name: str, **overrides: Any) -> ModelConfig:
    return ModelConfig.from_hf(dict(TWINS[name], **overrides))


def bf16_round(a: np.ndarray) -> np.ndarray:
    """a's values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    from ml_dtypes import bfloat16

    return np.asarray(a, np.float32).astype(bfloat16).astype(np.float32)


@functools.lru_cache(maxsize=4)
def host_weights(name: str, seed: int = 0) -> ModelWeights:
    """The twin's weights (host NumPy), the same for every caller; never modified by the CPU ops."""
    cfg = twin_config(name)
    rng = np.random.default_rng(seed)

    def make(shape: tuple[int, ...], kind: str) -> np.ndarray:
        if kind in ("matrix", "experts"):          # HF's init: N(0, 1 / fan_in), stored as bf16
            return bf16_round(rng.normal(0.0, shape[-1] ** -0.5, shape))
        if kind == "norm":                         # the multipliers (zero-centred norms' + 1)
            return (1.0 + 0.3 * rng.standard_normal(shape)).astype(np.float32)
        return rng.uniform(-0.5, 0.5, shape).astype(np.float32)   # conv taps, A_log, dt_bias

    return random_weights(cfg, make)


def twin_llm(monkeypatch: pytest.MonkeyPatch, name: str, device: str, **engine: Any) -> Any:
    """An LLM on the twin `name`; `engine`: EngineConfig fields (defaults otherwise, but one
    request at a time: on CUDA the user's default configuration: bf16 cache, graphs, device
    pick, steps queued ahead)."""
    import ninfer_nb.llm as llm_module
    from ninfer_nb import LLM
    from ninfer_nb.engine.backend import CpuBackend

    original = llm_module.preset_config

    def preset_config(preset: str) -> ModelConfig:
        twin = preset.removeprefix(TWIN_PREFIX[len("random:"):])
        return twin_config(twin) if twin in TWINS else original(preset)

    def cpu_weights(self: Any, cfg: ModelConfig, seed: int = 0, weights: str | None = None) -> ModelWeights:
        return host_weights(name, seed)

    def cuda_weights(self: Any, cfg: ModelConfig, seed: int = 0, weights: str | None = None) -> ModelWeights:
        return self.upload(host_weights(name, seed))

    monkeypatch.setattr(llm_module, "preset_config", preset_config)
    monkeypatch.setattr(CpuBackend, "random_weights", cpu_weights)
    if device.startswith("cuda"):
        from ninfer_nb.engine.cuda_backend import CudaBackend

        monkeypatch.setattr(CudaBackend, "random_weights", cuda_weights)
    engine.setdefault("show_progress", False)
    if "max_concurrency" in EngineConfig.__dataclass_fields__:
        # one sequence at a time (the CPU's default is a batch of lanes): `engine.generator` is
        # the one that ran, and the tests drive it directly
        engine.setdefault("max_concurrency", 1)
    return LLM(config=EngineConfig(model=TWIN_PREFIX + name, device=device, **engine))


def bf16_gemm_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ops.cpu.linear round its input rows to bf16 where the CUDA ops run a tensor-core
    GEMM (more than GEMV_MAX_T rows, K % K_ALIGN == 0, a bf16 weight with both sides > 8),
    as the kernels convert x to bf16 before the fp32-accumulated product. One-token steps
    (the GEMVs) keep fp32 inputs on both."""
    from ninfer_nb.kernels.linear.gemm_mma import K_ALIGN
    from ninfer_nb.kernels.linear.linear import GEMV_MAX_T
    from ninfer_nb.ops import cpu

    exact = cpu.linear

    def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        if x.size // x.shape[-1] > GEMV_MAX_T and x.shape[-1] % K_ALIGN == 0 and min(weight.shape) > 8:
            x = bf16_round(x)
        return exact(x, weight, bias)

    monkeypatch.setattr(cpu, "linear", linear)


def spy_kernels(llm: Any) -> list[str]:
    """The names of the kernels the CUDA ops launch from now on (appended as they launch)."""
    ops, names = llm.backend.ops, []
    go = ops._go

    def recording(spec: Any, *args: Any, **kwargs: Any) -> Any:
        names.append(spec.name)
        return go(spec, *args, **kwargs)

    ops._go = recording
    return names
