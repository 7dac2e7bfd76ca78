"""The Qwen3.5 / 3.6 MTP head: loading `mtp.*` (dense and MoE, plain and multimodal layouts),
its forward against a NumPy reference written from the formula (transformers does not run
the MTP head), and MTP speculative decoding: greedy output equal to plain greedy output for
every K on tiny checkpoints with random MTP weights."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from ninfer_nb import LLM
from ninfer_nb.models.mtp import MTPHead
from ninfer_nb.models.state import KVCache
from ninfer_nb.models.weights import MLPWeights, MoEWeights
from ninfer_nb.ops import cpu


@pytest.fixture(scope="module")
def mtp_dense_dir(tiny_checkpoints) -> Path:
    return tiny_checkpoints.get("qwen35_mtp", "qwen35", mtp=True)


@pytest.fixture(scope="module")
def mtp_moe_dir(tiny_checkpoints) -> Path:
    return tiny_checkpoints.get("qwen35_moe_mtp", "qwen35_moe", wrapper=True, mtp=True)


def _tensors(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return {k.replace("model.language_model.", "model."): v.astype(np.float32) for k, v in out.items()}


def _zc_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Zero-centred RMSNorm over the last axis: x / rms(x) * (1 + w)."""
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * (1.0 + w)


def _reference_logits(t: dict[str, np.ndarray], cfg: dict, next_ids: np.ndarray, hidden: np.ndarray
                      ) -> np.ndarray:
    """The MTP head for pairs (next_ids[i], hidden[i]) at positions 0..T-1, from an empty MTP
    cache (causal attention among the pairs), in float64, straight from the formula."""
    eps, d = cfg["rms_norm_eps"], cfg["head_dim"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    rot = int(d * cfg["rope_parameters"]["partial_rotary_factor"])
    theta = cfg["rope_parameters"]["rope_theta"]
    n = len(next_ids)
    e = _zc_norm(t["model.embed_tokens.weight"][next_ids], t["mtp.pre_fc_norm_embedding.weight"], eps)
    h = _zc_norm(hidden, t["mtp.pre_fc_norm_hidden.weight"], eps)
    u = np.concatenate([e, h], axis=1) @ t["mtp.fc.weight"].T.astype(np.float64)          # [T, H]
    p = "mtp.layers.0."
    a = _zc_norm(u, t[p + "input_layernorm.weight"], eps)
    qg = (a @ t[p + "self_attn.q_proj.weight"].T).reshape(n, heads, 2, d)              # per head [q | gate]
    q, gate = qg[:, :, 0], qg[:, :, 1]
    k = (a @ t[p + "self_attn.k_proj.weight"].T).reshape(n, kv, d)
    v = (a @ t[p + "self_attn.v_proj.weight"].T).reshape(n, kv, d)
    q, k = _zc_norm(q, t[p + "self_attn.q_norm.weight"], eps), _zc_norm(k, t[p + "self_attn.k_norm.weight"], eps)
    inv = 1.0 / theta ** (np.arange(0, rot, 2) / rot)                                  # [rot / 2]
    ang = np.arange(n)[:, None] * inv[None, :]                                         # [T, rot / 2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x: np.ndarray) -> np.ndarray:                                             # NeoX halves
        x = x.copy()
        x1, x2 = x[..., : rot // 2].copy(), x[..., rot // 2 : rot].copy()
        x[..., : rot // 2], x[..., rot // 2 : rot] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        return x

    q, k = rope(q), rope(k)
    out = np.zeros((n, heads, d))
    for i in range(n):
        for j in range(heads):
            g = j // (heads // kv)
            s = k[: i + 1, g] @ q[i, j] / np.sqrt(d)
            w = np.exp(s - s.max())
            out[i, j] = (w / w.sum()) @ v[: i + 1, g]
    out = out / (1.0 + np.exp(-gate))                                                  # output gate
    u = u + out.reshape(n, heads * d) @ t[p + "self_attn.o_proj.weight"].T
    m = _zc_norm(u, t[p + "post_attention_layernorm.weight"], eps)
    gp, up = m @ t[p + "mlp.gate_proj.weight"].T, m @ t[p + "mlp.up_proj.weight"].T
    u = u + (gp / (1.0 + np.exp(-gp)) * up) @ t[p + "mlp.down_proj.weight"].T
    return _zc_norm(u, t["mtp.norm.weight"], eps) @ t["lm_head.weight"].T.astype(np.float64)


def test_mtp_forward_matches_the_formula(mtp_dense_dir: Path) -> None:
    llm = LLM(str(mtp_dense_dir), device="cpu", max_context=64)
    gen = llm.engine.generator
    cfg = json.loads((mtp_dense_dir / "config.json").read_text())
    head = MTPHead(gen.cfg, gen.decoder.weights)
    rng = np.random.default_rng(3)
    n, hsz = 7, cfg["hidden_size"]
    next_ids = rng.integers(0, 248000, n)
    hidden = rng.standard_normal((n, hsz)).astype(np.float32)
    cache = KVCache(k=np.zeros((64, cfg["num_key_value_heads"], cfg["head_dim"]), np.float32),
                    v=np.zeros((64, cfg["num_key_value_heads"], cfg["head_dim"]), np.float32))
    ours = head.logits(cpu, head.hidden(cpu, next_ids, hidden, np.arange(n), cache))
    ref = _reference_logits(_tensors(mtp_dense_dir), cfg, next_ids, hidden)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # one more pair at position n over the filled cache = the last row of all n + 1 at once
    nxt, hid = rng.integers(0, 248000, 1), rng.standard_normal((1, hsz)).astype(np.float32)
    step = head.logits(cpu, head.hidden(cpu, nxt, hid, np.array([n]), cache))
    ref = _reference_logits(_tensors(mtp_dense_dir), cfg, np.concatenate([next_ids, nxt]),
                            np.concatenate([hidden, hid]))
    np.testing.assert_allclose(step[0], ref[-1], rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_mtp_weights_load_dense_and_moe(mtp_dense_dir: Path, mtp_moe_dir: Path,
                                        tiny_qwen35_moe_dir: Path) -> None:
    dense = LLM(str(mtp_dense_dir), device="cpu", max_context=32).engine.generator.decoder.weights
    assert dense.mtp is not None and isinstance(dense.mtp.layer.ffn, MLPWeights)
    assert dense.mtp.fc_embedding.shape == dense.mtp.fc_hidden.shape == (64, 64)
    moe = LLM(str(mtp_moe_dir), device="cpu", max_context=32).engine.generator.decoder.weights
    assert moe.mtp is not None and isinstance(moe.mtp.layer.ffn, MoEWeights)
    # the multimodal fixture carries a stray, malformed mtp.fc: no MTP head, the model loads
    assert LLM(str(tiny_qwen35_moe_dir), device="cpu", max_context=32).engine.generator.decoder.weights.mtp is None


def _greedy_run(llm: LLM, prompt: list[int], n: int) -> list[int]:
    from ninfer_nb.engine.request import Request
    from ninfer_nb.params import SamplingParams

    request = Request("r", prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    llm.engine.add_request(request)
    while not request.finished:
        llm.engine.step()
    return request.output_ids


PROMPT = [int(t) for t in np.random.default_rng(9).integers(100, 240000, 30)]


@pytest.mark.parametrize("model", ["mtp_dense_dir", "mtp_moe_dir"])
def test_mtp_greedy_spec_equals_plain_for_every_k(model: str, request: pytest.FixtureRequest) -> None:
    """Greedy MTP speculation gives the plain greedy tokens for K = 1 and 3, over two prompts
    (the second shares the first's prefix: the head's cache keeps the common rows); the head's
    drafts are really verified (random MTP weights: few accepted, some rounds keep none)."""
    from ninfer_nb.engine.spec.mtp import MTPProposer

    path = str(request.getfixturevalue(model))
    plain_llm = LLM(path, device="cpu", max_context=96, prefill_chunk=16, max_concurrency=1)
    prompts = [PROMPT, PROMPT[:20] + [5, 6, 7]]
    plain = [_greedy_run(plain_llm, p, 16) for p in prompts]
    for k in (1, 3):
        llm = LLM(path, device="cpu", max_context=96, prefill_chunk=16, spec="mtp", draft_tokens=k,
                  max_concurrency=1)
        assert isinstance(llm.engine.proposer, MTPProposer)
        assert [_greedy_run(llm, p, 16) for p in prompts] == plain, f"K={k}"
        stats = llm.engine.spec_stats
        assert stats.rounds > 0 and 0 < stats.drafted <= stats.rounds * k


def test_mtp_proposer_drafts_what_the_head_predicts(mtp_dense_dir: Path) -> None:
    """The first draft of a round is the head's argmax for (last token, h at the position before
    it) over a cache filled with the sequence's pairs: the formula reference on the same pairs,
    with h from the target's own hiddens."""
    llm = LLM(str(mtp_dense_dir), device="cpu", max_context=64, spec="mtp", draft_tokens=2, max_concurrency=1)
    gen, proposer = llm.engine.generator, llm.engine.proposer
    logits, _ = gen.prefill(PROMPT)
    seq = PROMPT + [int(np.argmax(logits[: llm.valid_vocab]))]
    drafts = proposer.propose(seq, 2)
    hidden = gen.decoder.hidden(cpu, gen._batch(np.asarray(PROMPT), np.arange(len(PROMPT))),
                                _fresh_state(llm))                                     # h_0 .. h_{n-1}
    cfg = json.loads((mtp_dense_dir / "config.json").read_text())
    ref = _reference_logits(_tensors(mtp_dense_dir), cfg, np.asarray(seq[1:]), np.asarray(hidden))
    assert drafts[0] == int(np.argmax(ref[-1, : llm.valid_vocab]))
    assert len(drafts) == 2


def _fresh_state(llm: LLM):
    from ninfer_nb.models.state import new_state

    return new_state(llm.engine.generator.cfg, 64, np.zeros, "fp32", gdn_slots=1)


def test_mtp_on_a_random_preset_equals_plain() -> None:
    """random:PRESET models carry a random MTP head (the real checkpoints ship one): spec mtp
    runs on them, greedy output equal to plain."""
    llm = LLM("random:tiny-qwen3.5", device="cpu", max_context=96, spec="mtp", draft_tokens=3, max_concurrency=1)
    engine = llm.engine
    proposer, engine.proposer = engine.proposer, None
    plain = _greedy_run(llm, PROMPT, 10)
    engine.proposer = proposer
    assert _greedy_run(llm, PROMPT, 10) == plain and engine.spec_stats.rounds > 0
    engine.forget()                   # the same prompt again: the head's rows are all still valid
    assert _greedy_run(llm, PROMPT, 10) == plain


def test_mtp_shortlist_head_drafts_below_its_rows(mtp_dense_dir: Path) -> None:
    """set_draft_vocab(N): drafts come from the LM head's first N rows (ids < N), and equal the
    full head's argmax restricted to them; the output stays the plain one."""
    llm = LLM(str(mtp_dense_dir), device="cpu", max_context=64, spec="mtp", draft_tokens=3, max_concurrency=1)
    gen, proposer = llm.engine.generator, llm.engine.proposer
    logits, _ = gen.prefill(PROMPT)
    seq = PROMPT + [int(np.argmax(logits[: llm.valid_vocab]))]
    proposer.set_draft_vocab(5000)
    short = proposer.propose(seq, 3)
    assert len(short) == 3 and all(t < 5000 for t in short)
    hidden = gen.decoder.hidden(cpu, gen._batch(np.asarray(PROMPT), np.arange(len(PROMPT))), _fresh_state(llm))
    cfg = json.loads((mtp_dense_dir / "config.json").read_text())
    ref = _reference_logits(_tensors(mtp_dense_dir), cfg, np.asarray(seq[1:]), np.asarray(hidden))
    assert short[0] == int(np.argmax(ref[-1, :5000]))
