"""Requests with filters and penalties sampled in the decode graph (kernels/sample_pick.py through
CudaBackend's pick), end to end on a tiny checkpoint: greedy with penalties / bias gives the
logits-row path's tokens (the device counts every token it picks, steps queued ahead); sampled
requests are reproducible by seed and only produce ids the host sampler's distribution allows."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams
from tests.engine.test_gpu_model import gpu_checkpoint, host_pick

pytestmark = pytest.mark.gpu


def test_penalized_greedy_and_filtered_sampling_in_the_graph(tiny_checkpoints) -> None:
    path = gpu_checkpoint(tiny_checkpoints, "qwen35_moe")
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, 4000, 9)]
    fast = LLM(str(path), device="cuda", max_context=128)
    plain = host_pick(path)
    for p in (SamplingParams(max_tokens=24, temperature=0.0, presence_penalty=1.5, frequency_penalty=0.5,
                             ignore_eos=True),
              SamplingParams(max_tokens=24, temperature=0.0, repetition_penalty=1.8,
                             logit_bias=((int(prompt[0]), 3.0),), ignore_eos=True)):
        assert fast.generate(prompt, p).token_ids == plain.generate(prompt, p).token_ids, p
    s = SamplingParams(max_tokens=24, temperature=0.8, top_k=20, top_p=0.95, presence_penalty=1.0, seed=3,
                       ignore_eos=True)
    a, b, c = fast.generate(prompt, s), fast.generate(prompt, s), fast.generate(prompt, s.replace(seed=4))
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids
    assert fast.engine.picks_on_device
