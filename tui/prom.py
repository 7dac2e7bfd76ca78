"""A lenient reader for Prometheus text exposition (a server's /metrics), and the mapping
from the ninfer/vLLM metric names to `EngineStats`.

Malformed lines are skipped, never raised on: a monitor must keep working against servers
that export a little more or less than expected. Metric names are matched by their suffix
after the namespace (`ninfer:`, `ninfer_`, `vllm:` ...), so renames of the prefix don't matter.
"""
from __future__ import annotations

import math
import re

from .events import EngineStats

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    """name -> [(labels, value)], in file order. Unparseable lines are ignored."""
    out: Samples = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def _short(name: str) -> str:
    for sep in (":", "_"):
        head, found, tail = name.partition(sep)
        if found and head in ("ninfer", "vllm", "llamacpp", "sglang"):
            return tail
    return name


def metric(samples: Samples, suffix: str) -> float | None:
    """Sum of all samples whose un-namespaced name is `suffix`; None when absent."""
    total: float | None = None
    for name, rows in samples.items():
        if _short(name) != suffix:
            continue
        for _, v in rows:
            if math.isfinite(v):
                total = v if total is None else total + v
    return total


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def stats_from_metrics(samples: Samples) -> EngineStats:
    kv = metric(samples, "kv_cache_usage_perc")
    if kv is None:
        kv = metric(samples, "gpu_cache_usage_perc")
    drafted = metric(samples, "spec_decode_num_draft_tokens_total")
    accepted = metric(samples, "spec_decode_num_accepted_tokens_total")
    acceptance = accepted / drafted if drafted and accepted is not None else None
    return EngineStats(
        context_tokens=_int(metric(samples, "context_tokens")),
        max_context=_int(metric(samples, "max_context_tokens")),
        kv_usage=kv,
        kv_cache_bytes=_int(metric(samples, "kv_cache_bytes")),
        kv_cache_used_bytes=_int(metric(samples, "kv_cache_used_bytes")),
        spec_acceptance=acceptance,
        device_memory_used=_int(metric(samples, "device_memory_used_bytes")),
        device_memory_total=_int(metric(samples, "device_memory_total_bytes")),
        requests_running=_int(metric(samples, "num_requests_running")),
    )
