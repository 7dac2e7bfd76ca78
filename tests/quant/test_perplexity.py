"""The perplexity / KL tool's arithmetic against direct formulas on synthetic logits, and the
default corpus."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ninfer_nb import cli
from ninfer_nb.perplexity import default_text, evaluate, evaluate_many, windows
from tests.support.sharded import write_sharded


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_windows_are_back_to_back_and_drop_the_tail() -> None:
    assert windows(list(range(10)), 4, None) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert windows(list(range(10)), 4, 1) == [[0, 1, 2, 3]]


def test_ppl_kl_and_same_top_match_their_formulas() -> None:
    rng = np.random.default_rng(0)
    vocab, context = 11, 8
    ids = list(rng.integers(0, vocab, 3 * context))
    table_ref = rng.standard_normal((vocab, vocab)).astype(np.float32)
    noise = 0.3 * rng.standard_normal((vocab, vocab)).astype(np.float32)

    def ref(chunk: list[int]) -> np.ndarray:          # logits depend on the current token only
        return table_ref[np.asarray(chunk)]

    def model(chunk: list[int]) -> np.ndarray:
        return table_ref[np.asarray(chunk)] + noise[np.asarray(chunk)]

    rep = evaluate(model, ids, context, reference=ref)
    nll, nll_ref, kl, same = [], [], [], []
    for w in range(3):
        chunk = ids[w * context:(w + 1) * context]
        for pos in range(context // 2, context - 1):
            p, q = _softmax(ref([chunk[pos]])[0]), _softmax(model([chunk[pos]])[0])
            nxt = chunk[pos + 1]
            nll.append(-np.log(q[nxt]))
            nll_ref.append(-np.log(p[nxt]))
            kl.append(np.sum(p * np.log(p / q)))
            same.append(p.argmax() == q.argmax())
    assert rep.windows == 3 and rep.scored_tokens == 3 * (context // 2 - 1)
    assert np.isclose(rep.ppl, np.exp(np.mean(nll)), rtol=1e-5)
    assert np.isclose(rep.ppl_reference, np.exp(np.mean(nll_ref)), rtol=1e-5)
    assert np.isclose(rep.kl_mean, np.mean(kl), rtol=1e-4)
    assert np.isclose(rep.kl_p99, np.percentile(kl, 99), rtol=1e-4)
    assert rep.same_top == np.mean(same)
    same_model = evaluate_many([ref, model], ids, context, reference=ref)
    assert same_model[0].kl_mean < 1e-9 and same_model[0].same_top == 1.0
    assert np.isclose(same_model[1].kl_mean, rep.kl_mean)


def test_default_corpus_is_the_standard_library_topics() -> None:
    text = default_text()
    assert len(text) > 100_000 and "for" in text


def test_cli_model_against_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "m"
    write_sharded(d, layers_per_shard=2, hidden=64, inter=128, layers=2, vocab=64)
    text = tmp_path / "t.txt"
    text.write_text(" ".join(np.random.default_rng(0).choice(["a", "b", "c"], 80)))
    code = cli.main(["perplexity", str(d), str(d), "--reference", str(d), "--text", str(text),
                     "--context", "16", "--chunks", "3", "--json", "-q"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 2
    for line in out:
        rep = json.loads(line)
        assert rep["windows"] == 3 and rep["scored_tokens"] == 3 * 7
        assert rep["kl_mean"] < 1e-9 and rep["same_top"] == 1.0
        assert np.isclose(rep["ppl"], rep["ppl_reference"]) and rep["ppl"] > 1
