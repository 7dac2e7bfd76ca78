"""Simulator cases beyond one op family: a whole tiny hybrid model through CudaOps against the
CPU backend, and the simulator's own stand-in for the tensor-core mma (ptx_sim). Both run under
the CUDA simulator only (tests/support/sim_runner.py); on the GPU the model is checked end to
end by tests/runtime and the engine tests."""
from __future__ import annotations

import numpy as np
from numba import cuda  # the simulator swaps a module-level `cuda` only

from ninfer_nb.kernels.common.ptx import mma_bf16, pack_bf16x2
from ninfer_nb.ops import cpu
from tests.kernels.case_util import SIM_ONLY, choose
from tests.kernels.device import DEVICE_MARKS
from tests.kernels.gpu_util import BF16, close, rnd

pytestmark = [*DEVICE_MARKS, SIM_ONLY]


def test_whole_hybrid_model_prefill_chunk_matches_cpu(dev, rng, monkeypatch):
    """A tiny dense Qwen3.5 through CudaOps against the CPU backend, for a prefill chunk that
    continues a sequence (positions 17..33; the first chunk runs on the CPU and its caches are
    copied over): fused projections and ops.split, one conv over q|k|v with a nonzero conv
    state, the chunked GDN (SIMT state pass) from a nonzero state, GQA prefill attention over
    cached keys, norms. (The MoE pieces have their own cases: the simulator is too slow for a
    whole MoE model in CI.)"""
    from ninfer_nb.config import ModelConfig
    from ninfer_nb.engine.backend import random_array
    from ninfer_nb.engine.batch import ForwardBatch
    from ninfer_nb.models.decoder import Decoder
    from ninfer_nb.models.presets import PRESETS, random_weights
    from ninfer_nb.models.state import new_state

    ops = dev.fresh()
    cfg = ModelConfig.from_hf(dict(
        PRESETS["tiny-qwen3.5"], vocab_size=96, hidden_size=64, intermediate_size=64,
        num_hidden_layers=2, full_attention_interval=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32))
    w = random_weights(cfg, lambda shape, kind: random_array(rng, shape, kind))
    ids = rng.integers(0, cfg.vocab_size, 34)
    # the TF32 state pass and prepare kernel have their own cases (simulated mma: CI time)
    choose(ops, monkeypatch, gdn_state="simt", gdn_prepare="simt")
    pos = np.arange(34)
    cpu_state = new_state(cfg, 64, np.zeros)
    Decoder(cfg, w).forward(cpu, ForwardBatch.single(ids[:17], pos[:17]), cpu_state)   # first chunk: CPU
    sim_state = new_state(cfg, 64, lambda shape, dtype=np.float32: ops.zeros(shape, dtype, persistent=True))
    for dst, src in zip(sim_state.layers, cpu_state.layers):
        for name, buf in vars(src).items():
            if buf is not None:
                getattr(dst, name)[...] = buf
    want = Decoder(cfg, w).forward(cpu, ForwardBatch.single(ids[17:], pos[17:], all_logits=True), cpu_state)
    got = Decoder(cfg, w).forward(ops, ForwardBatch.single(ids[17:].astype(np.int32), pos[17:].astype(np.int32),
                                                           all_logits=True), sim_state)
    close(got, want, 1e-4)
    for dst, src in zip(sim_state.layers, cpu_state.layers):              # the caches it leaves
        for name, buf in vars(src).items():
            if buf is not None:
                close(getattr(dst, name)[:34] if name in ("k", "v") else getattr(dst, name),
                      buf[:34] if name in ("k", "v") else buf, 1e-4)


@cuda.jit
def _one_mma(a, b, c, out):
    lane = cuda.threadIdx.x
    g = lane >> 2
    t = lane & 3
    fa = (pack_bf16x2(a[g, 2 * t + 1], a[g, 2 * t]), pack_bf16x2(a[g + 8, 2 * t + 1], a[g + 8, 2 * t]),
          pack_bf16x2(a[g, 2 * t + 9], a[g, 2 * t + 8]), pack_bf16x2(a[g + 8, 2 * t + 9], a[g + 8, 2 * t + 8]))
    b0 = pack_bf16x2(b[2 * t + 1, g], b[2 * t, g])
    b1 = pack_bf16x2(b[2 * t + 9, g], b[2 * t + 8, g])
    acc = (c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1])
    acc = mma_bf16(fa, b0, b1, acc)
    acc = mma_bf16(fa, b0, b1, acc)                     # twice: the rendezvous is reusable
    out[g, 2 * t] = acc[0]
    out[g, 2 * t + 1] = acc[1]
    out[g + 8, 2 * t] = acc[2]
    out[g + 8, 2 * t + 1] = acc[3]


def test_mma_emulation_fragment_layout(rng):
    """ptx_sim.mma_bf16 (what tensor-core kernels call under the simulator) computes C += A @ B
    from the PTX ISA m16n8k16 fragment layout, loaded here exactly as a kernel would."""
    a = rnd(rng, 16, 16).astype(BF16).astype(np.float32)
    b = rnd(rng, 16, 8).astype(BF16).astype(np.float32)
    c = rnd(rng, 16, 8)
    out = np.full((16, 8), np.nan, np.float32)
    _one_mma[1, 32](a, b, c, out)
    close(out, c + 2 * (a @ b), 1e-6)
