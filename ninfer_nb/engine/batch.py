"""ForwardBatch: what one model call runs, as `Decoder.forward` reads it.

Built by the engine for each prefill chunk or decode step: the tokens of one or more sequences
laid end to end, their positions, and per sequence where its caches are (its GDN state slot;
its KV rows). Today a batch holds one sequence and the KV cache is one contiguous buffer (a
token's K / V row is its position); the fields a scheduler needs (several sequences, KV page
tables) are here so the model's signature does not change when it comes. Knows nothing about
requests, sampling or devices: the arrays are whatever the backend made.
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
    # [B, pages] KV page ids per sequence (paged KV); None: the one contiguous KV cache
    page_table: Any = None
    all_logits: bool = False              # logits at every token, else at each sequence's last

    def __post_init__(self) -> None:
        if len(self.query_start) != len(self.slot_ids) + 1 or self.query_start[0] != 0:
            raise ValueError(f"query_start {self.query_start} does not fit {len(self.slot_ids)} sequences")

    @staticmethod
    def single(token_ids: Any, positions: Any, slot: int = 0, all_logits: bool = False) -> "ForwardBatch":
        """One sequence's tokens [T] in GDN state slot `slot`."""
        return ForwardBatch(token_ids, positions, (0, int(token_ids.shape[0])), (slot,),
                            all_logits=all_logits)

    @property
    def num_tokens(self) -> int:
        return self.query_start[-1]

    @property
    def num_seqs(self) -> int:
        return len(self.slot_ids)

    def only_slot(self) -> int:
        """The GDN slot of a one-sequence batch (the kernels take one sequence per call today)."""
        if self.num_seqs != 1:
            raise NotImplementedError(f"a batch of {self.num_seqs} sequences (the ops run one at a time)")
        return self.slot_ids[0]
