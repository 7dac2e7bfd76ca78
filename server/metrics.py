"""Prometheus metrics with vLLM-style `ninfer:*` names, in a registry owned by one app; the
metrics vLLM also has are exported under its own names too (`vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_hits_total`, `vllm:spec_decode_*`, ...), so
dashboards built for vLLM work unchanged.

Counters and histograms are fed by the telemetry; gauges and the engine's running totals
(speculation, decode rounds per batch size) are refreshed at scrape time from the caller's
snapshot. Knows no HTTP and no engine internals.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: N811
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "Gauges", "Metrics"]

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)


def token_buckets(max_tokens: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `max_tokens`."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_tokens:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


@dataclass(frozen=True, slots=True)
class Gauges:
    running: int
    waiting: int
    kv_cache_usage: float
    kv_capacity_tokens: int
    spec: tuple[int, int, int, tuple[int, ...]] = (0, 0, 0, ())   # engine totals: rounds, drafted,
    #   accepted, accepted per draft position (SpecStats.as_metrics)
    batch_sizes: dict[int, int] = field(default_factory=dict)    # engine totals: rows -> decode rounds


class _Both:
    """One metric under two names (ninfer's and vLLM's): every update goes to both."""

    def __init__(self, *metrics: Any) -> None:
        self.metrics = metrics

    def labels(self, *values: str) -> _Both:
        return _Both(*(m.labels(*values) for m in self.metrics))

    def inc(self, amount: float = 1.0) -> None:
        for m in self.metrics:
            m.inc(amount)

    def set(self, value: float) -> None:
        for m in self.metrics:
            m.set(value)

    def observe(self, value: float) -> None:
        for m in self.metrics:
            m.observe(value)


class Metrics:
    def __init__(self, model_name: str, max_context: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, lbl = self.registry, ["model_name"]
        self.model_name = model_name

        def names(name: str, vllm: str | None) -> list[str]:
            return [f"ninfer:{name}"] + ([f"vllm:{vllm}"] if vllm else [])

        def gauge(name: str, doc: str, vllm: str | None = None) -> Any:
            return _Both(*(Gauge(n, doc, lbl, registry=r) for n in names(name, vllm)))

        def counter(name: str, doc: str, extra: tuple[str, ...] = (), vllm: str | None = None) -> Any:
            return _Both(*(Counter(n, doc, [*lbl, *extra], registry=r) for n in names(name, vllm)))

        def hist(name: str, doc: str, buckets: tuple[float, ...], vllm: str | None = None) -> Any:
            return _Both(*(Histogram(n, doc, lbl, buckets=buckets, registry=r) for n in names(name, vllm)))

        # vllm=: the same metric under vLLM's name (a counter's name without its _total)
        self.running = gauge("num_requests_running", "Requests generating now", "num_requests_running")
        self.waiting = gauge("num_requests_waiting", "Requests queued for the engine", "num_requests_waiting")
        self.kv_usage = gauge("kv_cache_usage_perc", "Occupied KV cache fraction (1 = 100%)",
                              "kv_cache_usage_perc")
        self.kv_capacity = gauge("kv_cache_capacity_tokens", "KV cache capacity in tokens")
        self.busy_slots = gauge("n_busy_slots_per_decode", "Mean decode batch size (rows per decode round)")
        self.batch_size = gauge("decode_batch_size", "Mean rows per decode round since the last scrape")
        self.rounds = counter("decode_rounds", "Decode rounds (engine steps) by their rows", ("batch_size",))
        self.prompt_tokens = counter("prompt_tokens_total", "Prompt tokens (computed + reused)", vllm="prompt_tokens")
        self.cached_tokens = counter("prompt_tokens_cached_total", "Prompt tokens reused")
        self.prefix_queries = counter("prefix_cache_queries_total", "Prefix cache queries (tokens)",
                                      vllm="prefix_cache_queries")
        self.prefix_hits = counter("prefix_cache_hits_total", "Prefix cache hits (tokens)", vllm="prefix_cache_hits")
        self.generation_tokens = counter("generation_tokens_total", "Generated tokens", vllm="generation_tokens")
        self.n_decode = counter("n_decode_total", "Decode batch executions")
        self.success = counter("request_success_total", "Finished requests", ("finished_reason",),
                               vllm="request_success")
        self.failure = counter("request_failure_total", "Failed or rejected requests", ("reason",))
        self.ttft = hist("time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS,
                         "time_to_first_token_seconds")
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end latency", LATENCY_BUCKETS,
                        "e2e_request_latency_seconds")
        self.queue_time = hist("request_queue_time_seconds", "Time queued", LATENCY_BUCKETS,
                               "request_queue_time_seconds")
        self.prefill_time = hist("request_prefill_time_seconds", "Prefill time", LATENCY_BUCKETS,
                                 "request_prefill_time_seconds")
        self.decode_time = hist("request_decode_time_seconds", "Decode time", LATENCY_BUCKETS,
                                "request_decode_time_seconds")
        self.tpot = hist(
            "request_time_per_output_token_seconds", "decode_s / (completion - 1)", TPOT_BUCKETS,
            "request_time_per_output_token_seconds",
        )
        tb = token_buckets(max_context)
        self.req_prompt = hist("request_prompt_tokens", "Prompt tokens per request", tb, "request_prompt_tokens")
        self.req_generation = hist("request_generation_tokens", "Generated tokens per request", tb,
                                   "request_generation_tokens")
        self.drafts = counter("spec_decode_num_drafts_total", "Speculative drafts", vllm="spec_decode_num_drafts")
        self.draft_tokens = counter("spec_decode_num_draft_tokens_total", "Drafted tokens",
                                    vllm="spec_decode_num_draft_tokens")
        self.accepted = counter("spec_decode_num_accepted_tokens_total", "Accepted draft tokens",
                                vllm="spec_decode_num_accepted_tokens")
        self.accepted_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                    "Accepted draft tokens at each draft position", ("position",),
                                    vllm="spec_decode_num_accepted_tokens_per_pos")
        self._spec_seen: list[int] = [0, 0, 0]       # engine totals already counted
        self._pos_seen: list[int] = []
        self._rounds_seen: dict[int, int] = {}       # batch size -> rounds already counted
        for c in (self.prompt_tokens, self.cached_tokens, self.prefix_queries, self.prefix_hits,
                  self.generation_tokens, self.n_decode, self.drafts, self.draft_tokens,
                  self.accepted):
            c.labels(model_name)
        for reason in ("stop", "length", "abort"):
            self.success.labels(model_name, reason)

    def observe_success(
        self,
        finished_reason: str,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        queue_s: float,
        ttft_s: float | None,
        prefill_s: float,
        decode_s: float,
        e2e_s: float,
    ) -> None:
        m = self.model_name
        self.success.labels(m, finished_reason).inc()
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.cached_tokens.labels(m).inc(cached_tokens)
        self.prefix_queries.labels(m).inc(prompt_tokens)
        self.prefix_hits.labels(m).inc(cached_tokens)
        self.generation_tokens.labels(m).inc(completion_tokens)
        self.n_decode.labels(m).inc(max(0, completion_tokens - 1))
        if completion_tokens > 1:
            self.tpot.labels(m).observe(decode_s / (completion_tokens - 1))
        if ttft_s is not None:
            self.ttft.labels(m).observe(ttft_s)
        self.e2e.labels(m).observe(e2e_s)
        self.queue_time.labels(m).observe(queue_s)
        self.prefill_time.labels(m).observe(prefill_s)
        self.decode_time.labels(m).observe(decode_s)
        self.req_prompt.labels(m).observe(prompt_tokens)
        self.req_generation.labels(m).observe(completion_tokens)

    def observe_failure(self, reason: str) -> None:
        self.failure.labels(self.model_name, reason).inc()

    def render(self, gauges: Gauges) -> bytes:
        m = self.model_name
        self.running.labels(m).set(gauges.running)
        self.waiting.labels(m).set(gauges.waiting)
        self.kv_usage.labels(m).set(gauges.kv_cache_usage)
        self.kv_capacity.labels(m).set(gauges.kv_capacity_tokens)
        rounds, drafted, accepted, per_pos = gauges.spec
        for i, (c, total) in enumerate(((self.drafts, rounds), (self.draft_tokens, drafted),
                                        (self.accepted, accepted))):
            if total > self._spec_seen[i]:        # the engine's running totals -> counter increments
                c.labels(m).inc(total - self._spec_seen[i])
                self._spec_seen[i] = total
        for pos, total in enumerate(per_pos):
            if pos == len(self._pos_seen):
                self._pos_seen.append(0)
            if total > self._pos_seen[pos]:
                self.accepted_pos.labels(m, str(pos)).inc(total - self._pos_seen[pos])
                self._pos_seen[pos] = total
        rows = rounds = 0                            # decode rounds since the last scrape
        for size, total in gauges.batch_sizes.items():
            new = total - self._rounds_seen.get(size, 0)
            if new > 0:
                self.rounds.labels(m, str(size)).inc(new)
                self._rounds_seen[size] = total
                rows, rounds = rows + size * new, rounds + new
        if rounds:
            self.batch_size.labels(m).set(rows / rounds)
            self.busy_slots.labels(m).set(rows / rounds)
        return generate_latest(self.registry)
