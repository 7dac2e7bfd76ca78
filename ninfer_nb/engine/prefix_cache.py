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
snapshot exists on the same path) first. With a host tier (`HostTier`, --host-cache-mib) an
evicted page and its snapshot move to host memory instead, the node stays in the tree, and a
prompt that reaches it copies them back (least recently used host copies are dropped when the
tier is full). Knows nothing about requests or the scheduler.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..models.state import PAGE_SIZE, KVCache, SequenceState
from .backends.base import Backend
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
    host: list[np.ndarray] | None = None         # the page's rows in host memory (page -1: not on the device)
    host_state: list[np.ndarray] | None = None   # a GDN snapshot in host memory

    @property
    def resident(self) -> bool:
        return self.page >= 0

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
    pages: list[int] = field(default_factory=list)   # -1: in the host tier (`PrefixCache.load`)
    slot: int | None = None
    logits: np.ndarray | None = None
    node: Node | None = None
    host_state: list[np.ndarray] | None = None       # the snapshot, when it is in the host tier

    @property
    def missing(self) -> int:
        """Pages to bring back from the host tier."""
        return sum(1 for p in self.pages if p < 0)


class HostTier:
    """Host memory for evicted pages and snapshots: copies of a page's rows in every attention
    layer, of a slot's conv + recurrent state in every GDN layer; at most `capacity` bytes."""

    def __init__(self, state: SequenceState, backend: Backend, capacity: int) -> None:
        self.backend, self.capacity, self.used = backend, capacity, 0
        self._kv = [buf for layer in state.layers if isinstance(layer, KVCache)
                    for buf in (layer.k, layer.v, layer.k_scale, layer.v_scale) if buf is not None]
        self._gdn = [buf for layer in state.gdn_layers() for buf in (layer.conv, layer.recurrent)]

    def save_page(self, page: int) -> list[np.ndarray]:
        r = page * PAGE_SIZE
        return [np.array(self.backend.to_host(buf[r : r + PAGE_SIZE])) for buf in self._kv]

    def load_page(self, page: int, rows: list[np.ndarray]) -> None:
        r = page * PAGE_SIZE
        for buf, host in zip(self._kv, rows):
            self.backend.load_(buf[r : r + PAGE_SIZE], host)

    def save_slot(self, slot: int) -> list[np.ndarray]:
        return [np.array(self.backend.to_host(buf[slot])) for buf in self._gdn]

    def load_slot(self, slot: int, state: list[np.ndarray]) -> None:
        for buf, host in zip(self._gdn, state):
            self.backend.load_(buf[slot], host)

    @staticmethod
    def nbytes(arrays: list[np.ndarray] | None) -> int:
        return sum(int(a.nbytes) for a in arrays) if arrays else 0


class PrefixCache:
    def __init__(self, allocator: PageAllocator, snapshot_slots: Sequence[int],
                 copy_slot: Callable[[int, int], None] | None, hybrid: bool,
                 host: HostTier | None = None) -> None:
        """snapshot_slots: the GDN state slots the cache may fill; copy_slot(dst, src) copies one
        slot's state; hybrid: the model has GDN layers (a prefix is usable only at a snapshot);
        host: where evicted pages and snapshots go (None: they are dropped)."""
        self.allocator = allocator
        self.host = host
        self.hybrid = hybrid
        self.copy_slot = copy_slot
        self.num_slots = len(snapshot_slots)
        self._free_slots = list(snapshot_slots)[::-1]
        self.root = Node(None, (), -1, 0)
        self._nodes: set[Node] = set()
        self._by_page: dict[int, Node] = {}
        self._pinned: set[Node] = set()          # nodes an eviction must keep (a hit being loaded)
        self._tick = itertools.count(1)
        self.query_tokens = 0                    # vllm:prefix_cache_queries_total (tokens)
        self.hit_tokens = 0                      # vllm:prefix_cache_hits_total (tokens)
        self.pages_to_host = 0                   # pages moved to the host tier / back (totals)
        self.pages_from_host = 0

    # --- introspection ---------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        """Device pages the cache holds."""
        return len(self._by_page)

    def sole_pages(self) -> int:
        """Device pages only the cache holds (free for any request: evicted when needed)."""
        return sum(1 for node in self._by_page.values() if self._sole(node))

    @property
    def num_host_pages(self) -> int:
        return len(self._nodes) - len(self._by_page)

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
                if (cand.slot is None and cand.host_state is None) or not (cand.end < n or whole):
                    continue
                length = cand.end
            else:
                length = cand.end if cand.end < n or whole else n - 1
            if length > best.length:
                best = Hit(length, [], cand.slot, cand.logits if length == n else None, cand,
                           cand.host_state if cand.slot is None else None)
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

    def load(self, hit: Hit) -> None:
        """Bring the pages of `hit` that are in the host tier back to the device (the caller
        made room: `hit.missing` free pages)."""
        if hit.node is None or not hit.missing:
            return
        chain = hit.node.chain()
        for i, node in enumerate(chain[: len(hit.pages)]):
            if node.resident:
                continue
            assert self.host is not None and node.host is not None
            fresh = self.allocator.allocate(1)
            if fresh is None:
                raise RuntimeError("prefix cache: no free page to load a cached page into")
            node.page = fresh[0]
            self.host.load_page(node.page, node.host)
            self.host.used -= HostTier.nbytes(node.host)
            node.host = None
            self._by_page[node.page] = node
            hit.pages[i] = node.page
            self.pages_from_host += 1

    def restore(self, hit: Hit, running_slot: int) -> None:
        """The GDN state of `hit` into `running_slot` (from its snapshot slot or the host tier)."""
        if hit.slot is not None and self.copy_slot is not None:
            self.copy_slot(running_slot, hit.slot)
        elif hit.host_state is not None and self.host is not None:
            self.host.load_slot(running_slot, hit.host_state)
        else:
            raise ValueError("restore: the hit has no GDN snapshot")

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
            elif not child.resident:                  # in the host tier: the sequence's page replaces it
                child.page = int(pages[i])
                self.allocator.retain([child.page])
                self._by_page[child.page] = child
                if self.host is not None:
                    self.host.used -= HostTier.nbytes(child.host)
                child.host = None
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
            interior: set[Node] = set()              # a deeper snapshot exists below these
            for n in held:
                up = n.parent
                while up is not None and up not in interior:
                    if up.slot is not None:
                        interior.add(up)
                    up = up.parent
            victim = min(held, key=lambda n: (n not in interior, n.last_used))
            self._drop_snapshot(victim)
        return self._free_slots.pop()

    def _drop_snapshot(self, node: Node, keep_host: bool = True) -> None:
        """Free the node's snapshot slot; with a host tier the state goes there first."""
        if node.slot is None:
            return
        if keep_host and self.host is not None and node.host_state is None:
            saved = self.host.save_slot(node.slot)
            if self._host_room(HostTier.nbytes(saved), keep=node):
                node.host_state = saved
                self.host.used += HostTier.nbytes(saved)
        self._free_slots.append(node.slot)
        node.slot = None

    # --- eviction --------------------------------------------------------------------------------
    def _sole(self, node: Node) -> bool:
        return node.resident and self.allocator.refcount(node.page) == 1

    def evictable(self, keep: Node | None = None) -> int:
        """Pages that evicting would free (held by the cache alone, their subtree too); the
        chain of `keep` is not counted."""
        kept = set(keep.chain()) if keep is not None else set()
        order: list[Node] = []                       # parents before children (iterative: deep trees)
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        freeable: set[Node] = set()
        for node in reversed(order):                 # children before parents
            if (node.resident and node not in kept and self._sole(node)
                    and all(c in freeable or (not c.resident and self.host is not None)
                            for c in node.children.values())):
                freeable.add(node)
        return len(freeable)

    def evict(self, pages: int, keep: Node | None = None) -> int:
        """Free up to `pages` device pages, least recently used leaves first (with a host tier:
        nodes whose children are all there; they move there too); the count freed. The chain
        of `keep` stays."""
        kept = set(keep.chain()) if keep is not None else set()
        self._pinned = kept
        heap: list[tuple[bool, int, int, Node]] = []
        order = itertools.count()

        def push(node: Node) -> None:
            if node is self.root or node in kept or not self._sole(node):
                return
            if any(c.resident or self.host is None for c in node.children.values()):
                return
            useless = self.hybrid and node.slot is None and node.host_state is None
            heapq.heappush(heap, (not useless, node.last_used, next(order), node))

        for node in self._nodes:
            push(node)
        freed = 0
        try:
            while heap and freed < pages:
                node = heapq.heappop(heap)[3]
                parent = node.parent
                if not self._offload(node):
                    self._remove_subtree(node)
                freed += 1
                if parent is not None:
                    push(parent)
        finally:
            self._pinned = set()
        return freed

    def _host_room(self, nbytes: int, keep: Node) -> bool:
        """Make room for `nbytes` in the host tier by dropping its least recently used leaves
        (not `keep`); False when it cannot hold them."""
        assert self.host is not None
        if nbytes > self.host.capacity:
            return False
        while self.host.used + nbytes > self.host.capacity:
            leaves = [n for n in self._nodes if not n.resident and not n.children and n is not keep
                      and n not in self._pinned]
            if leaves:
                self._remove(min(leaves, key=lambda n: n.last_used))
                continue
            states = [n for n in self._nodes if n.host_state is not None and n is not keep
                      and n not in self._pinned]
            if not states:
                return False
            victim = min(states, key=lambda n: n.last_used)
            self.host.used -= HostTier.nbytes(victim.host_state)
            victim.host_state = None
        return True

    def _offload(self, node: Node) -> bool:
        """Move a node's page (and snapshot) to the host tier; False without room there."""
        if self.host is None:
            return False
        rows = self.host.save_page(node.page)
        if not self._host_room(HostTier.nbytes(rows), keep=node):
            return False
        self.host.used += HostTier.nbytes(rows)
        node.host = rows
        self._drop_snapshot(node)
        self._by_page.pop(node.page, None)
        self.allocator.release([node.page])
        node.page = -1
        self.pages_to_host += 1
        return True

    def _remove_subtree(self, node: Node) -> None:
        stack, order = [node], []
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        for n in reversed(order):
            self._remove(n)

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
        self._drop_snapshot(node, keep_host=False)
        node.logits = None
        if self.host is not None:
            self.host.used -= HostTier.nbytes(node.host) + HostTier.nbytes(node.host_state)
        node.host = node.host_state = None
        if node.resident:
            self._by_page.pop(node.page, None)
            self.allocator.release([node.page])

    def clear(self) -> None:
        """Drop every node and snapshot (pages a running request shares stay with it)."""
        for node in list(self._nodes):
            self._drop_snapshot(node, keep_host=False)
            if node.resident:
                self.allocator.release([node.page])
        if self.host is not None:
            self.host.used = 0
        self._nodes.clear()
        self._by_page.clear()
        self.root.children.clear()
        self.root.tails.clear()
