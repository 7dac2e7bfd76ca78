"""ServerConfig: everything the server was told at start-up, frozen.

One field per `ninfer-serve` flag (see server/cli.py). Knows nothing about aiohttp or the engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from ninfer_nb.params import SamplingParams


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Server-wide sampling defaults; request fields override them (serving-api.md §13)."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0
    presence_penalty: float = 1.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
        )


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model: str | None = None              # checkpoint dir / .gguf; None = default model
    model_id: str | None = None           # served name; None = the engine's model_id
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    device: str = "auto"
    max_context: int = 4096
    prefill_chunk: int = 1024
    kv_cache: str = "auto"              # auto (bf16 on CUDA, fp32 on the CPU) | fp32 | bf16 | int8
    default_max_tokens: int = 8192
    max_pending: int = 16
    max_concurrency: int | None = None    # requests generating at once; None: the engine's default
    spec: str = "off"                     # speculative decoding: off | ngram | mtp
    draft_tokens: int | str = 3           # draft tokens per verify round (spec != off): K, auto, auto:K
    prefix_cache: bool = True             # prefixes shared across requests (paged lanes)
    host_cache_mib: int = 0               # host memory for the prefix cache's evicted pages
    kv_cache_fraction: float = 0.9        # of the device memory after the weights: the KV page pool
    max_request_bytes: int = 32 * 1024 * 1024   # ~8x a 1M-token prompt's JSON; 413 beyond
    cors: bool = False
    enable_thinking: bool = True
    request_log: str | None = None
    keepalive_s: float = 5.0              # SSE comment interval while a request waits
    response_store_max: int = 1024        # stored Responses (LRU)
    shutdown_timeout_s: float = 30.0      # running requests get this long on SIGINT/SIGTERM
    warmup: bool = True
    sampling: SamplingDefaults = SamplingDefaults()
