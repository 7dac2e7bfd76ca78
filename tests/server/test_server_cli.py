"""`python -m ninfer_nb.server` as a real process: start-up, the README's curl examples run verbatim,
and SIGTERM draining an in-flight stream before a clean exit."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ninfer_nb.server.cli import parse_args

REPO = Path(__file__).resolve().parents[2]
README = REPO / "server" / "README.md"


def test_cli_flags_make_a_frozen_config() -> None:
    cfg = parse_args(["m.gguf", "--port", "9001", "--api-key", "k", "--no-thinking", "--cors",
                      "--max-pending", "3", "--temperature", "0.2", "--seed", "7",
                      "--request-log", "x.jsonl", "--max-request-mib", "1"])
    assert (cfg.model, cfg.port, cfg.api_key, cfg.enable_thinking, cfg.cors) == (
        "m.gguf", 9001, "k", False, True)
    assert cfg.max_pending == 3 and cfg.max_request_bytes == 1024 * 1024
    assert cfg.sampling.temperature == 0.2 and cfg.sampling.seed == 7
    with pytest.raises(SystemExit):
        parse_args(["--temperature", "9"])


def test_cli_engine_flags() -> None:
    """--draft-tokens K | auto | auto:K, the prefix cache's flags: into the config (LLM kwargs)."""
    cfg = parse_args(["m", "--spec", "ngram", "--draft-tokens", "auto:4", "--no-prefix-cache",
                      "--host-cache-mib", "512", "--kv-cache-fraction", "0.5"])
    assert (cfg.draft_tokens, cfg.prefix_cache, cfg.host_cache_mib, cfg.kv_cache_fraction) == ("auto:4", False, 512, 0.5)
    default = parse_args(["m", "--draft-tokens", "5"])
    assert (default.draft_tokens, default.prefix_cache, default.host_cache_mib) == (5, True, 0)
    for bad in (["--draft-tokens", "many"], ["--draft-tokens", "0"], ["--host-cache-mib", "-1"],
                ["--kv-cache-fraction", "0"]):
        with pytest.raises(SystemExit):
            parse_args(["m", *bad])


@pytest.fixture(scope="module")
def served(tiny_qwen35_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    log = tmp_path_factory.mktemp("cli") / "requests.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ninfer_nb.server", str(tiny_qwen35_dir), "--port", "0", "--device", "cpu",
         "--model-id", "local", "--api-key", "sk-local", "--max-context", "384",
         "--default-max-tokens", "8", "--request-log", str(log)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    url = ""
    deadline = time.monotonic() + 180
    while not url and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        match = re.search(r"http://([\d.]+:\d+)/v1", line)
        url = match.group(1) if match else ""
    if not url:
        proc.kill()
        pytest.fail(f"server did not start: {proc.stderr.read() if proc.stderr else ''}")
    yield proc, url, log
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def curl_examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## curl examples", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [c.strip() for c in re.sub(r"\\\n\s*", " ", block).split("\n\n") if c.strip()]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_curl_examples(served: tuple[subprocess.Popen[str], str, Path]) -> None:
    _, hostport, log = served
    commands = curl_examples()
    assert len(commands) == 9
    for command in commands:
        out = subprocess.run(["bash", "-c", command.replace("127.0.0.1:8080", hostport)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (command, out.stderr)
        body = out.stdout
        if "/metrics" in command:
            assert 'ninfer:request_success_total{finished_reason="length",model_name="local"}' \
                in body
        elif '"stream": true' in command:
            assert "data: [DONE]" in body or "event: message_stop" in body, body
            # no error event or error object (a generated token may well read "error")
            assert "event: error" not in body, body
            events = [json.loads(line[6:]) for line in body.splitlines()
                      if line.startswith("data: {")]
            assert events and not any("error" in e for e in events), body
        else:
            parsed = json.loads(body)
            assert not parsed.get("error"), parsed
    assert "sk-local" not in log.read_text()


def test_sigterm_drains_in_flight_stream(served: tuple[subprocess.Popen[str], str, Path]
                                         ) -> None:
    proc, hostport, _ = served
    lines: list[str] = []
    first = threading.Event()

    def client() -> None:
        body = {"model": "local", "stream": True, "max_tokens": 40,
                "messages": [{"role": "user", "content": "Tell me a long story."}]}
        with httpx.stream("POST", f"http://{hostport}/v1/chat/completions", json=body,
                          headers={"Authorization": "Bearer sk-local"}, timeout=120) as r:
            for line in r.iter_lines():
                lines.append(line)
                first.set()

    t = threading.Thread(target=client)
    t.start()
    assert first.wait(60)
    proc.send_signal(signal.SIGTERM)
    t.join(120)
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
    assert any('"finish_reason": "length"' in line for line in lines)
    assert proc.wait(60) == 0
    assert "stopped" in (proc.stderr.read() if proc.stderr else "")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{hostport}/health", timeout=5)
