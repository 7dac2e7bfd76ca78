"""`draft_tokens` settings: a fixed K, or `auto` / `auto:K` (engine/spec/adaptive.py: K from the
measured acceptance, up to AUTO_MAX_K / K), from the CLI string to the engine's AdaptiveK."""
from __future__ import annotations

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
