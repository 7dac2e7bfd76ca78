"""lm-evaluation-harness end to end against the real server (tiny Qwen3.5 on the CPU backend):
a local multiple-choice task through /v1/completions (echo + logprobs, the remote tokenizer
on /tokenize, /detokenize, /tokenizer_info) and a generation task through
/v1/chat/completions. Skipped where `lm_eval` is not installed (it is not in the test extra:
its dependencies, datasets and scikit-learn among them, take minutes to install); run it with
`pip install 'lm_eval[api]'`. The log-likelihoods it reports are checked against a full
forward of the same tokens.
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
from tests.server.conftest import MODEL_ID, base_config
from tests.server.harness import LiveServer

lm_eval = pytest.importorskip("lm_eval")

MC = [{"question": "What color is the sky on a clear day?", "choices": [" blue", " green", " red"],
       "answer": 0},
      {"question": "How many legs does a cat have?", "choices": [" two", " four", " six"],
       "answer": 1}]
GEN = [{"question": "Say hello.", "answer": "hello"}, {"question": "Name a color.", "answer": "blue"}]


@pytest.fixture(scope="module")
def open_server(real_llm: Any) -> Iterator[LiveServer]:
    with LiveServer(real_llm, base_config(api_key=None, default_max_tokens=16)) as srv:
        yield srv


def _tasks(root: Path) -> Path:
    for name, rows in (("mc", MC), ("gen", GEN)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = f"dataset_path: json\ntest_split: test\ndataset_kwargs:\n  data_files:\n    test: {root}/"
    (root / "ninfer_mc.yaml").write_text(
        f"task: ninfer_mc\n{common}mc.jsonl\noutput_type: multiple_choice\n"
        "doc_to_text: \"Question: {{question}}\\nAnswer:\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{answer}}\"\nmetric_list:\n  - metric: acc\n")
    (root / "ninfer_gen.yaml").write_text(
        f"task: ninfer_gen\n{common}gen.jsonl\noutput_type: generate_until\n"
        "doc_to_text: \"{{question}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    return root


def test_lm_eval_multiple_choice_and_generation(open_server: LiveServer, real_llm: Any,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tm = TaskManager(include_path=str(_tasks(tmp_path)))
    url = open_server.url
    mc = simple_evaluate(model="local-completions", tasks=["ninfer_mc"], task_manager=tm,
                         model_args=f"model={MODEL_ID},base_url={url}/v1/completions,"
                                    "tokenizer_backend=remote,num_concurrent=1,max_retries=1",
                         log_samples=True)
    assert mc is not None
    assert 0.0 <= mc["results"]["ninfer_mc"]["acc,none"] <= 1.0
    # each choice's log-likelihood equals our own forward over context + continuation
    assert mc["samples"]["ninfer_mc"]
    tok = real_llm.tokenizer
    for sample in mc["samples"]["ninfer_mc"]:
        ctx = f"Question: {sample['doc']['question']}\nAnswer:"
        for (loglik, _greedy), choice in zip([r[0] for r in sample["resps"]],
                                             sample["doc"]["choices"]):
            # lm_eval's split: the whole encoded, the context's tokens cut off the front
            # (its target delimiter " " goes before the choice)
            whole, c = tok.encode(ctx + " " + choice), tok.encode(ctx)
            w = whole[len(c):]
            lp = log_softmax(real_llm.logits(c + w)[:, : real_llm.valid_vocab])
            want = sum(lp[len(c) - 1 + i, t] for i, t in enumerate(w))
            assert float(loglik) == pytest.approx(float(want), abs=5e-3)
    gen = simple_evaluate(model="local-chat-completions", tasks=["ninfer_gen"], task_manager=tm,
                          model_args=f"model={MODEL_ID},base_url={url}/v1/chat/completions,"
                                     "num_concurrent=1,max_retries=1",
                          apply_chat_template=True)
    assert gen is not None
    assert gen["results"]["ninfer_gen"]["exact_match,none"] in (0.0, 0.5, 1.0)
    assert np.isfinite(mc["results"]["ninfer_mc"]["acc,none"])
