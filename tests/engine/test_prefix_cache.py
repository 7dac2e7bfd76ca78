"""The prefix cache shared by every conversation (engine/prefix_cache.py) on the CPU backend.

Hit and miss give the same greedy and seeded sampled tokens; a conversation re-sending its
history with one new message prefills only the new part after two other conversations ran in
between (counted by the engine's prefill token counter); n requests with one prompt prefill it
once; a long prompt delays another client's first token by at most one prefill chunk; the
cache's own bookkeeping (content addressing, snapshots only where a hybrid can resume, LRU
eviction, copy on write, clear) on a bare page pool.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from ninfer_nb import LLM, SamplingParams
from ninfer_nb.config import EngineConfig
from ninfer_nb.engine.kv_pages import PageAllocator, PageTable
from ninfer_nb.engine.prefix_cache import PrefixCache
from ninfer_nb.engine.request import Request, RequestOutput

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.9, top_k=50, seed=7, ignore_eos=True)


def make_llm(path: Path, concurrency: int = 2, chunk: int = 64, max_context: int = 512, **kw: object) -> LLM:
    return LLM(config=EngineConfig(str(path), device="cpu", max_context=max_context, prefill_chunk=chunk,
                                   show_progress=False, max_concurrency=concurrency, **kw))   # type: ignore[arg-type]


def prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 5000, n)]


def run_all(llm: LLM, reqs: list[Request]) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for req in reqs:
        llm.engine.add_request(req)
    while llm.engine.has_unfinished_requests():
        for out in llm.engine.step():
            outs.setdefault(out.request_id, []).append(out)
    return outs


@pytest.fixture(scope="module", params=["tiny_qwen35_dir", "tiny_llama_dir"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


def test_history_plus_one_message_prefills_only_the_new_part(model_dir: Path) -> None:
    """Two lanes: conversation A (300 tokens), then B and C (150 each), then A again with its
    answer and 10 new tokens: only those (and A's last answer token, never fed) are prefilled,
    and greedy / seeded sampled tokens equal those of an engine without the cache."""
    llm = make_llm(model_dir)
    engine = llm.engine
    assert engine.prefix_cache is not None
    history = prompt(1, 300)
    answer = llm.generate(history, GREEDY).token_ids
    for seed in (2, 3):
        llm.generate(prompt(seed, 150), GREEDY)
    for i, params in enumerate((GREEDY, SAMPLED)):
        new = prompt(4 + i, 10)
        followup = history + answer + new
        before = engine.prefill_tokens
        hit = llm.generate(followup, params)
        assert engine.prefill_tokens - before == len(new) + 1
        assert hit.timings.cached_tokens == len(history) + len(answer) - 1
        cold = make_llm(model_dir, prefix_cache=False)
        miss = cold.generate(followup, params)
        assert cold.engine.prefill_tokens == len(followup)
        assert hit.token_ids == miss.token_ids
    stats = llm.stats()
    assert 0 < stats["prefix_cache_hits"] < stats["prefix_cache_queries"]
    # pages only the cache holds count as free for the KV usage (as vLLM's cached free blocks)
    assert stats["prefix_cache_pages"] > 0 and stats["kv_cache_used_bytes"] == 0


class _Oracle:
    """Drafts the plain continuation of `prompt` with every third token wrong (rounds accept
    all, some and none of their drafts; random tiny models seldom repeat, so n-gram lookup
    alone would seldom draft)."""

    def __init__(self, prompt: list[int], plain: list[int]) -> None:
        self.prompt, self.plain = prompt, plain

    def propose(self, tokens: list[int], k: int) -> list[int]:
        if tokens[: len(self.prompt)] != self.prompt:
            return []
        n = len(tokens) - len(self.prompt)
        return [t + 1 if (n + i) % 3 == 0 else t for i, t in enumerate(self.plain[n : n + k])]


def test_hit_and_miss_agree_while_speculating(tiny_qwen35_dir: Path) -> None:
    """Speculation on paged lanes (verify and rollback next to shared pages): a follow-up
    served by the cache gives the tokens of an engine without the cache or drafts."""
    ids, params = prompt(8, 120), GREEDY.replace(max_tokens=12)
    llm = make_llm(tiny_qwen35_dir, chunk=32, spec="ngram", draft_tokens=3)
    answer = llm.generate(ids, params).token_ids
    followup = ids + answer + prompt(9, 20)
    want = make_llm(tiny_qwen35_dir, chunk=32, prefix_cache=False).generate(followup, params).token_ids
    llm.engine.proposer = _Oracle(followup, want)
    before = llm.engine.prefill_tokens
    assert llm.generate(followup, params).token_ids == want
    assert llm.engine.prefill_tokens - before == 21
    stats = llm.engine.spec_stats
    assert 0 < stats.accepted < stats.drafted


def test_n_requests_of_one_prompt_prefill_it_once(tiny_qwen35_dir: Path) -> None:
    """Three requests with one 130-token prompt added together: the others wait for the first
    one's prefill and take its prompt-end snapshot; greedy tokens all equal, sampled seeds
    differ as they would alone."""
    llm = make_llm(tiny_qwen35_dir, concurrency=4, chunk=32)
    ids = prompt(5, 130)
    reqs = [Request(f"g{i}", ids, GREEDY) for i in range(3)]
    outs = run_all(llm, reqs)
    assert llm.engine.prefill_tokens == len(ids)
    first = [t for o in outs["g0"] for t in o.new_token_ids]
    for rid in ("g1", "g2"):
        assert [t for o in outs[rid] for t in o.new_token_ids] == first
    assert [r.num_cached_tokens for r in reqs] == [0, len(ids), len(ids)]


def test_a_long_prompt_delays_another_first_token_by_one_chunk(tiny_qwen35_dir: Path) -> None:
    """Chunks of 16: a 150-token prompt (10 chunks) arrives first, a 10-token one a step later;
    the short one's first token comes within two steps of its arrival (one chunk of the long
    prompt at most), while the long one is still prefilling."""
    llm = make_llm(tiny_qwen35_dir, concurrency=2, chunk=16, max_context=256)
    engine = llm.engine
    long, short = Request("long", prompt(6, 150), GREEDY), Request("short", prompt(7, 10), GREEDY)
    engine.add_request(long)
    engine.step()
    engine.add_request(short)
    steps = 0
    while not short.output_ids:
        engine.step()
        steps += 1
    assert steps <= 2
    assert not long.output_ids and engine.prefill_tokens <= 16 * 3 + 10
    while engine.has_unfinished_requests():
        engine.step()
    assert len(long.output_ids) == GREEDY.max_tokens


# --- the cache on a bare page pool ---------------------------------------------------------------
def test_pages_are_content_addressed_and_evicted_least_recently_used_first() -> None:
    pool = PageAllocator(8)
    copies: list[tuple[int, int]] = []
    cache = PrefixCache(pool, snapshot_slots=[10, 11], copy_slot=lambda d, s: copies.append((d, s)), hybrid=True)
    a, b = prompt(1, 150), prompt(2, 70)
    ta = PageTable(pool, 4)
    assert ta.grow(150)
    cache.insert(a[:128], ta.pages, running_slot=0)           # two full pages, a snapshot at 128
    cache.insert(a, ta.pages, running_slot=0, logits=np.ones(3, np.float32))   # a tail of 22
    ta.release()
    assert cache.num_pages == 3 and pool.num_free == 5 and copies == [(10, 0), (11, 0)]
    hit = cache.match(a + [1, 2])
    assert hit.length == 150 and hit.pages == [0, 1, 2] and hit.logits is None
    whole = cache.match(a)
    assert whole.length == 150 and whole.logits is not None
    assert cache.match(a[:140]).length == 128                 # the tail does not match: the snapshot at 128
    assert cache.match(a[:128]).length == 0                   # a hybrid resumes before its last token only
    assert cache.match(b).length == 0
    # a third snapshot takes the slot of the interior one (a deeper snapshot exists below it)
    tb = PageTable(pool, 4)
    assert tb.grow(70)
    cache.insert(b, tb.pages, running_slot=1)
    assert cache.match(a[:140]).length == 0 and cache.match(a + [1]).length == 150
    tb.release()
    cache.use(cache.match(b + [3]), 71)                       # b is the most recently used
    assert cache.evictable() == 5
    assert cache.evict(1) == 1 and cache.match(a + [1]).length == 0    # a's tail went first
    assert cache.match(b + [3]).length == 70
    cache.clear()
    assert pool.num_free == 8 and cache.num_snapshots == 0


def test_a_shared_page_is_copied_before_it_is_written() -> None:
    pool = PageAllocator(4)
    cache = PrefixCache(pool, snapshot_slots=[], copy_slot=None, hybrid=False)
    ids = prompt(3, 100)
    t = PageTable(pool, 4)
    assert t.grow(100)
    cache.insert(ids, t.pages, running_slot=None)
    t.release()
    assert cache.match(ids).length == 99                      # an attention-only model cuts anywhere
    hit = cache.match(ids + [7])
    assert hit.length == 100 and hit.pages == [0, 1]
    user = PageTable(pool, 4)
    user.adopt(hit.pages)
    assert user.shared(1) and pool.refcount(1) == 2
    copied: list[tuple[int, int]] = []
    assert user.copy_on_write(1, lambda d, s: copied.append((d, s)))
    assert copied == [(2, 1)] and user.pages == [0, 2] and pool.refcount(1) == 1
    assert cache.unshare(1) and pool.num_free == 2            # the leaf let go: page 1 is free
    user.release()
    cache.clear()
    assert pool.num_free == 4


def test_bench_prefix_reports_the_second_request(tiny_llama_dir: Path) -> None:
    from ninfer_nb.bench_prefix import run_prefix_bench

    llm = make_llm(tiny_llama_dir, kv_pages=40)
    out = run_prefix_bench(llm, 300, new_tokens=10, gen=4)
    first, second = out["rows"][0], out["rows"][-1]
    assert [r["request"] for r in out["rows"]] == ["A first", "other 1", "other 2", "A second"]
    assert first["prefill_tokens"] == first["prompt_tokens"] == 300 - 10 - 8
    assert second["prefill_tokens"] == 11 and second["cached_tokens"] == second["prompt_tokens"] - 11
    assert out["ttft_ratio"] > 0


@pytest.mark.parametrize("kv", ["fp32", "bf16", "int8"])
def test_pool_sizing_counts_the_bytes_the_state_allocates(kv: str) -> None:
    """LLM._kv_pool_pages sizes the pool from these per-token / per-slot byte counts."""
    from ninfer_nb.engine.backend import CpuBackend
    from ninfer_nb.models.presets import preset_config
    from ninfer_nb.models.state import PAGE_SIZE, gdn_bytes_per_slot, kv_bytes_per_token, new_state

    cfg = preset_config("tiny-qwen3.5")
    state = new_state(cfg, 128, CpuBackend().zeros, kv, gdn_slots=3, num_pages=5)   # type: ignore[arg-type]
    assert state.kv_bytes() == 5 * PAGE_SIZE * kv_bytes_per_token(cfg, kv)          # type: ignore[arg-type]
    assert state.gdn_slot_bytes() == gdn_bytes_per_slot(cfg)


@pytest.mark.parametrize("host_mib", [0, 64])
def test_evicted_pages_come_back_from_the_host_tier(model_dir: Path, host_mib: int) -> None:
    """A 12-page pool: conversations B and C evict A's pages. With a host tier they (and A's
    snapshots) move to host memory and come back for A's follow-up, which then prefills only
    its new part and gives a cold engine's tokens; without one A is recomputed."""
    llm = make_llm(model_dir, kv_pages=12, host_cache_mib=host_mib)
    cache = llm.engine.prefix_cache
    assert cache is not None
    history = prompt(11, 300)
    answer = llm.generate(history, GREEDY).token_ids
    for seed in (12, 13):
        llm.generate(prompt(seed, 300), GREEDY)
    if host_mib:
        assert cache.num_host_pages > 0 and cache.host is not None and 0 < cache.host.used <= 64 << 20
    followup = history + answer + prompt(14, 10)
    before = llm.engine.prefill_tokens
    hit = llm.generate(followup, GREEDY)
    computed = llm.engine.prefill_tokens - before
    assert computed == 11 if host_mib else computed > 100
    cold = make_llm(model_dir, prefix_cache=False)
    assert hit.token_ids == cold.generate(followup, GREEDY).token_ids
    llm.engine.forget()
    assert llm.engine.scheduler.allocator is not None and llm.engine.scheduler.allocator.num_free == 12


def test_random_shared_prefixes_under_a_tiny_pool_with_a_host_tier(tiny_qwen35_dir: Path) -> None:
    """Three lanes over 6 pages and a host tier: prompts that share two long histories (and
    each other's answers) arrive at random steps, some are cancelled; preemption, eviction to
    the host, loads back and copies on write all happen. Every finished request has its solo
    tokens (a cancelled one a prefix of them); at the end every device page is free or held
    by the cache alone, and a clear frees them all."""
    from tests.engine.test_scheduler import drive, tokens

    rng = np.random.default_rng(4)
    alone = make_llm(tiny_qwen35_dir, concurrency=1, chunk=32, max_context=256)
    llm = make_llm(tiny_qwen35_dir, concurrency=3, chunk=32, max_context=256, kv_pages=6, host_cache_mib=16)
    bases = [prompt(30, 140), prompt(31, 100)]
    arrivals: dict[int, list[Request]] = {}
    cancels: dict[int, list[str]] = {}
    want = {}
    for i in range(12):
        base = bases[(i // 2) % 2]
        ids = base[: int(rng.integers(60, len(base) + 1))] + prompt(40 + i, int(rng.integers(1, 12)))
        params = GREEDY.replace(max_tokens=int(rng.integers(4, 48)))
        if i % 3 == 2:
            params = SamplingParams(max_tokens=params.max_tokens, temperature=0.9, seed=i, ignore_eos=True)
        alone.engine.forget()
        want[f"r{i}"] = alone.generate(ids, params).token_ids
        step = 6 * i + int(rng.integers(0, 10))
        arrivals.setdefault(step, []).append(Request(f"r{i}", ids, params))
        if i % 5 == 4:
            cancels.setdefault(step + int(rng.integers(2, 20)), []).append(f"r{i}")
    outs = drive(llm.engine, arrivals, cancels)
    for rid, got_outs in outs.items():
        got = tokens(got_outs)
        if got_outs[-1].finish_reason == "cancelled":
            assert got == want[rid][: len(got)], rid
        else:
            assert got == want[rid], rid
    engine, cache = llm.engine, llm.engine.prefix_cache
    assert cache is not None and cache.host is not None and cache.hit_tokens > 0
    assert engine.scheduler.preemptions > 0 and cache.pages_to_host > 0 and cache.pages_from_host > 0
    assert engine.scheduler.allocator is not None
    assert engine.scheduler.allocator.num_free + cache.num_pages == 6
    engine.forget()
    assert engine.scheduler.allocator.num_free == 6 and cache.host.used == 0


def test_the_pool_takes_its_share_of_the_device_budget(tiny_qwen35_dir: Path) -> None:
    """LLM._kv_pool_pages on a backend that reports a memory budget (CUDA's arena left after
    the weights): kv_cache_fraction of it, less the GDN slots, in pages; at least one context;
    kv_pages or one lane leave it alone."""
    from ninfer_nb.engine.kv_pages import pages_for
    from ninfer_nb.models.state import PAGE_SIZE, gdn_bytes_per_slot, kv_bytes_per_token

    llm = make_llm(tiny_qwen35_dir, concurrency=4)
    cfg, mc = llm.engine_config, llm.model_config
    page = PAGE_SIZE * kv_bytes_per_token(mc, "fp32")
    slots = (2 * 4 + 2 * 4 + 4) * gdn_bytes_per_slot(mc)
    budget = 1000 * page + slots
    llm.backend.cache_budget = lambda: budget           # type: ignore[method-assign]
    assert llm._kv_pool_pages(cfg) == (int(budget * 0.9) - slots) // page
    assert llm._kv_pool_pages(dataclasses.replace(cfg, kv_cache_fraction=0.5)) == (int(budget * 0.5) - slots) // page
    llm.backend.cache_budget = lambda: 10                # type: ignore[method-assign]
    assert llm._kv_pool_pages(cfg) == pages_for(llm.max_context)
    assert llm._kv_pool_pages(dataclasses.replace(cfg, kv_pages=7)) == 7
    llm.max_concurrency = 1
    assert llm._kv_pool_pages(cfg) is None
