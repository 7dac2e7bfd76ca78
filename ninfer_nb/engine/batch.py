"""ForwardBatch: what one model call runs, as `Decoder.forward` reads it.

Built by the engine for each prefill chunk or decode round: the tokens of one or more sequences
laid end to end, their positions, and per sequence where its caches are (its GDN state slot;
its KV rows). Batches are uniform (contract-batching): B sequences of n tokens each; a prefill
chunk is one sequence, a decode round B sequences of one token. Without `page_table` the KV
cache is one contiguous buffer (a token's K / V row is its position, one sequence); with it,
sequence b's token at position p is in row page_table[b, p // 64] * 64 + p % 64 of the page
pool. A decode round names its GDN slots in `slots` (a [B] int32 backend array, so one captured
graph serves any set of requests; `slot_ids` then holds -1). Knows nothing about requests,
sampling or devices: the arrays are whatever the backend made.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ForwardBatch:
    token_ids: Any                        # [T] int, the backend's array (CUDA decode: the graph's input)
    positions: Any                        # [T] int, each token's position in its sequence
    query_start: tuple[int, ...]          # [B + 1] offsets of each sequence's tokens in token_ids
    slot_ids: tuple[int, ...]             # [B] the GDN state slot of each sequence
    # [B, pages] int32 KV page ids per sequence (paged KV); None: the one contiguous KV cache
    page_table: Any = None
    all_logits: bool = False              # logits at every token, else at each sequence's last
    slots: Any = None                     # [B] int32 GDN slots as a backend array (decode rounds)
    # [T] int32 backend array (with slots): GDN state after token t also into slot snapshots[t] (>= 0)
    snapshots: Any = None

    def __post_init__(self) -> None:
        if len(self.query_start) != len(self.slot_ids) + 1 or self.query_start[0] != 0:
            raise ValueError(f"query_start {self.query_start} does not fit {len(self.slot_ids)} sequences")

    @staticmethod
    def single(token_ids: Any, positions: Any, slot: int = 0, all_logits: bool = False,
               page_table: Any = None) -> "ForwardBatch":
        """One sequence's tokens [T] in GDN state slot `slot` (KV through page_table [1, P])."""
        return ForwardBatch(token_ids, positions, (0, int(token_ids.shape[0])), (slot,),
                            page_table=page_table, all_logits=all_logits)

    @staticmethod
    def rows(token_ids: Any, positions: Any, slots: Any, page_table: Any) -> "ForwardBatch":
        """A decode round: B sequences of one token each (token_ids, positions [B]), sequence b
        in GDN slot slots[b] and KV pages page_table[b] (backend arrays); logits at every row."""
        b = int(token_ids.shape[0])
        return ForwardBatch(token_ids, positions, tuple(range(b + 1)), (-1,) * b,
                            page_table=page_table, all_logits=True, slots=slots)

    @property
    def num_tokens(self) -> int:
        return self.query_start[-1]

    @property
    def num_seqs(self) -> int:
        return len(self.slot_ids)

    def only_slot(self) -> int:
        """The GDN slot of a one-sequence batch named on the host (a prefill chunk)."""
        if self.num_seqs != 1 or self.slot_ids[0] < 0:
            raise NotImplementedError(f"a batch of {self.num_seqs} sequences (the ops run one at a time)")
        return self.slot_ids[0]
