"""Which CUDA kernel serves an op where more than one could: one frozen record, chosen once
(bench and tests A/B them; the engine runs the defaults) and handed to CudaOps.

Shape-dependent rules (which GEMV build for a weight, when MoE takes the pipelined GEMMs) are
not choices: they live beside the ops of their family (ops/cuda/*.py). Knows no device.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

PREFILL_GEMMS = ("auto", "mma", "wgmma")          # auto: wgmma on cc 9.0, else mma.sync
PREFILL_ATTENTIONS = ("flash", "gemm", "simt")
DECODE_ATTENTIONS = ("auto", "simt")               # auto: tensor cores on bf16 caches where the shape allows
GDN_STATES = ("mma", "simt")
GDN_PREPARES = ("auto", "mma", "simt")            # auto: mma from ops/cuda/gdn.py GDN_PREPARE_MMA_MIN_DK up
MULTI_TOKEN_GEMVS = ("auto", "mma3", "mma4")      # auto: ops/cuda/linear.py's rule (gemv_mma3 / gemv_mma4 by shape)

_ALLOWED: dict[str, tuple[str, ...]] = {
    "prefill_gemm": PREFILL_GEMMS,
    "prefill_attention": PREFILL_ATTENTIONS,
    "decode_attention": DECODE_ATTENTIONS,
    "gdn_state": GDN_STATES,
    "gdn_prepare": GDN_PREPARES,
    "multi_token_gemv": MULTI_TOKEN_GEMVS,
}


@dataclass(frozen=True)
class KernelChoices:
    """prefill_gemm: tensor-core GEMM of prefill chunks (wgmma needs cc 9.0).
    prefill_attention: flash (one mma.sync kernel, head dim 256 on cc >= 8.0, else as gemm),
    gemm (S and P through the GEMMs, head dims % 64, else simt) or simt (fp32 on CUDA cores).
    decode_attention: auto (tensor cores on bf16 caches) or simt (the split kernel everywhere).
    gdn_state / gdn_prepare: the chunked GDN's state pass / prepare kernel on TF32 tensor cores
    (mma) or fp32 FMAs (simt). multi_token_gemv: the bf16 GEMV of 3..16 tokens (decode rounds,
    verify) where the tensor-core GEMVs serve it: auto (ops/cuda/linear.py's shape rule), mma3
    (gemv_mma3: registers) or mma4 (gemv_mma4: cp.async rings). pdl: programmatic dependent
    launch in the decode graph (cc >= 9.0)."""

    prefill_gemm: str = "auto"
    prefill_attention: str = "flash"
    decode_attention: str = "auto"
    gdn_state: str = "mma"
    gdn_prepare: str = "auto"
    multi_token_gemv: str = "auto"
    pdl: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            allowed = _ALLOWED.get(f.name)
            if allowed is not None and value not in allowed:
                raise ValueError(f"KernelChoices.{f.name} must be one of {', '.join(allowed)}, got {value!r}")
        if not isinstance(self.pdl, bool):
            raise ValueError(f"KernelChoices.pdl must be a bool, got {self.pdl!r}")
