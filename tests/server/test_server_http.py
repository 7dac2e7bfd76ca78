"""HTTP plumbing: request ids, CORS on and off, and the request log's error records."""
from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.server.conftest import API_KEY, MODEL_ID
from tests.server.harness import LiveServer


def test_cors_preflight_and_headers(scripted) -> None:
    srv = scripted("hi", cors=True)
    pre = httpx.options(srv.url + "/v1/chat/completions",
                        headers={"Origin": "http://app.example",
                                 "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 204
    assert pre.headers["Access-Control-Allow-Origin"] == "*"
    assert pre.headers["Access-Control-Allow-Headers"] == "*"
    r = httpx.get(srv.url + "/v1/models", headers={"x-api-key": API_KEY})
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    with httpx.stream("POST", srv.url + "/v1/chat/completions",
                      headers={"x-api-key": API_KEY},
                      json={"model": MODEL_ID, "stream": True,
                            "messages": [{"role": "user", "content": "x"}]}) as s:
        assert s.headers["Access-Control-Allow-Origin"] == "*"
        assert s.headers["request-id"].startswith("req_")
        assert s.headers["Content-Type"].startswith("text/event-stream")
        assert s.headers["Cache-Control"] == "no-cache"


def test_no_cors_by_default(real_server: LiveServer) -> None:
    pre = httpx.options(real_server.url + "/v1/chat/completions")
    assert pre.status_code in (401, 405)
    assert "Access-Control-Allow-Origin" not in pre.headers
    ids = {httpx.get(real_server.url + "/health").headers["request-id"] for _ in range(3)}
    assert len(ids) == 3


def test_request_log_records_errors_redacted(real_server: LiveServer) -> None:
    httpx.post(real_server.url + "/v1/chat/completions", content=b"{bad",
               headers={"Authorization": f"Bearer {API_KEY}"})
    httpx.post(real_server.url + "/v1/messages", json={}, headers={"x-api-key": "wrong-key"})
    text = Path(real_server.config.request_log or "").read_text()
    records = [json.loads(line) for line in text.splitlines()]
    errors = [r for r in records if r["event"] == "request_error"]
    assert {(e["status"], e["code"]) for e in errors} >= {(400, "invalid_json"),
                                                          (401, "invalid_api_key")}
    starts = [r for r in records if r["event"] == "request_start"]
    assert all(s["headers"].get("Authorization", "[redacted]") == "[redacted]" for s in starts)
    assert API_KEY not in text and "wrong-key" not in text
