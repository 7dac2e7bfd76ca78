"""What the CUDA kernels cannot run, read from a model config alone (no device needed), so a
model is refused at load instead of failing every request."""
from __future__ import annotations

from typing import Any

from ninfer_nb.kernels import norm as K_norm
from ninfer_nb.kernels.attention import attention as K_attn
from ninfer_nb.kernels.gdn import conv1d as K_conv
from ninfer_nb.kernels.gdn import gdn as K_gdn
from ninfer_nb.kernels.moe import moe as K_moe


def unsupported_shapes(cfg: Any) -> list[str]:
    """What in a model config (config.ModelConfig) the CUDA kernels cannot run, one line each
    ("parameter=value: the kernel's need"); empty when the model runs. The shape limits of the
    `_need` checks below that depend on the config alone, so a model is refused at load
    (check_model) instead of failing every request. A pure function: no device needed."""
    bad = []
    if cfg.hidden_size > K_norm.MAX_D:                                   # add_rms_norm
        bad.append(f"hidden_size={cfg.hidden_size}: the CUDA backend's fused residual norm takes rows "
                   f"up to {K_norm.MAX_D}")
    if any(cfg.is_full_attention(i) for i in range(cfg.num_layers)):     # attention
        if cfg.head_dim > K_attn.MAX_D:
            bad.append(f"head_dim={cfg.head_dim}: the CUDA backend's attention takes head dims up to "
                       f"{K_attn.MAX_D}")
        if cfg.num_kv_heads <= 0 or cfg.num_heads % cfg.num_kv_heads:
            bad.append(f"num_key_value_heads={cfg.num_kv_heads}: the CUDA backend's attention needs a "
                       f"divisor of num_attention_heads={cfg.num_heads}")
    if cfg.is_hybrid and not all(cfg.is_full_attention(i) for i in range(cfg.num_layers)):   # GDN
        dk, max_dk = cfg.linear_key_head_dim, 32 * K_gdn.MAX_KPL
        if dk % 32 or not 0 < dk <= max_dk:                              # _gdr_recurrent
            bad.append(f"linear_key_head_dim={dk}: the CUDA backend's gated delta rule needs a multiple "
                       f"of 32 up to {max_dk}")
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        if hk <= 0 or hv % hk:                                           # gated_delta_rule_chunked
            bad.append(f"linear_num_value_heads={hv}: the CUDA backend's gated delta rule needs a "
                       f"multiple of linear_num_key_heads={hk}")
        if cfg.linear_conv_kernel_dim > K_conv.MAX_K:                    # causal_conv1d
            bad.append(f"linear_conv_kernel_dim={cfg.linear_conv_kernel_dim}: the CUDA backend's causal "
                       f"conv1d takes kernels up to {K_conv.MAX_K} wide")
    if cfg.is_moe:
        top_k, n_exp = cfg.num_experts_per_tok, cfg.num_experts
        if n_exp > K_moe.ROUTE_MAX_E:                                    # moe_route
            bad.append(f"num_experts={n_exp}: the CUDA backend's MoE router takes up to "
                       f"{K_moe.ROUTE_MAX_E} experts")
        if not 0 < top_k <= min(K_moe.MAX_TOPK - 1, n_exp):
            bad.append(f"num_experts_per_tok={top_k}: the CUDA backend's MoE router takes 1 to "
                       f"{min(K_moe.MAX_TOPK - 1, n_exp)}")
        for name, value in (("hidden_size", cfg.hidden_size), ("moe_intermediate_size", cfg.moe_intermediate_size)):
            if value % 2:                                                # _moe_experts_grouped
                bad.append(f"{name}={value}: the CUDA backend's MoE expert GEMMs need an even size")
    return bad


def check_model(cfg: Any) -> None:
    """Raise UnsupportedModelError naming every config value the CUDA kernels cannot run."""
    bad = unsupported_shapes(cfg)
    if bad:
        from ninfer_nb.errors import UnsupportedModelError

        raise UnsupportedModelError("; ".join(bad) + "; use --device cpu")

