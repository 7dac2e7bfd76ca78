"""Hypothesis fuzzing of /v1/completions, /tokenize and /detokenize on the real tiny engine:
a valid body with one field replaced by arbitrary JSON (the fuzz suite's values). Every answer
is below 500; a 4xx is an OpenAI error body; a 200 stream ends with `data: [DONE]`; the server
answers a normal request afterwards."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.server.conftest import API_KEY, MODEL_ID
from tests.server.harness import LiveServer
from tests.server.test_server_fuzz import FUZZ, json_values

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"model": MODEL_ID, "prompt": "hi", "max_tokens": 2},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [1, 2]},
}
FIELDS = {
    "/v1/completions": ["model", "prompt", "suffix", "max_tokens", "echo", "logprobs", "n",
                        "best_of", "stop", "stream", "stream_options", "temperature", "top_p",
                        "top_k", "seed", "logit_bias", "repetition_penalty", "ignore_eos", "user"],
    "/tokenize": ["model", "prompt", "messages", "add_special_tokens", "return_token_strs",
                  "add_generation_prompt", "x"],
    "/detokenize": ["model", "tokens", "x"],
}


@pytest.fixture(scope="module")
def client(real_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=real_server.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize("path", list(ROUTES))
def test_fuzz_completion_routes(client: httpx.Client, path: str) -> None:
    @settings(FUZZ, max_examples=25)
    @given(key=st.sampled_from(FIELDS[path]), data=json_values)
    def one(key: str, data: Any) -> None:
        body = {**ROUTES[path], key: data}
        if path == "/v1/completions" and isinstance(body.get("max_tokens"), int) \
                and not isinstance(body["max_tokens"], bool):
            body["max_tokens"] = min(body["max_tokens"], 2)    # keep the engine's work small
        if path == "/v1/completions" and isinstance(body.get("n"), int):
            body["n"] = min(body["n"], 2)
        r = client.post(path, content=json.dumps(body).encode(), headers=AUTH)
        assert r.status_code < 500, (body, r.status_code, r.text[:300])
        if r.status_code >= 400:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        elif r.headers["content-type"].startswith("text/event-stream"):
            assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
        else:
            r.json()

    one()
    assert client.post("/v1/completions", json=ROUTES["/v1/completions"],
                       headers=AUTH).status_code == 200
