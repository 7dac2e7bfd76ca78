"""Speculation in /metrics: the engine's running totals (SpecStats.as_metrics, through
LLM.stats) become vLLM's spec_decode_* counters, per draft position too."""
from __future__ import annotations

import re

from ninfer_nb.engine.spec.stats import SpecStats
from ninfer_nb.server.metrics import Gauges, Metrics


def _value(text: str, name: str, extra: str = "", ns: str = "ninfer") -> float:
    m = re.search(rf'^{ns}:{name}{{model_name="m"{extra}}} ([0-9.e+]+)$', text, re.M)
    assert m, f"{name}{extra} not in /metrics"
    return float(m.group(1))


def test_spec_totals_become_counters() -> None:
    s = SpecStats()
    s.record(3, 3)
    s.record(3, 1)
    metrics = Metrics("m", 1024)

    def render() -> str:
        t = s.as_metrics()
        spec = (t["spec_drafts"], t["spec_draft_tokens"], t["spec_accepted_tokens"], tuple(t["spec_accepted_per_pos"]))
        return metrics.render(Gauges(running=0, waiting=0, kv_cache_usage=0.0, kv_capacity_tokens=1, spec=spec)).decode()

    text = render()
    assert _value(text, "spec_decode_num_drafts_total") == 2
    assert _value(text, "spec_decode_num_draft_tokens_total") == 6
    assert _value(text, "spec_decode_num_accepted_tokens_total") == 4
    assert [_value(text, "spec_decode_num_accepted_tokens_per_pos_total", f',position="{i}"') for i in range(3)] == [2, 1, 1]
    for name, want in (("spec_decode_num_drafts_total", 2), ("spec_decode_num_draft_tokens_total", 6),
                       ("spec_decode_num_accepted_tokens_total", 4)):
        assert _value(text, name, ns="vllm") == want                 # vLLM's names carry the same totals
    assert _value(text, "spec_decode_num_accepted_tokens_per_pos_total", ',position="1"', ns="vllm") == 1
    s.record(2, 0)
    text = render()                          # a later scrape counts only what is new
    assert _value(text, "spec_decode_num_drafts_total") == 3
    assert _value(text, "spec_decode_num_draft_tokens_total") == 8
    assert _value(text, "spec_decode_num_accepted_tokens_total") == 4
