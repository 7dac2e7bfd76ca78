"""Unit tests of the TUI's pure parts: commands, settings, SSE and /metrics parsing, history
store, transcript, rate meter, perf rows, Turn cancellation."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from ninfer_nb.tui import commands as cmd
from ninfer_nb.tui.conversation import Conversation, Message
from ninfer_nb.tui.events import (
    ChatEvent,
    ContentDelta,
    Done,
    EngineStats,
    Failed,
    ReasoningDelta,
    TokenTick,
    ToolCall,
    ToolCallDelta,
    TurnTimings,
)
from ninfer_nb.tui.http_client import HttpClient
from ninfer_nb.tui.prom import metric, parse_metrics, stats_from_metrics
from ninfer_nb.tui.rate import RateMeter
from ninfer_nb.tui.settings import ChatSettings, SettingError
from ninfer_nb.tui.sse import ChunkReader
from ninfer_nb.tui.store import HistoryStore
from ninfer_nb.tui.sysmon import LocalProbe, SystemStats, gpu_index
from ninfer_nb.tui.transcript import to_markdown
from ninfer_nb.tui.turn import Turn
from ninfer_nb.tui.widgets.perf import PerfView, perf_rows


def test_parse_commands() -> None:
    assert cmd.parse("/temp 0.5") == cmd.SetTemperature(0.5)
    assert cmd.parse("/top_p 0.9") == cmd.SetTopP(0.9)
    assert cmd.parse("/max_tokens 12") == cmd.SetMaxTokens(12)
    assert cmd.parse("/think off") == cmd.SetThinking(False)
    assert cmd.parse("/think ON") == cmd.SetThinking(True)
    assert cmd.parse("/think") == cmd.SetThinking(None)
    assert cmd.parse("/system  be brief ") == cmd.SetSystem("be brief")
    assert cmd.parse("/system") == cmd.SetSystem("")
    assert cmd.parse("/save") == cmd.Save(None)
    assert cmd.parse("/save ~/a b.md") == cmd.Save("~/a b.md")
    for text, expected in [("/clear", cmd.Clear()), ("/model", cmd.ShowModel()),
                           ("/help", cmd.ShowHelp()), ("/perf", cmd.TogglePerf())]:
        assert cmd.parse(text) == expected
    for bad, msg in [("/temp", "usage"), ("/temp hot", "needs a number"),
                     ("/max_tokens 1.5", "usage"), ("/think maybe", "usage"), ("/nope", "unknown")]:
        with pytest.raises(SettingError, match=msg):
            cmd.parse(bad)
    assert cmd.is_command("/temp 1") and not cmd.is_command("/") and not cmd.is_command("//x")
    assert not cmd.is_command("/ 3 apples")
    assert all(f"/{c.name}" in cmd.help_text() for c in cmd.COMMANDS)


def test_settings_validate_and_stay_immutable() -> None:
    s = ChatSettings()
    t = s.with_temperature(0.0).with_top_p(0.5).with_max_tokens(3).with_thinking(False)
    assert (s.temperature, s.top_p, s.max_tokens, s.thinking) == (0.7, 1.0, 1024, True)
    assert t.status() == "temp 0 · top_p 0.5 · max 3 · think off"
    for fn, v in [(s.with_temperature, 2.5), (s.with_top_p, 0.0), (s.with_max_tokens, 0)]:
        with pytest.raises(SettingError):
            fn(v)  # type: ignore[operator]


def _feed(reader: ChunkReader, chunks: list[object]) -> list[ChatEvent]:
    out: list[ChatEvent] = []
    for c in chunks:
        out += reader.feed(c if isinstance(c, str) else json.dumps(c))
    return out


def test_sse_chunks_to_events_with_usage_and_timings() -> None:
    r = ChunkReader()
    events = _feed(r, [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"reasoning_content": "hmm"}}]},
        {"choices": [{"delta": {"content": "Hi"}}]},
        "not json",
        {"choices": [{"delta": {"tool_calls": [{
            "index": 0, "id": "c1", "type": "function",
            "function": {"name": "get", "arguments": "{\"a\""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 4,
                                  "prompt_tokens_details": {"cached_tokens": 6}},
         "timings": {"prompt_per_second": 100.0, "predicted_per_second": 50.5, "prompt_ms": 80,
                     "draft_n": 8, "draft_n_accepted": 6}},
        "[DONE]",
    ])
    assert events == [ReasoningDelta("hmm"), ContentDelta("Hi")]
    tail = r.finish()
    assert tail[0] == ToolCallDelta(ToolCall("c1", "get", '{"a": 1}'))
    done = tail[1]
    assert isinstance(done, Done) and done.finish_reason == "tool_calls"
    t = done.timings
    assert (t.prompt_tokens, t.cached_tokens, t.completion_tokens) == (10, 6, 4)
    assert t.ttft_s == pytest.approx(0.08) and t.decode_tok_s == 50.5
    assert (t.draft_tokens, t.draft_accepted) == (8, 6)


def test_sse_error_chunk_and_missing_timings() -> None:
    r = ChunkReader()
    assert _feed(r, [{"error": {"message": "boom"}}]) == [Failed("server error: boom")]
    r = ChunkReader()
    _feed(r, [{"choices": [{"delta": {"content": "x"}, "finish_reason": "stop"}]}])
    (done,) = r.finish()
    assert done == Done("stop", TurnTimings())



def _sse_server(body: bytes, content_type: str = "text/event-stream") -> httpx.MockTransport:
    """/v1/models and a chat stream sent in 7-byte pieces (lines split across reads)."""
    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 7):
            yield body[i:i + 7]

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 64}]})
        assert request.headers["accept"] == "text/event-stream"
        return httpx.Response(200, headers={"content-type": content_type}, content=pieces())
    return httpx.MockTransport(handle)


async def test_http_client_splits_the_sse_stream_into_events() -> None:
    def data(chunk: object) -> bytes:
        return f"data: {json.dumps(chunk)}\r\n\r\n".encode()
    body = (b": keep-alive\n\n" + b"event: message\n" + data({"choices": [{"delta": {"content": "Hel"}}]})
            + data({"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]})
            + data({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
            + b"data: [DONE]\n\n")
    client = HttpClient("http://test", transport=_sse_server(body))
    events = [e async for e in client.chat([{"role": "user", "content": "hi"}], ChatSettings())]
    await client.close()
    assert [e for e in events if isinstance(e, ContentDelta)] == [ContentDelta("Hel"), ContentDelta("lo")]
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "stop"
    assert (done.timings.prompt_tokens, done.timings.completion_tokens) == (3, 2)

    client = HttpClient("http://test", transport=_sse_server(b"<html></html>", "text/html"))
    events = [e async for e in client.chat([{"role": "user", "content": "hi"}], ChatSettings())]
    await client.close()
    assert isinstance(events[-1], Failed) and "text/event-stream" in events[-1].message

METRICS = """# HELP ninfer:kv_cache_usage_perc KV usage
# TYPE ninfer:kv_cache_usage_perc gauge
ninfer:kv_cache_usage_perc{model_name="m"} 0.25
ninfer:num_requests_running{model_name="m"} 1
ninfer:spec_decode_num_draft_tokens_total{model_name="m"} 200
ninfer:spec_decode_num_accepted_tokens_total{model_name="m"} 150
ninfer:request_success_total{model_name="m",finished_reason="stop"} 3
ninfer:request_success_total{model_name="m",finished_reason="length"} 2
garbage line without value
ninfer:weird{a="b"} notanumber
ninfer:broken{, =.}:".}.
ninfer:time_to_first_token_seconds_bucket{le="+Inf"} 5 1700000000
"""


def test_prometheus_text_is_parsed_leniently() -> None:
    samples = parse_metrics(METRICS)
    assert metric(samples, "request_success_total") == 5
    assert samples["ninfer:request_success_total"][1][0]["finished_reason"] == "length"
    assert "ninfer:weird" not in samples and "ninfer:broken" not in samples
    assert metric(samples, "time_to_first_token_seconds_bucket") == 5
    s = stats_from_metrics(samples)
    assert s.kv_usage == 0.25 and s.requests_running == 1
    assert s.spec_acceptance == pytest.approx(0.75)
    assert stats_from_metrics(parse_metrics("")).spec_acceptance is None


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{model_name="m"} 3.0
vllm:num_requests_waiting{model_name="m"} 2.0
vllm:kv_cache_usage_perc{model_name="m"} 0.4
vllm:prefix_cache_queries_total{model_name="m"} 1000.0
vllm:prefix_cache_hits_total{model_name="m"} 900.0
vllm:spec_decode_num_drafts_total{model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 2.0
ninfer:decode_batch_size{model_name="m"} 2.5
"""


def test_vllm_metric_names_fill_the_batch_and_speculation_rows() -> None:
    s = stats_from_metrics(parse_metrics(VLLM_METRICS))
    assert (s.requests_running, s.requests_waiting, s.batch_size) == (3, 2, 2.5)
    assert s.kv_usage == 0.4 and s.prefix_hit_rate == pytest.approx(0.9)
    assert s.spec_acceptance == pytest.approx(0.5) and s.spec_per_pos == pytest.approx((0.8, 0.5, 0.2))
    rows = dict(perf_rows(PerfView(engine=s)))
    assert rows["batch"] == "3 run · 2 wait · B 2.5"
    assert rows["prefix hit"] == "90%" and rows["spec acc"] == "50% (80/50/20)"
    plain = dict(perf_rows(PerfView(engine=stats_from_metrics(parse_metrics(METRICS)))))
    assert "prefix hit" not in plain and plain["batch"] == "1 run · — wait"


def test_history_store_roundtrip_and_delete(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "d")
    conv = Conversation(title="t1", messages=[
        Message("user", "q"),
        Message("assistant", "a", "r", (ToolCall("c", "f", "{}"),), "TTFT 1 ms"),
    ])
    cid = store.save(conv, "model-x")
    other = store.save(Conversation(title="t2", messages=[Message("user", "z")]))
    assert [s.title for s in store.list()] == ["t2", "t1"]
    conv.messages.append(Message("user", "q2"))
    assert store.save(conv, "model-x") == cid          # rewrite in place
    store.close()
    store = HistoryStore(tmp_path / "d")                # survives reopening
    loaded = store.load(cid)
    assert loaded is not None and loaded.messages == conv.messages and loaded.title == "t1"
    store.delete(cid)
    assert store.load(cid) is None and [s.id for s in store.list()] == [other]
    store.close()


def test_transcript_markdown() -> None:
    conv = Conversation(title="Chat", messages=[
        Message("user", "hello"),
        Message("assistant", "```py\nx=1\n```", "line1\n\nline2", (ToolCall("c", "f", '{"a":1}'),),
                "TTFT 5 ms"),
    ])
    md = to_markdown(conv, model="m", system="sys")
    assert md.startswith("# Chat\n") and "## System\n\nsys" in md
    assert "> line1\n>\n> line2" in md and "```py\nx=1\n```" in md
    assert "**Tool call** `f`" in md and "*TTFT 5 ms*" in md


def test_rate_meter_window_and_throttle() -> None:
    m = RateMeter(window=5, min_interval_s=0.5)
    first = m.add(1, 0.0)
    assert first == TokenTick(1, 0.0)
    assert m.add(1, 0.1) is None                       # throttled
    for i in range(2, 5):
        assert m.add(1, i * 0.1) is None
    tick = m.add(1, 0.5)                               # 0.5 s after the last tick
    assert tick is not None and tick.tokens == 6
    assert tick.tok_s == pytest.approx(4 / 0.4)        # 5 newest stamps: 0.1 .. 0.5


def test_perf_rows_show_unknowns_and_speculation() -> None:
    rows = dict(perf_rows(PerfView(max_context=4096)))
    assert rows["decode"] == "—" and rows["spec acc"] == "off" and rows["context"] == "—/4096"
    v = PerfView(last=TurnTimings(100, 40, 10, 0.25, 800.0, 33.3, 20, 15),
                 engine=EngineStats(context_tokens=110, max_context=4096, kv_usage=0.5),
                 system=SystemStats(gpu_note="unavailable (no driver)"))
    rows = dict(perf_rows(v))
    assert rows["decode"] == "33.3 tok/s" and rows["TTFT"] == "250 ms"
    assert rows["prefill"] == "800.0 tok/s" and rows["cached"] == "40 tok"
    assert rows["context"] == "110/4096 3%" and rows["KV cache"] == "50% used"
    assert rows["spec acc"] == "75%" and rows["GPU"] == "unavailable (no driver)"
    v.generating, v.live_tok_s = True, 12.0
    assert dict(perf_rows(v))["decode"] == "12.0 tok/s"


def test_local_probe_never_raises() -> None:
    assert gpu_index("cuda:3") == 3 and gpu_index("cpu") is None and gpu_index("cuda") == 0
    probe = LocalProbe(0)           # no NVIDIA driver here: a reason, not an exception
    s = probe.sample()
    assert s.gpu is not None or s.gpu_note.startswith("unavailable")
    assert s.rss_bytes and s.rss_bytes > 0
    probe.close()
    cpu_only = LocalProbe(None).sample()
    assert cpu_only.gpu is None and "CPU backend" in cpu_only.gpu_note


async def _slow(n: int, closed: list[bool]) -> AsyncIterator[ChatEvent]:
    try:
        for i in range(n):
            await asyncio.sleep(0.01)
            yield TokenTick(i + 1, 10.0)
        yield Done("stop")
    finally:
        closed.append(True)


async def test_turn_cancel_is_immediate_and_terminal_once() -> None:
    closed: list[bool] = []
    turn = Turn(_slow(1000, closed), lambda e: None)
    seen: list[ChatEvent] = []
    async for ev in turn:
        seen.append(ev)
        if len(seen) == 3:
            turn.cancel()
            turn.cancel()
    assert seen[-1] == Done("cancelled", TurnTimings(completion_tokens=3))
    assert sum(isinstance(e, (Done, Failed)) for e in seen) == 1
    await turn.wait_closed()
    assert closed == [True] and not turn.active


async def test_turn_maps_errors_and_truncated_streams() -> None:
    async def boom() -> AsyncIterator[ChatEvent]:
        yield ContentDelta("x")
        raise ConnectionError("reset")

    events = [e async for e in Turn(boom(), lambda e: f"lost: {e}")]
    assert events == [ContentDelta("x"), Failed("lost: reset")]

    async def short() -> AsyncIterator[ChatEvent]:
        yield ContentDelta("x")

    events = [e async for e in Turn(short(), lambda e: None)]
    assert isinstance(events[-1], Failed)
