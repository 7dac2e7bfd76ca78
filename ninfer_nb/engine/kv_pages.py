"""KV pages: the allocator of the attention caches' page pool and one sequence's page table.

Every attention layer's cache is one pool of `num_pages * PAGE_SIZE` rows (models/state.py);
a page is the same 64-row block in every layer. `PageAllocator` hands pages out from a free list
and counts references, so a page several sequences share (a prefix cache) is freed when the
last one lets it go. `PageTable` is one sequence's pages in order: the token at position p lives
at row table[p // 64] * 64 + p % 64; `row` is that table as the fixed-width int32 row the ops
read ([P], P = pages at the engine's maximum context; unused entries 0, never read because a
query reads keys up to its own position only). Knows nothing about tokens, requests or devices.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..models.state import PAGE_SIZE


def pages_for(tokens: int) -> int:
    """Pages that hold `tokens` tokens."""
    return -(-max(tokens, 0) // PAGE_SIZE)


class PageAllocator:
    """A free list over pages 0 .. num_pages - 1 with reference counts."""

    def __init__(self, num_pages: int) -> None:
        if num_pages < 1:
            raise ValueError(f"a KV page pool needs at least one page, got {num_pages}")
        self.num_pages = num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))    # pop() hands out page 0 first
        self._refs = np.zeros(num_pages, dtype=np.int32)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of the pool in use (vllm:kv_cache_usage_perc)."""
        return self.num_used / self.num_pages

    def allocate(self, n: int) -> list[int] | None:
        """n fresh pages (reference count 1), or None when fewer are free (nothing taken)."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        self._refs[pages] = 1
        return pages

    def retain(self, pages: list[int]) -> None:
        """One more holder of each page (a sequence sharing a cached prefix)."""
        for p in pages:
            if self._refs[p] < 1:
                raise ValueError(f"page {p} is free; only a held page can be shared")
            self._refs[p] += 1

    def release(self, pages: list[int]) -> None:
        """One holder fewer of each page; a page nobody holds goes back to the free list."""
        for p in pages:
            if self._refs[p] < 1:
                raise ValueError(f"page {p} released more often than it was held")
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    def refcount(self, page: int) -> int:
        return int(self._refs[page])


class PageTable:
    """One sequence's pages, in position order, and their ids as the ops' table row."""

    def __init__(self, allocator: PageAllocator, max_pages: int) -> None:
        self.allocator = allocator
        self.pages: list[int] = []
        self.row = np.zeros(max_pages, dtype=np.int32)     # [P] page ids; the ops read row[p // 64]

    @property
    def capacity(self) -> int:
        """Tokens the held pages can store."""
        return len(self.pages) * PAGE_SIZE

    def missing(self, tokens: int) -> int:
        """Pages still needed to hold `tokens` tokens."""
        return max(0, pages_for(tokens) - len(self.pages))

    def grow(self, tokens: int) -> bool:
        """Hold pages for `tokens` tokens; False (nothing taken) when the pool lacks them."""
        n = self.missing(tokens)
        if n == 0:
            return True
        if pages_for(tokens) > self.row.shape[0]:
            raise ValueError(f"{tokens} tokens exceed the table's {self.row.shape[0]} pages")
        fresh = self.allocator.allocate(n)
        if fresh is None:
            return False
        self.row[len(self.pages) : len(self.pages) + n] = fresh
        self.pages += fresh
        return True

    def adopt(self, pages: list[int]) -> None:
        """Start from `pages` another holder has (a cached prefix): one more reference on each."""
        if self.pages:
            raise ValueError("adopt: the table already holds pages")
        if len(pages) > self.row.shape[0]:
            raise ValueError(f"{len(pages)} pages exceed the table's {self.row.shape[0]}")
        self.allocator.retain(pages)
        self.pages = list(pages)
        self.row[: len(pages)] = pages

    def shared(self, index: int) -> bool:
        """Page `index` of the table has another holder (writing it needs a copy first)."""
        return index < len(self.pages) and self.allocator.refcount(self.pages[index]) > 1

    def copy_on_write(self, index: int, copy: Callable[[int, int], None]) -> bool:
        """Replace the shared page `index` by a fresh copy (copy(dst, src) copies a page's
        rows); False (nothing changed) when the pool has no free page."""
        fresh = self.allocator.allocate(1)
        if fresh is None:
            return False
        old = self.pages[index]
        copy(fresh[0], old)
        self.allocator.release([old])
        self.pages[index] = fresh[0]
        self.row[index] = fresh[0]
        return True

    def truncate(self, tokens: int) -> None:
        """Keep only the pages the first `tokens` tokens need (the rest of the cache is cut)."""
        keep = pages_for(tokens)
        if keep < len(self.pages):
            self.allocator.release(self.pages[keep:])
            self.row[keep : len(self.pages)] = 0
            del self.pages[keep:]

    def release(self) -> None:
        """Give every page back (the sequence's cache is gone)."""
        self.allocator.release(self.pages)
        self.pages = []
        self.row[:] = 0
