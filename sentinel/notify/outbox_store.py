"""The outbox's table in the state DB: its schema and every query on it, nothing else.

One row is one message to one target: the notices it carries (as JSON, rendered
only when sent), the job they are about, the notices the rate limit folded into
it, an idempotency key, and its delivery state. Every function takes the
connection of a transaction its caller holds (``StateStore.transaction``); which
row a notice goes into is decided in ``outbox.py``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sentinel.notify.notices import Envelope, JobInfo, Notice

# A new table: rows of the older text-only ``notify_outbox`` are not read.
SCHEMA = """
CREATE TABLE IF NOT EXISTS notify_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    target_hash TEXT NOT NULL,
    target_name TEXT NOT NULL,
    digest INTEGER NOT NULL DEFAULT 0,
    job TEXT NOT NULL,
    notices TEXT NOT NULL,
    folded TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    group_until REAL NOT NULL,
    due_at REAL NOT NULL,
    sealed_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    delivered_at REAL,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS notify_messages_due
    ON notify_messages (delivered_at, next_attempt_at);
CREATE INDEX IF NOT EXISTS notify_messages_target
    ON notify_messages (target_hash, due_at);
"""

#: A row still open to notices: never taken for sending.
_OPEN_ROW = "delivered_at IS NULL AND sealed_at IS NULL AND attempts = 0"


@dataclass
class OpenMessage:
    """A message still open to notices, as read inside the adding transaction."""

    id: int
    #: The notices it carries, as JSON objects (``Notice.to_json``).
    notices: list[dict[str, Any]]
    #: Notices a digest counts rather than carries, by rule.
    folded: dict[str, int]
    digest: bool
    group_until: float


@dataclass(frozen=True)
class DueRow:
    """A message taken for sending, as stored."""

    id: int
    target_hash: str
    envelope: Envelope
    attempts: int


@dataclass(frozen=True)
class Message:
    """One outbox row as stored, for inspection."""

    id: int
    name: str
    envelope: Envelope
    digest: bool
    created_at: float
    due_at: float
    attempts: int
    next_attempt_at: float
    delivered_at: float | None
    last_error: str | None


def open_messages(conn: sqlite3.Connection, hashed: str) -> list[OpenMessage]:
    """A target's messages still open to notices, newest first."""
    return [
        OpenMessage(row_id, json.loads(notices), json.loads(folded), bool(digest), group_until)
        for row_id, notices, folded, digest, group_until in conn.execute(
            f"SELECT id, notices, folded, digest, group_until FROM notify_messages"
            f" WHERE target_hash = ? AND {_OPEN_ROW} ORDER BY id DESC",
            (hashed,),
        )
    ]


def save_open(conn: sqlite3.Connection, message: OpenMessage) -> None:
    """Store an open message's notices; one left with none (and none folded) is deleted."""
    if not message.notices and not message.folded:
        conn.execute("DELETE FROM notify_messages WHERE id = ?", (message.id,))
        return
    conn.execute(
        "UPDATE notify_messages SET notices = ?, folded = ? WHERE id = ?",
        (json.dumps(message.notices), json.dumps(message.folded), message.id),
    )


def recent_due_times(
    conn: sqlite3.Connection, hashed: str, since: float, limit: int
) -> list[float]:
    """When a target's messages due after ``since`` were due, newest first, at most ``limit``."""
    rows = conn.execute(
        "SELECT due_at FROM notify_messages WHERE target_hash = ? AND due_at > ?"
        " ORDER BY due_at DESC LIMIT ?",
        (hashed, since, limit),
    ).fetchall()
    return [float(row[0]) for row in rows]


def insert(
    conn: sqlite3.Connection,
    *,
    key: str,
    hashed: str,
    name: str,
    job: JobInfo,
    notice: Notice,
    created_at: float,
    group_until: float,
    due_at: float,
    digest: bool,
) -> None:
    """A new message of one notice."""
    conn.execute(
        "INSERT INTO notify_messages (key, target_hash, target_name, digest, job, notices,"
        " created_at, group_until, due_at, next_attempt_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (key, hashed, name, int(digest), json.dumps(job.to_json()),
         json.dumps([notice.to_json()]), created_at, group_until, due_at, due_at),
    )  # fmt: skip


def take_due(
    conn: sqlite3.Connection, hashes: Sequence[str], now: float, limit: int
) -> list[DueRow]:
    """The undelivered messages of these targets due by ``now``, sealed: none joins them."""
    marks = _marks(hashes)
    rows = conn.execute(
        "SELECT id, target_hash, key, job, notices, folded, attempts FROM notify_messages"
        f" WHERE delivered_at IS NULL AND target_hash IN ({marks})"
        " AND next_attempt_at <= ? ORDER BY next_attempt_at, id LIMIT ?",
        (*hashes, now, limit),
    ).fetchall()
    conn.executemany(
        "UPDATE notify_messages SET sealed_at = ? WHERE id = ? AND sealed_at IS NULL",
        [(now, row[0]) for row in rows],
    )
    return [
        DueRow(row_id, hashed, _envelope(key, job, notices, folded), attempts)
        for row_id, hashed, key, job, notices, folded, attempts in rows
    ]


def release_groups(conn: sqlite3.Connection, hashes: Sequence[str], now: float) -> int:
    """Make open messages that only wait for their group due now; how many."""
    cursor = conn.execute(
        f"UPDATE notify_messages SET next_attempt_at = ?, group_until = ?"
        f" WHERE {_OPEN_ROW} AND digest = 0 AND next_attempt_at > ?"
        f" AND target_hash IN ({_marks(hashes)})",
        (now, now, now, *hashes),
    )
    return max(cursor.rowcount, 0)


def mark_delivered(conn: sqlite3.Connection, row_id: int, now: float) -> None:
    conn.execute(
        "UPDATE notify_messages SET delivered_at = ?, attempts = attempts + 1,"
        " last_error = NULL WHERE id = ?",
        (now, row_id),
    )


def mark_failed(conn: sqlite3.Connection, row_id: int, error: str, next_attempt_at: float) -> None:
    conn.execute(
        "UPDATE notify_messages SET attempts = attempts + 1, last_error = ?,"
        " next_attempt_at = ? WHERE id = ?",
        (error, next_attempt_at, row_id),
    )


def pending(conn: sqlite3.Connection, hashes: Sequence[str], aggregate: str) -> Any:
    """``aggregate`` (``COUNT(*)``, ``MIN(next_attempt_at)``) over these targets'
    undelivered messages."""
    row = conn.execute(
        f"SELECT {aggregate} FROM notify_messages"
        f" WHERE delivered_at IS NULL AND target_hash IN ({_marks(hashes)})",
        tuple(hashes),
    ).fetchone()
    return row[0]


def prune(conn: sqlite3.Connection, keep_delivered_s: float) -> None:
    """Delete delivered messages due over ``keep_delivered_s`` before the newest."""
    conn.execute(
        "DELETE FROM notify_messages WHERE delivered_at IS NOT NULL AND due_at < "
        "(SELECT MAX(due_at) FROM notify_messages) - ?",
        (keep_delivered_s,),
    )


def read_messages(conn: sqlite3.Connection, hashed: str | None = None) -> list[Message]:
    """Stored messages (of one target hash, if given), oldest first."""
    where, args = ("WHERE target_hash = ?", (hashed,)) if hashed is not None else ("", ())
    rows = conn.execute(
        "SELECT id, target_name, key, job, notices, folded, digest, created_at, due_at,"
        f" attempts, next_attempt_at, delivered_at, last_error FROM notify_messages {where}"
        " ORDER BY id",
        args,
    ).fetchall()
    return [
        Message(
            id=row[0],
            name=row[1],
            envelope=_envelope(row[2], row[3], row[4], row[5]),
            digest=bool(row[6]),
            created_at=row[7],
            due_at=row[8],
            attempts=row[9],
            next_attempt_at=row[10],
            delivered_at=row[11],
            last_error=row[12],
        )
        for row in rows
    ]


def read_pending(conn: sqlite3.Connection) -> dict[str, int]:
    """Undelivered messages by target name, whether or not the target is configured now."""
    rows = conn.execute(
        "SELECT target_name, COUNT(*) FROM notify_messages WHERE delivered_at IS NULL"
        " GROUP BY target_name ORDER BY target_name"
    ).fetchall()
    return {str(name): int(count) for name, count in rows}


def _marks(hashes: Sequence[str]) -> str:
    """The ``IN (...)`` placeholders for ``hashes`` (``NULL``, matching nothing, for none)."""
    return ", ".join("?" * len(hashes)) or "NULL"


def _envelope(key: str, job: str, notices: str, folded: str) -> Envelope:
    return Envelope(
        key=key,
        job=JobInfo.from_json(json.loads(job)),
        notices=tuple(Notice.from_json(item) for item in json.loads(notices)),
        folded=dict(json.loads(folded)),
    )
