"""ResponseStore: a bounded, process-local LRU of finished Responses for chaining and GET/DELETE.

Each record keeps the response object as returned and the conversation (engine messages) that
led to it plus its own output, so `previous_response_id` can continue it. Knows no HTTP.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from .engine import Message


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[Message]          # prior turns + this request's input + its output


class ResponseStore:
    def __init__(self, max_records: int = 1024) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        self.max_records = max_records
        self._records: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def put(self, response_id: str, record: StoredResponse) -> None:
        self._records[response_id] = record
        self._records.move_to_end(response_id)
        while len(self._records) > self.max_records:
            self._records.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        record = self._records.get(response_id)
        if record is not None:
            self._records.move_to_end(response_id)
        return record

    def delete(self, response_id: str) -> bool:
        return self._records.pop(response_id, None) is not None
