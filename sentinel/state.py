"""Durable state in SQLite: tail offsets, the notification outbox, counters.

Everything that must survive a restart (or a ``kill -9``) of sentinel lives in
one database file in the state dir. Each write is one transaction, so a crash
leaves either the old value or the new one, never half of each. The store is
shared by threads; one lock serialises access to the single connection.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS offsets (
    dev INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    path TEXT NOT NULL,
    offset INTEGER NOT NULL,
    head_hash TEXT NOT NULL,
    tail_hash TEXT NOT NULL,
    PRIMARY KEY (dev, inode)
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class FileOffset:
    """How far a tailed file was read.

    ``offset`` is the end of the last complete line handed on. ``head_hash``
    fingerprints the file's first bytes, so a reused inode is not mistaken for
    the old file; ``tail_hash`` covers the bytes just before ``offset``, so a
    file truncated and regrown past the offset is noticed.
    """

    path: str
    dev: int
    inode: int
    offset: int
    head_hash: str
    tail_hash: str


class StateStore:
    """The state dir's SQLite database (``<state_dir>/state.db``)."""

    def __init__(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "state.db"
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic unit of work: committed on success, rolled back on error."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def executescript(self, script: str) -> None:
        """Create a plugin's own tables (idempotent ``CREATE ... IF NOT EXISTS``)."""
        with self._lock:
            self._conn.executescript(script)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- tail offsets -------------------------------------------------------

    def load_offset(self, dev: int, inode: int) -> FileOffset | None:
        with self.transaction() as conn:
            row = conn.execute(
                "SELECT path, dev, inode, offset, head_hash, tail_hash FROM offsets"
                " WHERE dev = ? AND inode = ?",
                (dev, inode),
            ).fetchone()
        return FileOffset(*row) if row else None

    def save_offset(self, record: FileOffset) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO offsets (dev, inode, path, offset, head_hash, tail_hash)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.dev,
                    record.inode,
                    record.path,
                    record.offset,
                    record.head_hash,
                    record.tail_hash,
                ),
            )

    # -- small counters (restart count, run id) -----------------------------

    def get(self, key: str) -> str | None:
        with self.transaction() as conn:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else None

    def put(self, key: str, value: str) -> None:
        self.put_many({key: value})

    def put_many(self, values: dict[str, str]) -> None:
        """Set several keys in one transaction: a reader sees all of them or none."""
        with self.transaction() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", list(values.items())
            )
