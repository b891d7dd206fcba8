"""The durable outbox: messages owed to each target, as notices, in the state DB.

One row is one message to one target: the notices it carries (rendered only
when sent, for that target's kind), the job they are about, the notices the
rate limit folded into it, and an idempotency key made when the row is, so it
stays the same across retries and restarts. A notice joins its target's newest
message that is still open (never taken for sending, within ``group_wait_s``
of its creation, not full); otherwise it starts a message of its own, unless
the target has had ``rate_limit`` messages in the last ``rate_window_s``: then
it goes into the target's pending digest. Each of these decisions, with the
write it makes, is one SQLite transaction, so a ``kill -9`` loses nothing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sentinel import secrets
from sentinel.actions.notices import Envelope, JobInfo, Notice, NoticeKind
from sentinel.records import Severity
from sentinel.state import StateStore

# A new table: rows of the older text-only ``notify_outbox`` are not read.
_SCHEMA = """
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

#: Delivered messages older than this are pruned at start (the rate limit looks back less).
KEEP_DELIVERED_S = 7 * 86400.0

_OPEN_ROW = "delivered_at IS NULL AND sealed_at IS NULL AND attempts = 0"


class Added(StrEnum):
    """What became of a notice handed to the outbox for one target."""

    JOINED = "joined"  # into an open message
    NEW = "new"  # started a message
    FOLDED = "folded"  # into the rate limit's digest
    CANCELLED = "cancelled"  # a reopen met its own pending resolve: neither goes


@dataclass(frozen=True)
class Batching:
    """How notices become messages: grouping, size, and the rate limit per target."""

    group_wait_s: float = 0.0
    rate_limit: int = 20
    rate_window_s: float = 3600.0
    #: Notices one message holds; the next one starts a message of its own.
    max_notices: int = 10
    #: Notices a digest keeps in full (the most severe); the rest are counted by rule.
    digest_notices: int = 3


@dataclass(frozen=True)
class Target:
    """An apprise URL and the name it is shown by (its ``name``, or the URL masked)."""

    url: str
    name: str


@dataclass(frozen=True)
class Delivery:
    """One message taken for sending to one target."""

    id: int
    target: str
    name: str
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


def target_hash(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


class Outbox:
    """Durable queue of messages, one row per (target, message), in the state DB.

    ``targets`` are apprise URLs (shown by a name set later, see ``add_targets``)
    or ``Target``s; rows of targets not configured are kept but neither sent nor counted.
    """

    def __init__(self, store: StateStore, targets: Iterable[str | Target] = ()) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._targets: dict[str, Target] = {}
        #: Set whenever a row is added; the delivery worker waits on it.
        self.changed = threading.Event()
        store.executescript(_SCHEMA)
        self.add_targets(t if isinstance(t, Target) else Target(t, "") for t in targets)
        self._prune()

    def add_targets(self, targets: Iterable[Target]) -> None:
        """Configure targets (again); a non-empty name replaces the one known."""
        targets = list(targets)  # a generator may read this outbox: not under the lock
        with self._lock:
            for target in targets:
                hashed = target_hash(target.url)
                known = self._targets.get(hashed)
                if known is None or target.name:
                    self._targets[hashed] = target

    @property
    def store(self) -> StateStore:
        return self._store

    @property
    def targets(self) -> list[str]:
        with self._lock:
            return [target.url for target in self._targets.values()]

    def name(self, url: str) -> str:
        with self._lock:
            return self._targets[target_hash(url)].name

    def _configured(self) -> tuple[str, tuple[str, ...]]:
        with self._lock:
            hashes = tuple(self._targets)
        return ", ".join("?" * len(hashes)) or "NULL", hashes

    # -- adding -----------------------------------------------------------------

    def add(
        self, notice: Notice, job: JobInfo, urls: Sequence[str], now: float, batching: Batching
    ) -> dict[str, Added]:
        """Hand ``notice`` to each target of ``urls`` in one transaction; what became of it.

        What is stored is masked: a job may print a token into the line an alert quotes.
        """
        notice = Notice.from_json(secrets.mask_data(notice.to_json()))
        outcome: dict[str, Added] = {}
        with self._store.transaction() as conn:
            for url in urls:
                outcome[url] = self._add_one(conn, notice, job, url, now, batching)
        self.changed.set()
        return outcome

    def _add_one(
        self,
        conn: sqlite3.Connection,
        notice: Notice,
        job: JobInfo,
        url: str,
        now: float,
        batching: Batching,
    ) -> Added:
        hashed = target_hash(url)
        rows = [
            _Open(row_id, json.loads(notices), json.loads(folded), bool(digest), group_until)
            for row_id, notices, folded, digest, group_until in conn.execute(
                f"SELECT id, notices, folded, digest, group_until FROM notify_messages"
                f" WHERE target_hash = ? AND {_OPEN_ROW} ORDER BY id DESC",
                (hashed,),
            )
        ]
        grouping = [row for row in rows if not row.digest and now < row.group_until]
        if notice.kind is NoticeKind.OPENED:
            for row in grouping:
                if row.cancel_resolve(conn, notice.rule):
                    return Added.CANCELLED
        # Only the newest message may be joined: notices stay in the order they came.
        if grouping and grouping[0] is rows[0] and len(rows[0].notices) < batching.max_notices:
            rows[0].notices.append(notice.to_json())
            rows[0].save(conn)
            return Added.JOINED
        for row in rows:
            if row.digest:
                row.fold(notice, batching.digest_notices)
                row.save(conn)
                return Added.FOLDED
        limited_until = self._limited_until(conn, hashed, now, batching)
        if limited_until is not None:
            self._insert(conn, url, job, notice, now, now, limited_until, digest=True)
            return Added.FOLDED
        due = now + batching.group_wait_s
        self._insert(conn, url, job, notice, now, due, due, digest=False)
        return Added.NEW

    @staticmethod
    def _limited_until(
        conn: sqlite3.Connection, hashed: str, now: float, batching: Batching
    ) -> float | None:
        """When the target may have its next message, if the rate limit holds it now."""
        window_s = batching.rate_window_s
        recent = conn.execute(
            "SELECT due_at FROM notify_messages WHERE target_hash = ? AND due_at > ?"
            " ORDER BY due_at DESC LIMIT ?",
            (hashed, now - window_s, batching.rate_limit),
        ).fetchall()
        if len(recent) < batching.rate_limit:
            return None
        # The window holds ``rate_limit`` messages until the oldest of them leaves it.
        return max(now, float(recent[-1][0]) + window_s)

    def _insert(
        self,
        conn: sqlite3.Connection,
        url: str,
        job: JobInfo,
        notice: Notice,
        now: float,
        group_until: float,
        due: float,
        *,
        digest: bool,
    ) -> None:
        hashed = target_hash(url)
        key = f"{notice.incident_id}:{'digest' if digest else notice.kind}:{uuid.uuid4().hex[:8]}"
        with self._lock:
            name = self._targets[hashed].name if hashed in self._targets else ""
        conn.execute(
            "INSERT INTO notify_messages (key, target_hash, target_name, digest, job, notices,"
            " created_at, group_until, due_at, next_attempt_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, hashed, name, int(digest), json.dumps(job.to_json()),
             json.dumps([notice.to_json()]), now, group_until, due, due),
        )  # fmt: skip

    # -- delivering -------------------------------------------------------------

    def due(self, now: float, limit: int = 50) -> list[Delivery]:
        """Take the undelivered messages due by ``now``: from here on nothing joins them."""
        marks, hashes = self._configured()
        with self._store.transaction() as conn:
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
        with self._lock:
            targets = dict(self._targets)
        return [
            Delivery(
                row_id,
                targets[hashed].url,
                targets[hashed].name,
                _envelope(key, job, notices, folded),
                attempts,
            )
            for row_id, hashed, key, job, notices, folded, attempts in rows
        ]

    def next_due_at(self) -> float | None:
        """When the earliest undelivered message becomes due, or None if nothing is pending."""
        earliest = self._pending("MIN(next_attempt_at)")
        return None if earliest is None else float(earliest)

    def release_groups(self, now: float) -> int:
        """Make messages that only wait for their group to fill due now (on stop); how many."""
        marks, hashes = self._configured()
        with self._store.transaction() as conn:
            cursor = conn.execute(
                f"UPDATE notify_messages SET next_attempt_at = ?, group_until = ?"
                f" WHERE {_OPEN_ROW} AND digest = 0 AND next_attempt_at > ?"
                f" AND target_hash IN ({marks})",
                (now, now, now, *hashes),
            )
            return max(cursor.rowcount, 0)

    def mark_delivered(self, delivery: Delivery, now: float) -> None:
        """The message reached its target: it is never sent again."""
        with self._store.transaction() as conn:
            conn.execute(
                "UPDATE notify_messages SET delivered_at = ?, attempts = attempts + 1,"
                " last_error = NULL WHERE id = ?",
                (now, delivery.id),
            )

    def mark_failed(self, delivery: Delivery, error: str, next_attempt_at: float) -> None:
        """Count a failed attempt; ``error`` must already be masked."""
        with self._store.transaction() as conn:
            conn.execute(
                "UPDATE notify_messages SET attempts = attempts + 1, last_error = ?,"
                " next_attempt_at = ? WHERE id = ?",
                (error, next_attempt_at, delivery.id),
            )

    # -- reading ----------------------------------------------------------------

    def pending_count(self) -> int:
        """Undelivered messages for the configured targets."""
        return int(self._pending("COUNT(*)"))

    def messages(self, url: str | None = None) -> list[Message]:
        """Every stored message (of one target's URL, if given), oldest first."""
        with self._store.transaction() as conn:
            return read_messages(conn, None if url is None else target_hash(url))

    def _pending(self, aggregate: str) -> Any:
        marks, hashes = self._configured()
        with self._store.transaction() as conn:
            row = conn.execute(
                f"SELECT {aggregate} FROM notify_messages"
                f" WHERE delivered_at IS NULL AND target_hash IN ({marks})",
                hashes,
            ).fetchone()
        return row[0]

    def _prune(self) -> None:
        with self._store.transaction() as conn:
            conn.execute(
                "DELETE FROM notify_messages WHERE delivered_at IS NOT NULL AND due_at < "
                "(SELECT MAX(due_at) FROM notify_messages) - ?",
                (KEEP_DELIVERED_S,),
            )


@dataclass
class _Open:
    """A message still open to notices, as read inside the adding transaction."""

    id: int
    notices: list[dict[str, Any]]
    folded: dict[str, int]
    digest: bool
    group_until: float

    def save(self, conn: sqlite3.Connection) -> None:
        if not self.notices and not self.folded:
            conn.execute("DELETE FROM notify_messages WHERE id = ?", (self.id,))
            return
        conn.execute(
            "UPDATE notify_messages SET notices = ?, folded = ? WHERE id = ?",
            (json.dumps(self.notices), json.dumps(self.folded), self.id),
        )

    def cancel_resolve(self, conn: sqlite3.Connection, rule: str) -> bool:
        """Drop this message's newest resolve of ``rule``, if any (a reopen met it)."""
        for index in range(len(self.notices) - 1, -1, -1):
            held = self.notices[index]
            if held["kind"] == NoticeKind.RESOLVED and held["rule"] == rule:
                del self.notices[index]
                self.save(conn)
                return True
        return False

    def fold(self, notice: Notice, keep: int) -> None:
        """Add ``notice`` to this digest: kept whole if among the ``keep`` worst, else counted."""
        self.notices.append(notice.to_json())
        while len(self.notices) > keep:
            # The least severe, newest first: the earliest of the worst stay readable.
            ranks = [Severity(item["severity"]).rank for item in self.notices]
            lowest = min(ranks)
            index = max(i for i, rank in enumerate(ranks) if rank == lowest)
            rule = self.notices.pop(index)["rule"]
            self.folded[rule] = self.folded.get(rule, 0) + 1


def _envelope(key: str, job: str, notices: str, folded: str) -> Envelope:
    return Envelope(
        key=key,
        job=JobInfo.from_json(json.loads(job)),
        notices=tuple(Notice.from_json(item) for item in json.loads(notices)),
        folded=dict(json.loads(folded)),
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
