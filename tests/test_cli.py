"""The one-shot CLI: answers stream to stdout, timing to stderr; every bad input is one clear
line on stderr with exit status 2 and no traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ninfer_nb", *args], capture_output=True,
                          text=True, timeout=timeout)


def assert_user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.strip().splitlines() if l.startswith("ninfer: error:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_answers_with_tiny_model_and_prints_timings(tiny_qwen35_dir: Path) -> None:
    proc = run_cli("--model", str(tiny_qwen35_dir), "--device", "cpu", "--greedy", "--no-thinking",
                   "--max-new", "8", "--prompt", "Hello", "--print-token-ids")
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stderr and "decode" in proc.stderr and "tok/s" in proc.stderr
    ids = [l for l in proc.stderr.splitlines() if l.startswith("token ids:")]
    assert len(ids) == 1 and len(ids[0].split()) == 2 + 8


def test_messages_file_with_tools(tiny_qwen35_dir: Path, tmp_path: Path) -> None:
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "weather?"}],
                             "tools": [{"type": "function", "function": {"name": "get_weather",
                                        "parameters": {"type": "object", "properties": {}}}}]}))
    proc = run_cli("--model", str(tiny_qwen35_dir), "--device", "cpu", "--greedy",
                   "--max-new", "4", "--messages", str(f))
    assert proc.returncode == 0, proc.stderr


def test_missing_model_path(tmp_path: Path) -> None:
    assert_user_error(run_cli("--model", str(tmp_path / "nope"), "--prompt", "hi"), "not found")


def test_corrupt_safetensors(tiny_qwen35_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in tiny_qwen35_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    shard = sorted(bad.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])                    # truncated
    assert_user_error(run_cli("--model", str(bad), "--device", "cpu", "--prompt", "hi"), "truncated")
    shard.write_bytes(b"\xff" * 64)                              # garbage header
    assert_user_error(run_cli("--model", str(bad), "--device", "cpu", "--prompt", "hi"), shard.name)


def test_corrupt_gguf(tmp_path: Path) -> None:
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 10)
    assert_user_error(run_cli("--model", str(f), "--prompt", "hi"))


def test_unsupported_architecture(tiny_qwen35_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "odd"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt_bigcode", "hidden_size": 8}))
    assert_user_error(run_cli("--model", str(d), "--device", "cpu", "--prompt", "hi"),
                      "unsupported model_type", "gpt_bigcode")


def test_empty_prompt_and_bad_sampling(tiny_qwen35_dir: Path) -> None:
    m = ("--model", str(tiny_qwen35_dir), "--device", "cpu")
    assert_user_error(run_cli(*m, "--prompt", "   "), "empty")
    assert_user_error(run_cli(*m, "--prompt", "hi", "--temperature", "-1"), "temperature")
    assert_user_error(run_cli(*m, "--prompt", "hi", "--top-p", "0"), "top_p")
    assert_user_error(run_cli(*m, "--prompt", "hi", "--max-new", "0"), "max_tokens")
    assert_user_error(run_cli(*m), "--prompt")


def test_prompt_longer_than_context(tiny_qwen35_dir: Path) -> None:
    proc = run_cli("--model", str(tiny_qwen35_dir), "--device", "cpu", "--max-context", "16",
                   "--prompt", "word " * 50)
    assert_user_error(proc, "context")


def test_bad_device(tiny_qwen35_dir: Path) -> None:
    assert_user_error(run_cli("--model", str(tiny_qwen35_dir), "--device", "tpu", "--prompt", "hi"),
                      "device")


def test_help_lists_options() -> None:
    proc = run_cli("-h")
    assert proc.returncode == 0
    for flag in ("--model", "--max-new", "--max-context", "--temperature", "--top-p", "--top-k",
                 "--min-p", "--presence-penalty", "--frequency-penalty", "--seed", "--greedy",
                 "--stop", "--no-thinking", "--device", "--print-token-ids", "--messages"):
        assert flag in proc.stdout
