"""`draft_tokens` settings: a fixed K, or `auto` / `auto:K` (engine/spec/adaptive.py: K from the
measured acceptance, up to AUTO_MAX_K / K), from the CLI string to the engine's AdaptiveK."""
from __future__ import annotations

from pathlib import Path

import pytest

from ninfer_nb.engine.spec.adaptive import AUTO_MAX_K, AdaptiveK


@pytest.mark.parametrize("value,want", [(3, (3, False)), ("3", (3, False)), (" auto ", (AUTO_MAX_K, True)),
                                        ("AUTO:7", (7, True)), ("auto:1", (1, True))])
def test_parse_draft_tokens(value, want) -> None:
    assert AdaptiveK.parse(value) == want


@pytest.mark.parametrize("value", ["0", "auto:0", "auto:x", "fast", "", "-2"])
def test_parse_draft_tokens_rejects(value) -> None:
    with pytest.raises(ValueError):
        AdaptiveK.parse(value)


@pytest.mark.parametrize("value,k,adaptive", [("auto", AUTO_MAX_K, True), ("auto:2", 2, True), (3, 3, False)])
def test_llm_draft_tokens_reach_the_engine(tiny_qwen35_dir: Path, value, k, adaptive) -> None:
    """LLM(draft_tokens=...): the engine's maximum K and whether it adapts (AdaptiveK starting at
    that maximum); speculation off adapts nothing."""
    from ninfer_nb import LLM

    engine = LLM(str(tiny_qwen35_dir), device="cpu", max_context=32, spec="ngram", draft_tokens=value).engine
    assert engine.draft_tokens == k
    assert (engine.adaptive is not None) == adaptive
    if adaptive:
        assert engine.adaptive.max_k == k and engine.adaptive.next_k() == k
    assert LLM(str(tiny_qwen35_dir), device="cpu", max_context=32, draft_tokens=value).engine.adaptive is None


def test_bad_draft_tokens_is_a_user_error(tiny_qwen35_dir: Path) -> None:
    from ninfer_nb import LLM
    from ninfer_nb.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="auto"):
        LLM(str(tiny_qwen35_dir), device="cpu", max_context=32, spec="ngram", draft_tokens="fast")


def test_cli_takes_auto_and_rejects_other_words(tiny_qwen35_dir: Path) -> None:
    """ninfer --draft-tokens: auto / auto:K / K reach LLM as given; another word is one
    'ninfer: error:' line, exit status 2."""
    import subprocess
    import sys

    from ninfer_nb.cli import build_parser

    assert build_parser().parse_args(["--draft-tokens", "auto:4"]).draft_tokens == "auto:4"
    proc = subprocess.run([sys.executable, "-m", "ninfer_nb", "--model", str(tiny_qwen35_dir), "--device", "cpu",
                           "--spec", "ngram", "--draft-tokens", "fast", "--prompt", "hi"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("ninfer: error:") and "auto" in line]
