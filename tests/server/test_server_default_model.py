"""`ninfer-serve` with no MODEL serves the default embedded model (SmolLM2-135M-Instruct, pulled
once per machine) and answers a real question through the OpenAI SDK."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parents[2]


def test_default_model_is_served_and_answers() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ninfer_nb.server", "--port", "0", "--device", "cpu"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        url, deadline = "", time.monotonic() + 300
        while not url and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            match = re.search(r"(http://[\d.]+:\d+)/v1", line)
            url = match.group(1) if match else ""
        assert url, proc.stderr.read() if proc.stderr else "no output"
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
        r = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", max_tokens=24, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in (r.choices[0].message.content or "")
    finally:
        proc.terminate()
        proc.wait(30)
