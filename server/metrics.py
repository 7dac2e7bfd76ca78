"""Prometheus metrics with vLLM-style `ninfer:*` names, in a registry owned by one app.

Counters and histograms are fed by the telemetry; gauges are refreshed at scrape time from
the caller's snapshot. Knows no HTTP and no engine internals.
"""
from __future__ import annotations

from dataclasses import dataclass

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


class Metrics:
    def __init__(self, model_name: str, max_context: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, lbl = self.registry, ["model_name"]
        self.model_name = model_name

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"ninfer:{name}", doc, lbl, registry=r)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f"ninfer:{name}", doc, [*lbl, *extra], registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"ninfer:{name}", doc, lbl, buckets=buckets, registry=r)

        self.running = gauge("num_requests_running", "Requests generating now")
        self.waiting = gauge("num_requests_waiting", "Requests queued for the engine")
        self.kv_usage = gauge("kv_cache_usage_perc", "Occupied KV cache fraction (1 = 100%)")
        self.kv_capacity = gauge("kv_cache_capacity_tokens", "KV cache capacity in tokens")
        self.busy_slots = gauge("n_busy_slots_per_decode", "Mean decode batch size")
        self.prompt_tokens = counter("prompt_tokens_total", "Prompt tokens (computed + reused)")
        self.cached_tokens = counter("prompt_tokens_cached_total", "Prompt tokens reused")
        self.prefix_queries = counter("prefix_cache_queries_total", "Prefix cache queries (tokens)")
        self.prefix_hits = counter("prefix_cache_hits_total", "Prefix cache hits (tokens)")
        self.generation_tokens = counter("generation_tokens_total", "Generated tokens")
        self.n_decode = counter("n_decode_total", "Decode batch executions")
        self.success = counter("request_success_total", "Finished requests", ("finished_reason",))
        self.failure = counter("request_failure_total", "Failed or rejected requests", ("reason",))
        self.ttft = hist("time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end latency", LATENCY_BUCKETS)
        self.queue_time = hist("request_queue_time_seconds", "Time queued", LATENCY_BUCKETS)
        self.prefill_time = hist("request_prefill_time_seconds", "Prefill time", LATENCY_BUCKETS)
        self.decode_time = hist("request_decode_time_seconds", "Decode time", LATENCY_BUCKETS)
        self.tpot = hist(
            "request_time_per_output_token_seconds", "decode_s / (completion - 1)", TPOT_BUCKETS
        )
        tb = token_buckets(max_context)
        self.req_prompt = hist("request_prompt_tokens", "Prompt tokens per request", tb)
        self.req_generation = hist("request_generation_tokens", "Generated tokens per request", tb)
        self.drafts = counter("spec_decode_num_drafts_total", "Speculative drafts")
        self.draft_tokens = counter("spec_decode_num_draft_tokens_total", "Drafted tokens")
        self.accepted = counter("spec_decode_num_accepted_tokens_total", "Accepted draft tokens")
        self.accepted_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                    "Accepted draft tokens at each draft position", ("position",))
        self._spec_seen: list[int] = [0, 0, 0]       # engine totals already counted
        self._pos_seen: list[int] = []
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
            self.busy_slots.labels(m).set(1.0)
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
        return generate_latest(self.registry)
