"""The three protocols end to end on the real tiny engine (CPU), driven by the official SDKs:
shapes, SSE sequences, usage accounting, seeds, chaining, count_tokens, models, metrics, log."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, MODEL_ID, anthropic_client, openai_client
from tests.server.harness import LiveServer

HI = [{"role": "user", "content": "Hello there"}]


def test_models_and_health(real_server: LiveServer) -> None:
    client = openai_client(real_server)
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    card = client.models.retrieve(MODEL_ID)
    assert card.owned_by == "ninfer" and card.model_extra["max_model_len"] == 384  # type: ignore[index]
    assert card.model_extra["meta"]["n_vocab"] == 248320  # type: ignore[index]


def test_chat_completion_non_streaming(real_server: LiveServer) -> None:
    r = openai_client(real_server).chat.completions.create(
        model=MODEL_ID, messages=HI, max_tokens=5, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    text = (choice.message.content or "") + (choice.message.reasoning_content or "")  # type: ignore[attr-defined]
    assert text
    assert r.usage is not None and r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5
    timings = r.model_extra["timings"]  # type: ignore[index]    # engine-side extension
    assert timings["completion_tokens"] == 5 and timings["ttft_s"] > 0 and timings["decode_tok_s"] > 0


def test_chat_completion_streaming_with_usage(real_server: LiveServer) -> None:
    chunks = list(openai_client(real_server).chat.completions.create(
        model=MODEL_ID, messages=HI, max_tokens=4, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-2].model_extra["timings"]["completion_tokens"] == 4  # type: ignore[index]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4  # type: ignore[union-attr]
    streamed = "".join((c.choices[0].delta.content or "") +
                       (getattr(c.choices[0].delta, "reasoning_content", None) or "")
                       for c in chunks if c.choices)
    assert streamed


def test_seed_makes_sampling_repeatable(real_server: LiveServer) -> None:
    client = openai_client(real_server)

    def run(seed: int) -> str:
        r = client.chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=6,
                                           temperature=1.0, top_p=1.0, seed=seed,
                                           extra_body={"top_k": 0})
        m = r.choices[0].message
        return (m.reasoning_content or "") + (m.content or "")  # type: ignore[attr-defined]

    a, b = run(1234), run(1234)
    assert a == b
    assert any(run(s) != a for s in (1, 2, 3))


def test_greedy_matches_direct_engine(real_server: LiveServer, real_llm) -> None:
    from ninfer_nb import SamplingParams

    r = openai_client(real_server).chat.completions.create(
        model=MODEL_ID, messages=HI, max_tokens=6, temperature=0)
    served = (r.choices[0].message.reasoning_content or "") + (r.choices[0].message.content or "")  # type: ignore[attr-defined]
    direct = real_llm.chat(HI, params=SamplingParams(max_tokens=6, temperature=0.0))
    assert served == direct.reasoning + direct.content


def test_responses_and_chaining(real_server: LiveServer) -> None:
    client = openai_client(real_server)
    first = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=3,
                                    instructions="Be brief.")
    assert first.id.startswith("resp_") and first.status == "incomplete"
    assert first.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
    assert first.usage.output_tokens == 3 and first.instructions == "Be brief."  # type: ignore[union-attr]
    second = client.responses.create(model=MODEL_ID, input="And again", max_output_tokens=3,
                                     previous_response_id=first.id)
    # The chained prompt holds the first turn (input, instructions dropped) plus the new one.
    assert second.usage.input_tokens > first.usage.input_tokens  # type: ignore[union-attr]
    assert client.responses.retrieve(first.id).id == first.id
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL_ID, input="x", previous_response_id=first.id)


def test_responses_stream_event_sequence(real_server: LiveServer) -> None:
    events = list(openai_client(real_server).responses.create(
        model=MODEL_ID, input="Hi", max_output_tokens=4, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[-1] == "response.incomplete"
    assert types[2] == "response.output_item.added" and types[3] == "response.content_part.added"
    deltas = [e for e in events if e.type.endswith("_text.delta")]
    final = events[-1].response  # type: ignore[attr-defined]
    item = final.output[0]
    text = item.content[0].text
    assert "".join(d.delta for d in deltas) == text
    assert types[-4:-1] == [f"response.{item.content[0].type}.done",
                            "response.content_part.done", "response.output_item.done"]


def test_anthropic_messages_and_count_tokens(real_server: LiveServer) -> None:
    client = anthropic_client(real_server)
    msg = client.messages.create(model="claude-any", max_tokens=4, messages=HI,
                                 system="You are terse.")
    assert msg.id.startswith("msg_") and msg.model == "claude-any"
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 4
    counted = client.messages.count_tokens(model="claude-any", messages=HI,
                                           system="You are terse.")
    assert counted.input_tokens == msg.usage.input_tokens
    with client.messages.stream(model="m", max_tokens=3, messages=HI) as stream:
        types = [e.type for e in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "message_delta" in types and final.usage.output_tokens == 3


def test_metrics_and_request_log(real_server: LiveServer) -> None:
    openai_client(real_server).chat.completions.create(model=MODEL_ID, messages=HI, max_tokens=2)
    text = httpx.get(real_server.url + "/metrics", headers={"x-api-key": API_KEY}).text
    label = f'model_name="{MODEL_ID}"'
    for name in ("ninfer:num_requests_running", "ninfer:num_requests_waiting",
                 "ninfer:kv_cache_usage_perc", "ninfer:time_to_first_token_seconds_bucket",
                 "ninfer:e2e_request_latency_seconds_count", "ninfer:prompt_tokens_total",
                 "ninfer:generation_tokens_total", "ninfer:request_prompt_tokens_bucket"):
        assert any(line.startswith(name) and label in line for line in text.splitlines()), name
    success = [line for line in text.splitlines()
               if line.startswith("ninfer:request_success_total{")
               and 'finished_reason="length"' in line]
    assert float(success[0].rsplit(" ", 1)[1]) >= 1
    log_path = Path(real_server.config.request_log or "")
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert records[0]["event"] == "server_start"
    done = [r for r in records if r["event"] == "request_done" and r.get("completion_tokens")]
    assert done and {"prompt_tokens", "ttft_s", "decode_s", "e2e_s"} <= set(done[-1])
    assert API_KEY not in log_path.read_text()
