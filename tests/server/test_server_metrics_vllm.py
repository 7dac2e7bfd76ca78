"""/metrics under vLLM's names, scraped over real HTTP from the server on the tiny engine (CPU,
paged lanes with the prefix cache): the gauges and counters a vLLM dashboard reads, the prefix
cache's hits for a repeated conversation, and the decode rounds by batch size."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import API_KEY, MODEL_ID, openai_client
from tests.server.harness import LiveServer

CONVERSATION = [{"role": "user", "content": "Tell me a long story about the sea and the stars."}]


def scrape(srv: LiveServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(srv.url + "/metrics", headers={"x-api-key": API_KEY}, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"model_name": MODEL_ID, **labels}.items())))
    assert key in samples, name
    return samples[key]


def test_vllm_names_report_requests_kv_prefix_hits_and_batches(real_server: LiveServer) -> None:
    before = scrape(real_server)
    client = openai_client(real_server)
    for _ in range(2):                              # the second one: the prefix cache serves the prompt
        r = client.chat.completions.create(model=MODEL_ID, messages=CONVERSATION, max_tokens=4, temperature=0)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    after = scrape(real_server)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert value(after, name) >= 0
    assert 0.0 <= value(after, "vllm:kv_cache_usage_perc") <= 1.0

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"model_name": MODEL_ID, **labels}.items())))
        return value(after, name, **labels) - before.get(key, 0.0)

    queries, hits = delta("vllm:prefix_cache_queries_total"), delta("vllm:prefix_cache_hits_total")
    assert queries == 2 * r.usage.prompt_tokens
    assert 0 < hits == r.usage.prompt_tokens_details.cached_tokens
    assert delta("vllm:generation_tokens_total") == 8
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert value(after, "vllm:spec_decode_num_draft_tokens_total") == 0      # no speculation here
    rounds = {dict(labels)["batch_size"]: v for (name, labels), v in after.items()
              if name == "ninfer:decode_rounds_total"}
    assert rounds.get("1", 0) >= 6                   # 2 x 3 decode rounds of one row at least
    assert value(after, "ninfer:decode_batch_size") >= 1.0
