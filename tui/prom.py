"""A lenient reader for Prometheus text exposition (a server's /metrics), and the mapping
from the ninfer/vLLM metric names to `EngineStats`.

Each sample line is parsed by `prometheus_client.parser`; a malformed line is skipped, never
raised on: a monitor must keep working against servers that export a little more or less than
expected. Metric names are matched by their suffix after the namespace (`ninfer:`, `ninfer_`,
`vllm:` ...), so renames of the prefix don't matter.
"""
from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from .events import EngineStats, spec_per_position

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    """name -> [(labels, value)], in file order. Comments and unparseable lines are ignored.
    Lines are parsed one at a time so that one bad line costs only itself."""
    out: Samples = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            families = list(text_string_to_metric_families(line + "\n"))
        except (ValueError, IndexError):    # what the parser raises on malformed text
            continue
        for family in families:
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
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


def per_label(samples: Samples, suffix: str, label: str) -> dict[str, float]:
    """label value -> the sum of the samples of `suffix` carrying it."""
    out: dict[str, float] = {}
    for name, rows in samples.items():
        if _short(name) != suffix:
            continue
        for labels, v in rows:
            if label in labels and math.isfinite(v):
                out[labels[label]] = out.get(labels[label], 0.0) + v
    return out


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def stats_from_metrics(samples: Samples) -> EngineStats:
    kv = metric(samples, "kv_cache_usage_perc")
    if kv is None:
        kv = metric(samples, "gpu_cache_usage_perc")
    drafted = metric(samples, "spec_decode_num_draft_tokens_total")
    accepted = metric(samples, "spec_decode_num_accepted_tokens_total")
    acceptance = accepted / drafted if drafted and accepted is not None else None
    queries = metric(samples, "prefix_cache_queries_total")
    hits = metric(samples, "prefix_cache_hits_total")
    positions = per_label(samples, "spec_decode_num_accepted_tokens_per_pos_total", "position") or \
        per_label(samples, "spec_decode_num_accepted_tokens_per_pos", "position")
    per_pos = spec_per_position({int(k): v for k, v in positions.items() if k.isdigit()},
                                metric(samples, "spec_decode_num_drafts_total"))
    batch = metric(samples, "decode_batch_size")
    if batch is None:
        batch = metric(samples, "n_busy_slots_per_decode")
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
        requests_waiting=_int(metric(samples, "num_requests_waiting")),
        batch_size=batch,
        prefix_hit_rate=hits / queries if queries and hits is not None else None,
        spec_per_pos=per_pos,
    )
