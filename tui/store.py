"""Conversation history in SQLite (stdlib sqlite3): list, load, save, delete.

One file, `history.sqlite3`, in the data directory the caller passes in; this module does
not decide where that is. All calls are short and synchronous, made from the UI thread.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from .conversation import Conversation, Message, tool_calls_from_json, tool_calls_to_json

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    tool_calls TEXT NOT NULL DEFAULT '',
    footer TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (conversation_id, seq)
);
"""


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    id: int
    title: str
    model: str
    updated: float


class HistoryStore:
    """A handle on the history database. Close it when the app exits."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "history.sqlite3"
        self._db = sqlite3.connect(self.path)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def list(self) -> list[ConversationSummary]:
        rows = self._db.execute(
            "SELECT id, title, model, updated FROM conversations ORDER BY updated DESC, id DESC"
        ).fetchall()
        return [ConversationSummary(int(r[0]), str(r[1]), str(r[2]), float(r[3])) for r in rows]

    def save(self, conv: Conversation, model: str = "") -> int:
        """Insert or rewrite `conv` (messages replaced wholesale); returns its id."""
        now = time.time()
        with self._db:
            if conv.id is None:
                cur = self._db.execute(
                    "INSERT INTO conversations (title, model, created, updated) VALUES (?,?,?,?)",
                    (conv.title, model, now, now),
                )
                assert cur.lastrowid is not None, "sqlite returned no row id"
                conv.id = int(cur.lastrowid)
            else:
                self._db.execute(
                    "UPDATE conversations SET title = ?, model = ?, updated = ? WHERE id = ?",
                    (conv.title, model, now, conv.id),
                )
                self._db.execute("DELETE FROM messages WHERE conversation_id = ?", (conv.id,))
            self._db.executemany(
                "INSERT INTO messages (conversation_id, seq, role, content, reasoning,"
                " tool_calls, footer) VALUES (?,?,?,?,?,?,?)",
                [
                    (
                        conv.id,
                        i,
                        m.role,
                        m.content,
                        m.reasoning,
                        tool_calls_to_json(m.tool_calls) if m.tool_calls else "",
                        m.footer,
                    )
                    for i, m in enumerate(conv.messages)
                ],
            )
        return conv.id

    def load(self, conv_id: int) -> Conversation | None:
        row = self._db.execute(
            "SELECT title FROM conversations WHERE id = ?", (conv_id,)
        ).fetchone()
        if row is None:
            return None
        rows = self._db.execute(
            "SELECT role, content, reasoning, tool_calls, footer FROM messages"
            " WHERE conversation_id = ? ORDER BY seq",
            (conv_id,),
        ).fetchall()
        messages = [
            Message(
                role="user" if r[0] == "user" else "assistant",
                content=str(r[1]),
                reasoning=str(r[2]),
                tool_calls=tool_calls_from_json(r[3]),
                footer=str(r[4]),
            )
            for r in rows
        ]
        return Conversation(id=conv_id, title=str(row[0]), messages=messages)

    def delete(self, conv_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))
