"""lm-evaluation-harness end to end against the real server serving SmolLM2-135M-Instruct (the
default model) on the CPU backend: a local multiple-choice task through /v1/completions (echo +
logprobs, the remote tokenizer on /tokenize, /detokenize, /tokenizer_info) and a generation task
through /v1/chat/completions. Each log-likelihood the harness reports is checked against a full
forward of the same tokens, its accuracy against those log-likelihoods, and each generation
against the engine's own greedy chat answer.

`lm_eval` comes without its declared dependencies (`pip install --no-deps lm_eval`, .ci/run):
its local API models and a local JSON task need only the ones in the test extra (datasets,
sacrebleu, dill, tenacity), not scikit-learn, evaluate, nltk or the sdists rouge-score,
sqlitedict and word2number. Skipped where it is missing, except in CI.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ninfer_nb.engine.logprobs import log_softmax
from tests.server.conftest import base_config
from tests.server.harness import LiveServer

if os.environ.get("CI"):
    import lm_eval  # noqa: F401  (CI installs it: this test must run there, never skip)
else:
    pytest.importorskip("lm_eval")

# lm_eval's chat model drops `stop` and forces temperature 1 for model names containing "5"
# (its o1/o3/gpt-5 rule), e.g. "SmolLM2-135M-Instruct": serve under a name without one.
SERVED = "smollm2"
MC = [{"question": "What color is the sky on a clear day?", "choices": ["blue", "green", "red"],
       "answer": 0},
      {"question": "What is the capital of France?", "choices": ["Berlin", "Madrid", "Paris"],
       "answer": 2},
      {"question": "How many legs does a cat have?", "choices": ["two", "four", "six"],
       "answer": 1}]
GEN = [{"question": "What is the capital of France?", "answer": "Paris"},
       {"question": "Say hello.", "answer": "hello"}]
MAX_GEN = 8


@pytest.fixture(scope="module")
def smollm2() -> Any:
    from ninfer_nb import LLM
    from ninfer_nb.pull import ensure_default_model

    return LLM(str(ensure_default_model(show_progress=False)), device="cpu", max_context=512)


@pytest.fixture(scope="module")
def open_server(smollm2: Any) -> Iterator[LiveServer]:
    with LiveServer(smollm2, base_config(model_id=SERVED, api_key=None, max_context=512,
                                         default_max_tokens=16)) as srv:
        yield srv


def _tasks(root: Path) -> Path:
    for name, rows in (("mc", MC), ("gen", GEN)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = (f"dataset_path: json\ntest_split: test\ndataset_kwargs:\n  cache_dir: {root}/hf\n"
              f"  data_files:\n    test: {root}/")
    (root / "ninfer_mc.yaml").write_text(
        f"task: ninfer_mc\n{common}mc.jsonl\noutput_type: multiple_choice\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{answer}}\"\nmetric_list:\n  - metric: acc\n")
    (root / "ninfer_gen.yaml").write_text(
        f"task: ninfer_gen\n{common}gen.jsonl\noutput_type: generate_until\n"
        "doc_to_text: \"{{question}}\"\ndoc_to_target: \"{{answer}}\"\n"
        f"generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: {MAX_GEN}\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    return root


def test_lm_eval_multiple_choice_and_generation(open_server: LiveServer, smollm2: Any,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from ninfer_nb.params import SamplingParams

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    tm = TaskManager(include_path=str(_tasks(tmp_path)), include_defaults=False)
    url = open_server.url
    mc = simple_evaluate(model="local-completions", tasks=["ninfer_mc"], task_manager=tm,
                         model_args=f"model={SERVED},base_url={url}/v1/completions,"
                                    "tokenizer_backend=remote,num_concurrent=1,max_retries=1",
                         log_samples=True, torch_random_seed=None)   # None: no torch import
    assert mc is not None
    samples = sorted(mc["samples"]["ninfer_mc"], key=lambda s: s["doc_id"])
    assert [s["doc"]["question"] for s in samples] == [d["question"] for d in MC]
    tok, right = smollm2.tokenizer, []
    for sample in samples:
        ctx = f"Question: {sample['doc']['question']}\nAnswer:"
        logliks = [float(r[0][0]) for r in sample["resps"]]
        assert len(logliks) == len(sample["doc"]["choices"]) == 3
        for loglik, choice in zip(logliks, sample["doc"]["choices"]):
            # lm_eval's split: the whole encoded, the context's tokens cut off the front
            # (its target delimiter " " goes before the choice)
            whole, c = tok.encode(ctx + " " + choice), tok.encode(ctx)
            w = whole[len(c):]
            lp = log_softmax(smollm2.logits(c + w)[:, : smollm2.valid_vocab])
            want = sum(lp[len(c) - 1 + i, t] for i, t in enumerate(w))
            assert loglik < 0.0 and loglik == pytest.approx(float(want), abs=5e-3)
        right.append(float(int(np.argmax(logliks)) == sample["doc"]["answer"]))
    acc = mc["results"]["ninfer_mc"]["acc,none"]
    assert acc == pytest.approx(np.mean(right))           # scored from those log-likelihoods
    assert right[1] == 1.0                                 # the real model knows Paris

    gen = simple_evaluate(model="local-chat-completions", tasks=["ninfer_gen"], task_manager=tm,
                          model_args=f"model={SERVED},base_url={url}/v1/chat/completions,"
                                     "num_concurrent=1,max_retries=1",
                          apply_chat_template=True, log_samples=True, torch_random_seed=None)
    assert gen is not None
    hits, texts = [], []
    for sample in sorted(gen["samples"]["ninfer_gen"], key=lambda s: s["doc_id"]):
        text = sample["resps"][0][0]
        own = smollm2.chat([{"role": "user", "content": sample["doc"]["question"]}],
                           params=SamplingParams(temperature=0.0, max_tokens=MAX_GEN,
                                                 stop=("\n",))).content
        assert text == own and text.strip()                # the model's greedy answer, verbatim
        hits.append(float(text == sample["doc"]["answer"]))
        texts.append(text)
    assert len(texts) == len(GEN) and "Paris" in texts[0]
    assert gen["results"]["ninfer_gen"]["exact_match,none"] == pytest.approx(np.mean(hits))
