"""Prefix cache shared by every conversation: content-addressed KV pages and GDN snapshots.

A tree of nodes, one per cached KV page: a node is addressed by its parent and the tokens its
page holds (a full page: 64 tokens; a tail node: fewer, always a leaf), so two prompts that
share their first n pages find the same n nodes. The cache holds one reference on each node's
page (engine/kv_pages.py PageAllocator), so a page stays valid after the request that wrote it
has gone; a request that reuses a prefix takes references on the chain's pages too, and writes
only positions past the prefix (a shared page it writes into is copied first: copy on write,
Generator.reserve).

Attention caches can be cut at any position, GDN state cannot: a node with a GDN snapshot (a
spare state slot holding the conv + recurrent state after the node's last token) is where a
hybrid model may resume. Snapshots are taken where the next request is likely to diverge or
continue: the last chat turn's start, page-aligned prefill chunk ends, the prompt's end (with
its logits: an identical prompt needs no model call at all) and a request's end (its prompt
and output, for the next turn of an agent that re-sends the history).

Eviction, least recently used first: leaves whose page only the cache holds, those that cannot
serve a hybrid model (no snapshot) before the rest; snapshot slots, interior ones (a deeper
snapshot exists on the same path) first. Knows nothing about requests or the scheduler.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..models.state import PAGE_SIZE
from .kv_pages import PageAllocator


@dataclass(eq=False)
class Node:
    """One cached page: `tokens` at positions start .. start + len(tokens) - 1, KV in `page`."""

    parent: Node | None
    tokens: tuple[int, ...]
    page: int                                    # -1 for the root
    start: int
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    tails: list[Node] = field(default_factory=list)   # the children of fewer than 64 tokens
    slot: int | None = None                      # GDN snapshot slot: the state after `end` tokens
    logits: np.ndarray | None = None             # the logits after `end` tokens (a prompt's end)
    last_used: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def chain(self) -> list[Node]:
        """The nodes from the first page down to this one."""
        out: list[Node] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


@dataclass
class Hit:
    """What a prompt can reuse: its first `length` tokens, whose KV lives in `pages` (in
    position order) and, on a hybrid model, whose GDN state is in `slot`; `logits` after them
    when they are the whole prompt."""

    length: int = 0
    pages: list[int] = field(default_factory=list)
    slot: int | None = None
    logits: np.ndarray | None = None
    node: Node | None = None


class PrefixCache:
    def __init__(self, allocator: PageAllocator, snapshot_slots: Sequence[int],
                 copy_slot: Callable[[int, int], None] | None, hybrid: bool) -> None:
        """snapshot_slots: the GDN state slots the cache may fill; copy_slot(dst, src) copies one
        slot's state; hybrid: the model has GDN layers (a prefix is usable only at a snapshot)."""
        self.allocator = allocator
        self.hybrid = hybrid
        self.copy_slot = copy_slot
        self.num_slots = len(snapshot_slots)
        self._free_slots = list(snapshot_slots)[::-1]
        self.root = Node(None, (), -1, 0)
        self._nodes: set[Node] = set()
        self._by_page: dict[int, Node] = {}
        self._tick = itertools.count(1)
        self.query_tokens = 0                    # vllm:prefix_cache_queries_total (tokens)
        self.hit_tokens = 0                      # vllm:prefix_cache_hits_total (tokens)

    # --- introspection ---------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return len(self._nodes)

    @property
    def num_snapshots(self) -> int:
        return self.num_slots - len(self._free_slots)

    # --- lookup ------------------------------------------------------------------------------
    def match(self, prompt: Sequence[int]) -> Hit:
        """The longest usable cached prefix of `prompt` (nothing is taken or counted)."""
        n = len(prompt)
        node: Node | None = self.root
        pos = 0
        path: list[Node] = []
        while node is not None:
            for tail in node.tails:                   # tail leaves that match here
                if tuple(prompt[pos : pos + len(tail.tokens)]) == tail.tokens:
                    path.append(tail)
            node = node.children.get(tuple(prompt[pos : pos + PAGE_SIZE])) if pos + PAGE_SIZE <= n else None
            if node is not None:
                path.append(node)
                pos += PAGE_SIZE
        best = Hit()
        for cand in path:
            whole = cand.end == n and cand.logits is not None
            if self.hybrid:
                if cand.slot is None or not (cand.end < n or whole):
                    continue
                length = cand.end
            else:
                length = cand.end if cand.end < n or whole else n - 1
            if length > best.length:
                best = Hit(length, [], cand.slot, cand.logits if length == n else None, cand)
        if best.node is not None:
            pages = [c.page for c in best.node.chain()]
            best.pages = pages[: -(-best.length // PAGE_SIZE)]
        return best

    def use(self, hit: Hit, prompt_tokens: int) -> None:
        """Count a lookup of `prompt_tokens` tokens that reused `hit` and mark its chain used."""
        self.query_tokens += prompt_tokens
        self.hit_tokens += hit.length
        if hit.node is not None:
            self._touch(hit.node)

    def _touch(self, node: Node) -> None:
        t = next(self._tick)
        for c in node.chain():
            c.last_used = t

    # --- insertion -----------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], pages: Sequence[int], running_slot: int | None,
               logits: np.ndarray | None = None) -> Node | None:
        """Cache the first len(tokens) positions of a sequence whose KV is in `pages` and whose
        GDN state is in `running_slot` now (None: no snapshot); `logits` after them if known.
        The cache takes a reference on each page it did not hold yet."""
        length = len(tokens)
        if length == 0:
            return None
        node, pos, i = self.root, 0, 0
        while pos < length:
            key = tuple(tokens[pos : min(pos + PAGE_SIZE, length)])
            child = node.children.get(key)
            if child is None:
                child = Node(node, key, int(pages[i]), pos)
                self.allocator.retain([child.page])
                node.children[key] = child
                if len(key) < PAGE_SIZE:
                    node.tails.append(child)
                self._nodes.add(child)
                self._by_page[child.page] = child
            node, pos, i = child, pos + len(key), i + 1
        self._touch(node)
        if logits is not None and node.logits is None:
            node.logits = logits
        if self.hybrid and running_slot is not None and node.slot is None and self.copy_slot is not None:
            slot = self._take_slot(node)
            if slot is not None:
                self.copy_slot(slot, running_slot)
                node.slot = slot
        return node

    def _take_slot(self, keep: Node) -> int | None:
        if not self._free_slots:
            held = [n for n in self._nodes if n.slot is not None and n is not keep]
            if not held:
                return None
            victim = min(held, key=lambda n: (not self._snapshot_below(n), n.last_used))
            self._drop_snapshot(victim)
        return self._free_slots.pop()

    @staticmethod
    def _snapshot_below(node: Node) -> bool:
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            if n.slot is not None:
                return True
            stack.extend(n.children.values())
        return False

    def _drop_snapshot(self, node: Node) -> None:
        if node.slot is not None:
            self._free_slots.append(node.slot)
            node.slot = None

    # --- eviction --------------------------------------------------------------------------------
    def _sole(self, node: Node) -> bool:
        return self.allocator.refcount(node.page) == 1

    def evictable(self, keep: Node | None = None) -> int:
        """Pages that evicting would free (held by the cache alone, their subtree too); the
        chain of `keep` is not counted."""
        kept = set(keep.chain()) if keep is not None else set()
        count = 0

        def free_subtree(node: Node) -> bool:
            nonlocal count
            ok = True
            for child in node.children.values():
                ok = free_subtree(child) and ok
            if node is self.root:
                return False
            if ok and node not in kept and self._sole(node):
                count += 1
                return True
            return False

        free_subtree(self.root)
        return count

    def evict(self, pages: int) -> int:
        """Free up to `pages` pages, least recently used leaves first; the count freed."""
        heap: list[tuple[bool, int, int, Node]] = []
        order = itertools.count()

        def push(node: Node) -> None:
            if node is not self.root and not node.children and self._sole(node):
                useless = self.hybrid and node.slot is None
                heapq.heappush(heap, (not useless, node.last_used, next(order), node))

        for node in self._nodes:
            push(node)
        freed = 0
        while heap and freed < pages:
            node = heapq.heappop(heap)[3]
            parent = node.parent
            self._remove(node)
            freed += 1
            if parent is not None:
                push(parent)
        return freed

    def unshare(self, page: int) -> bool:
        """Give up the leaf holding `page` (a request is about to write into it and the pool has
        no page to copy it to); False when no leaf of the cache holds it."""
        node = self._by_page.get(page)
        if node is None or node.children:
            return False
        self._remove(node)
        return True

    def _remove(self, node: Node) -> None:
        assert node.parent is not None and not node.children
        del node.parent.children[node.tokens]
        if len(node.tokens) < PAGE_SIZE:
            node.parent.tails.remove(node)
        self._nodes.discard(node)
        self._by_page.pop(node.page, None)
        self._drop_snapshot(node)
        node.logits = None
        self.allocator.release([node.page])

    def clear(self) -> None:
        """Drop every node and snapshot (pages a running request shares stay with it)."""
        for node in list(self._nodes):
            self._drop_snapshot(node)
            self.allocator.release([node.page])
        self._nodes.clear()
        self._by_page.clear()
        self.root.children.clear()
        self.root.tails.clear()
