"""The op contract: every op that the model code (models/layers.py, models/decoder.py) calls.

`ninfer_nb.ops.cpu` (NumPy, the module itself is the ops object) and `ops.cuda.CudaOps` both
provide these names with these parameters (tests/ops/test_op_contract.py checks it). Arrays are
backend arrays (NumPy or device Tensors); a linear weight is a models/weights.py record or a
bare matrix. Shapes: T tokens, H hidden size, Hq / Hkv attention heads of dim D, S cache rows,
Hk / Hv GDN key / value heads of dims Dk / Dv, E experts, k experts per token, I expert width.
Ops return new arrays unless they say "in place". A backend may offer more ops than these.
"""
from __future__ import annotations

import contextlib
from typing import Any, Protocol

Array = Any         # np.ndarray on the CPU, runtime.tensor.Tensor on the GPU
Weight = Any        # models.weights.LinearWeight, or a bare [N, K] matrix

PAGE_SIZE = 64      # tokens per KV page: paged caches keep a page's tokens in consecutive rows


class Ops(Protocol):
    """What models/ may call on its `ops` object."""

    # --- scratch ------------------------------------------------------------------
    def scope(self) -> contextlib.AbstractContextManager[None]:
        """Scratch allocated inside is handed back on exit (nothing allocated inside may be
        used after it); a no-op where memory frees itself."""
        ...

    # --- embedding, norms, elementwise ---------------------------------------------
    def embedding(self, table: Weight, ids: Array) -> Array:
        """table [V, H], ids [T] int32 -> rows [T, H] fp32."""
        ...

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        """x [..., D] * rsqrt(mean(x^2) + eps) * weight [D], same shape as x."""
        ...

    def normed(self, x: Array, weight: Array, eps: float) -> Array:
        """rms_norm(x, weight, eps) for the next op to consume; a backend may defer it into
        that op (the CUDA ops do for one token), so pass the result only to ops."""
        ...

    def gated_rms_norm(self, x: Array, z: Array, weight: Array, eps: float) -> Array:
        """GDN output norm: rms_norm(x [..., D], weight [D]) * silu(z [..., D])."""
        ...

    def add(self, x: Array, y: Array) -> Array:
        """x + y, same shapes."""
        ...

    def add_into(self, acc: Array, y: Array) -> Array:
        """acc += y in place (the residual stream); returns acc."""
        ...

    def sigmoid_mul(self, x: Array, gate: Array) -> Array:
        """x [T, N] * sigmoid(gate), gate [T, N] or [T, 1] (broadcast per row)."""
        ...

    # --- linear --------------------------------------------------------------------
    def linear(self, x: Array, weight: Weight, bias: Array | None = None) -> Array:
        """x [T, K] @ weight [N, K]^T (+ bias [N]) -> [T, N]."""
        ...

    def linear_add(self, x: Array, weight: Weight, residual: Array) -> Array:
        """residual [T, N] += linear(x, weight), in place; returns residual."""
        ...

    def linear_split(self, x: Array, weight: Weight, bias: Array | None,
                     sizes: tuple[int, ...]) -> tuple[Array, ...]:
        """split(linear(x, weight, bias), sizes): the parts [T, size_i] of a fused projection."""
        ...

    def linear_swiglu(self, x: Array, gate_up: Weight) -> Array:
        """silu(gate) * up of linear(x, gate_up [2I, K]) (gate rows first) -> [T, I]; the result
        is only for `linear` (the CUDA ops may return it as bf16 bits)."""
        ...

    # --- attention -----------------------------------------------------------------
    def qk_norm_rope_store(self, q: Array, k: Array, v: Array, q_norm: Array | None, k_norm: Array | None,
                           positions: Array, rope_table: Array, eps: float, k_cache: Array,
                           v_cache: Array, k_scale: Array | None = None, v_scale: Array | None = None,
                           page_table: Array | None = None) -> Array:
        """Head-norm (if given) and rotate q [T, Hq, D], k [T, Hkv, D] by rope_table [3, R/2]
        (models/rope.py); store k, v into the caches [S, Hkv, D] in place (int8 codes with
        scales [S, Hkv, D/64]) at the rows of positions [T]: the position itself without a
        page table, else through page_table [B, P] int32 (see `attention`). Returns q."""
        ...

    def attention(self, q: Array, k_cache: Array, v_cache: Array, positions: Array, scale: float,
                  k_scale: Array | None = None, v_scale: Array | None = None,
                  page_table: Array | None = None) -> Array:
        """Causal GQA attention: q [T, Hq, D] at positions [T] sees cache keys 0..positions[i]
        -> [T, Hq, D]. page_table None: one sequence, the key at position p is cache row p.
        page_table [B, P] int32 (T % B == 0): token i belongs to sequence b = i // (T / B), whose
        key at position p is row page_table[b, p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE."""
        ...

    def attention_gated(self, q: Array, k_cache: Array, v_cache: Array, positions: Array, scale: float,
                        gate: Array, k_scale: Array | None = None, v_scale: Array | None = None,
                        page_table: Array | None = None) -> Array:
        """attention(...) * sigmoid(gate [T, Hq * D]) as [T, Hq * D]."""
        ...

    # --- Gated DeltaNet ------------------------------------------------------------
    def causal_conv1d_split(self, x: Array, conv_state: Array, weight: Array,
                            sizes: tuple[int, ...]) -> tuple[Array, ...]:
        """split(silu(causal depthwise conv of x [T, C] by weight [C, K]), sizes); conv_state
        [K-1, C] (the previous inputs) is updated in place."""
        ...

    def gdn_gates(self, a: Array, b: Array, a_log: Array, dt_bias: Array) -> tuple[Array, Array]:
        """a, b [T, Hv] -> (g = -exp(a_log) * softplus(a + dt_bias), beta = sigmoid(b)), [T, Hv]."""
        ...

    def gated_delta_rule_chunked(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array,
                                 chunk: int = 64) -> Array:
        """Gated delta rule over q, k [T, Hk, Dk], v [T, Hv, Dv] -> [T, Hv, Dv]; state
        [Hv, Dv, Dk] is updated in place."""
        ...

    def gdn_decode(self, mixed: Array, z: Array, a: Array, b: Array, conv_state: Array, conv_w: Array,
                   a_log: Array, dt_bias: Array, state: Array, norm_w: Array, eps: float,
                   n_k_heads: int, slots: Array | None = None, snapshots: Array | None = None) -> Array:
        """Conv, gated delta rule (gates from raw a, b) and gated norm by z of decode-sized T:
        mixed [T, q | k | v] -> [T, Hv * Dv]; conv_state and state updated in place.
        slots None: one sequence, conv_state [K-1, C] and state [Hv, Dv, Dk]. slots [B] int32
        (T % B == 0): conv_state [S, K-1, C] and state [S, Hv, Dv, Dk] are whole slot pools, and
        sequence b's T / B tokens (rows b T/B ..) run in order on slot slots[b]. snapshots [<= T]
        int32 (with slots): where snapshots[t] >= 0 the state after token t is also copied to
        that slot (a speculative verify's per-token states for rollback)."""
        ...

    # --- mixture of experts -----------------------------------------------------------
    def moe(self, x: Array, router: Weight, top_k: int, renormalize: bool, shared_slot: bool,
            gate_up: Weight, down: Weight, residual: Array | None = None) -> Array:
        """Routed SwiGLU experts of x [T, H] (router [E (+1), H], gate_up [E, 2I, H], down
        [E, H, I]) -> [T, H]; with `residual`: residual += it in place, returns residual."""
        ...


OP_NAMES: tuple[str, ...] = tuple(n for n in Ops.__dict__ if not n.startswith("_"))
