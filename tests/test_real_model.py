"""The real default model, SmolLM2-135M-Instruct (Q4_1 GGUF, pulled once per machine):
it answers correctly through the CLI and the API, and its logits match transformers run on the
same dequantized weights."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams


@pytest.fixture(scope="module")
def smollm() -> LLM:
    return LLM(None, device="cpu", max_context=1024)


def test_cli_answers_paris() -> None:
    proc = subprocess.run([sys.executable, "-m", "ninfer_nb", "--device", "cpu", "--greedy",
                           "--prompt", "What is the capital of France?"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "TTFT" in proc.stderr and "decode" in proc.stderr


def test_chat_answers_paris(smollm: LLM) -> None:
    out = smollm.chat([{"role": "user", "content": "What is the capital of France?"}],
                      params=SamplingParams(max_tokens=40, temperature=0.0))
    assert "Paris" in out.content
    assert out.result.finish_reason == "stop"


def test_logits_match_transformers_on_dequantized_weights(smollm: LLM) -> None:
    torch = pytest.importorskip("torch")
    import transformers as tf

    from ninfer_nb.models.loader import load_checkpoint
    from ninfer_nb.quant.rows import values

    ckpt = load_checkpoint(None)
    c = ckpt.config
    hf = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings))
    state = {k: torch.from_numpy(np.ascontiguousarray(values(v))) for k, v in ckpt.weights.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    ids = smollm.tokenizer.encode("The history of the Roman Empire begins with")
    ours = smollm.logits(ids)
    with torch.no_grad():
        ref = hf.eval()(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max()
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
