"""Logprobs, n, /v1/completions (echo + logprobs), /tokenize, /detokenize and thinking budgets
through the official SDKs against the real server (tiny Qwen3.5, CPU backend).

Logprobs are checked against a full forward of the same tokens (`LLM.logits`), run on the test
thread while the server is idle.
"""
from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import openai
import pytest

from ninfer_nb.engine.logprobs import log_softmax
from tests.server.conftest import API_KEY, MODEL_ID, anthropic_client, openai_client
from tests.server.harness import LiveServer

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The capital of France is"


def post(srv: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=AUTH, timeout=60)


def ref_logprobs(llm: Any, ids: list[int]) -> np.ndarray:
    """[T, V]: row t is the log-distribution of token t + 1."""
    return log_softmax(llm.logits(ids)[:, : llm.valid_vocab])


def test_completion_echo_logprobs_match_forward(real_server: LiveServer, real_llm: Any) -> None:
    client = openai_client(real_server)
    out = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=3, temperature=0,
                                    logprobs=2, echo=True, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    ids = post(real_server, "/tokenize", {"prompt": PROMPT})
    prompt_ids = ids.json()["tokens"]
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert len(lp.tokens) == len(prompt_ids) + 3 == out.usage.prompt_tokens + 3
    assert choice.text.startswith(PROMPT) and lp.token_logprobs[0] is None
    gen_ids = real_llm.tokenizer.encode(choice.text[len(PROMPT):])
    all_ids = prompt_ids + gen_ids
    ref = ref_logprobs(real_llm, all_ids)
    for t in range(1, len(all_ids)):
        assert lp.token_logprobs[t] == pytest.approx(ref[t - 1, all_ids[t]], abs=2e-3)
    # greedy: every generated token is its row's top entry (the chosen one is in the dict too)
    for t in range(len(prompt_ids), len(all_ids)):
        assert lp.top_logprobs is not None and lp.token_logprobs[t] == max(lp.top_logprobs[t].values())
    assert lp.text_offset is not None and lp.text_offset[len(prompt_ids)] == len(PROMPT)
    # echo only (max_tokens 0): the log-likelihood request of an evaluation harness
    only = client.completions.create(model=MODEL_ID, prompt=prompt_ids, max_tokens=0, echo=True,
                                     logprobs=0)
    assert only.choices[0].text == PROMPT and only.usage.completion_tokens == 0
    assert only.choices[0].logprobs.token_logprobs[1:] == lp.token_logprobs[1:len(prompt_ids)]


def test_completion_stream_n_and_prompts(real_server: LiveServer) -> None:
    client = openai_client(real_server)
    texts: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    usage = None
    for chunk in client.completions.create(model=MODEL_ID, prompt=["one two", "three"], n=2,
                                           max_tokens=4, temperature=1.0, seed=5, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert sorted(finish) == [0, 1, 2, 3] and set(finish.values()) == {"length"}
    assert usage is not None and usage.completion_tokens == 16
    assert texts[0] != texts[1]            # seed + index: the choices differ
    again = client.completions.create(model=MODEL_ID, prompt="one two", n=2, max_tokens=4,
                                      temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    assert [c.text for c in again.choices] == [texts[0], texts[1]]   # and are reproducible


def test_completion_refusals(real_server: LiveServer) -> None:
    base = {"model": MODEL_ID, "prompt": "x"}
    for extra, param in [({"suffix": "y"}, "suffix"), ({"best_of": 3}, "best_of"),
                         ({"max_tokens": 0}, "max_tokens"), ({"logprobs": 21}, "logprobs"),
                         ({"prompt": [1, "a"]}, "prompt"), ({"prompt": [10**9]}, "prompt"),
                         ({"prompt": ["a"] * 20, "n": 16}, "prompt"),
                         ({"logit_bias": {"99999999999999999999": 1}}, "logit_bias"),
                         ({"logit_bias": {"248077": 1}}, "logit_bias")]:
        r = post(real_server, "/v1/completions", {**base, **extra})
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["param"] == param


def test_tokenize_detokenize_round_trip(real_server: LiveServer) -> None:
    text = "Hello, wörld! 123"
    tok = post(real_server, "/tokenize", {"model": MODEL_ID, "prompt": text,
                                          "return_token_strs": True}).json()
    assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"])
    assert tok["max_model_len"] == 384
    back = post(real_server, "/detokenize", {"model": MODEL_ID, "tokens": tok["tokens"]}).json()
    assert back["prompt"] == text
    chat = post(real_server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    n = openai_client(real_server).chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert chat["count"] == n.usage.prompt_tokens
    assert post(real_server, "/detokenize", {"tokens": [-1]}).status_code == 400


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_and_n(real_server: LiveServer, stream: bool) -> None:
    client = openai_client(real_server)
    kw: dict[str, Any] = dict(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}],
                              max_tokens=5, n=2, logprobs=True, top_logprobs=3, temperature=0.8,
                              seed=1, extra_body={"ignore_eos": True})
    entries: dict[int, list[Any]] = {0: [], 1: []}
    reasons: dict[int, str | None] = {}
    if stream:
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                if c.logprobs is not None and c.logprobs.content:
                    entries[c.index].extend(c.logprobs.content)
                if c.finish_reason:
                    reasons[c.index] = c.finish_reason
    else:
        out = client.chat.completions.create(**kw)
        assert out.usage.completion_tokens == 10
        for c in out.choices:
            assert c.logprobs is not None and c.logprobs.content is not None
            entries[c.index] = c.logprobs.content
            reasons[c.index] = c.finish_reason
    assert reasons == {0: "length", 1: "length"}
    for i in (0, 1):
        assert len(entries[i]) == 5
        for e in entries[i]:
            assert len(e.top_logprobs) == 3 and e.logprob <= 0.0
            tops = [t.logprob for t in e.top_logprobs]
            assert tops == sorted(tops, reverse=True) and e.logprob <= tops[0] + 1e-9


def test_chat_logprobs_refusals(real_server: LiveServer) -> None:
    client = openai_client(real_server)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}],
                                       top_logprobs=2, max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}],
                                       reasoning_effort="extreme", max_tokens=1)  # type: ignore[arg-type]


def test_thinking_budget_closes_think(real_server: LiveServer, real_llm: Any) -> None:
    """The random model never closes </think> by itself: with a budget it is forced to."""
    msg = anthropic_client(real_server).messages.create(
        model="m", max_tokens=14, messages=[{"role": "user", "content": "hi"}],
        thinking={"type": "enabled", "budget_tokens": 4})
    kinds = [b.type for b in msg.content]
    assert kinds[0] == "thinking" and "text" in kinds, kinds
    thinking = msg.content[0].thinking  # type: ignore[union-attr]
    assert len(real_llm.tokenizer.encode(thinking)) <= 5
    free = anthropic_client(real_server).messages.create(
        model="m", max_tokens=14, messages=[{"role": "user", "content": "hi"}],
        thinking={"type": "enabled", "budget_tokens": 100})
    assert [b.type for b in free.content] == ["thinking"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses",
                                  "/v1/responses/input_tokens", "/v1/messages",
                                  "/v1/messages/count_tokens", "/tokenize"])
def test_unknown_fields_are_refused_by_name(real_server: LiveServer, path: str) -> None:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": "x"}], "prompt": "x",
            "input": "x", "max_tokens": 1}
    body = {k: v for k, v in body.items()
            if k in {"/v1/chat/completions": {"model", "messages", "max_tokens"},
                     "/v1/completions": {"model", "prompt", "max_tokens"},
                     "/v1/responses": {"model", "input"},
                     "/v1/responses/input_tokens": {"model", "input"},
                     "/v1/messages": {"model", "messages", "max_tokens"},
                     "/v1/messages/count_tokens": {"model", "messages"},
                     "/tokenize": {"prompt"}}[path]}
    ok = {**body, "user": "u"} if path.startswith(("/v1/chat", "/v1/completions", "/v1/responses")) \
        else body
    assert post(real_server, path, ok).status_code == 200
    r = post(real_server, path, {**body, "frobnicate": 1})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "frobnicate" in err["message"]
    if not path.startswith("/v1/messages"):
        assert err["param"] == "frobnicate" and err["code"] == "unsupported_field"


def test_logit_bias_is_applied(real_server: LiveServer, real_llm: Any) -> None:
    out = openai_client(real_server).completions.create(
        model=MODEL_ID, prompt="hello", max_tokens=3, temperature=0, logit_bias={"42": 100},
        logprobs=0, extra_body={"ignore_eos": True})
    assert out.choices[0].logprobs.tokens == [real_llm.tokenizer.decode([42])] * 3


@pytest.mark.parametrize("stream", [False, True])
def test_responses_output_text_logprobs(real_server: LiveServer, stream: bool) -> None:
    client = openai_client(real_server)
    kw: dict[str, Any] = dict(model=MODEL_ID, input="hi", max_output_tokens=4, top_logprobs=2,
                              include=["message.output_text.logprobs"], reasoning={"effort": "none"},
                              temperature=0)
    entries: list[Any] = []
    if stream:
        for ev in client.responses.create(stream=True, **kw):
            if ev.type == "response.output_text.delta":
                entries.extend(ev.logprobs)
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
    else:
        final = client.responses.create(**kw)
    part = final.output[-1].content[0]
    assert part.type == "output_text" and part.logprobs is not None
    if stream:
        assert [e.logprob for e in entries] == [e.logprob for e in part.logprobs]
    assert 1 <= len(part.logprobs) <= final.usage.output_tokens
    for e in part.logprobs:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob - 1e-9


def test_thinking_budget_with_a_json_schema(real_server: LiveServer, real_llm: Any) -> None:
    """The forced </think> passes the grammar's free-thinking prefix (no matcher failure).
    (The random model may then write only the whitespace the grammar allows before the JSON.)"""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    r = post(real_server, "/v1/messages", {
        "model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 3},
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert r.status_code == 200, r.text
    blocks = r.json()["content"]
    assert blocks[0]["type"] == "thinking"
    assert len(real_llm.tokenizer.encode(blocks[0]["thinking"])) <= 4
    text = "".join(b["text"] for b in blocks if b["type"] == "text").strip()
    assert not text or text.startswith("{"), text
