"""The durable outbox: messages owed to each target, as notices, in the state DB.

One row is one message to one target (``outbox_store``): the notices it carries,
the job they are about, the notices the rate limit folded into it, and an
idempotency key made when the row is, so it stays the same across retries and
restarts. A notice joins its target's newest message that is still open (never
taken for sending, within ``group_wait_s`` of its creation, not full); otherwise
it starts a message of its own, unless the target has had ``rate_limit`` messages
in the last ``rate_window_s``: then it goes into the target's pending digest.
Those decisions are the pure functions ``place`` and ``limited_until``; each, with
the write it makes, is one SQLite transaction, so a ``kill -9`` loses nothing.

When the state dir refuses writes (full, read-only), a notice is not dropped: it
goes to a spill, the same table in memory, and is delivered from there at once
(it would not survive a ``kill -9`` of sentinel: said once in the log). What was
stored before waits in the state DB until the disk takes writes again.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sentinel.model import secrets
from sentinel.model.records import Severity
from sentinel.notify import outbox_store
from sentinel.notify.notices import Envelope, JobInfo, Notice, NoticeKind
from sentinel.notify.outbox_store import Message, OpenMessage
from sentinel.store.state import StateStore

log = logging.getLogger(__name__)

#: What a state DB that refuses writes raises (full, read-only, I/O error).
REFUSED = (OSError, sqlite3.OperationalError)

#: Delivered messages older than this are pruned at start (the rate limit looks back less).
KEEP_DELIVERED_S = 7 * 86400.0


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
    #: Taken from the spill in memory, not from the state DB.
    spilled: bool = False


def target_hash(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


# -- the policy: pure functions over a target's open messages ----------------------------------


def place(
    notice: Notice, open_messages: list[OpenMessage], now: float, batching: Batching
) -> tuple[Added, OpenMessage] | None:
    """Where ``notice`` goes among its target's open messages (newest first): the message
    it changed and how, or None when it needs a message of its own (``limited_until``
    says which kind). The changed message is changed in place."""
    grouping = [row for row in open_messages if not row.digest and now < row.group_until]
    if notice.kind is NoticeKind.OPENED:
        for row in grouping:
            if cancel_resolve(row, notice.rule):
                return Added.CANCELLED, row
    # Only the newest message may be joined: notices stay in the order they came.
    newest = open_messages[0] if open_messages else None
    if grouping and grouping[0] is newest and len(grouping[0].notices) < batching.max_notices:
        grouping[0].notices.append(notice.to_json())
        return Added.JOINED, grouping[0]
    for row in open_messages:
        if row.digest:
            fold(row, notice, batching.digest_notices)
            return Added.FOLDED, row
    return None


def limited_until(recent_due: list[float], now: float, batching: Batching) -> float | None:
    """When the target may have its next message, if the rate limit holds it now.

    ``recent_due``: when its messages of the last ``rate_window_s`` were due, newest
    first, at most ``rate_limit`` of them.
    """
    if len(recent_due) < batching.rate_limit:
        return None
    # The window holds ``rate_limit`` messages until the oldest of them leaves it.
    return max(now, recent_due[-1] + batching.rate_window_s)


def cancel_resolve(message: OpenMessage, rule: str) -> bool:
    """Drop the message's newest resolve of ``rule``, if any (a reopen met it)."""
    for index in range(len(message.notices) - 1, -1, -1):
        held = message.notices[index]
        if held["kind"] == NoticeKind.RESOLVED and held["rule"] == rule:
            del message.notices[index]
            return True
    return False


def fold(digest: OpenMessage, notice: Notice, keep: int) -> None:
    """Add ``notice`` to a digest: kept whole if among the ``keep`` worst, else counted."""
    digest.notices.append(notice.to_json())
    while len(digest.notices) > keep:
        # The least severe, newest first: the earliest of the worst stay readable.
        ranks = [Severity(item["severity"]).rank for item in digest.notices]
        lowest = min(ranks)
        index = max(i for i, rank in enumerate(ranks) if rank == lowest)
        rule = digest.notices.pop(index)["rule"]
        digest.folded[rule] = digest.folded.get(rule, 0) + 1


def message_key(notice: Notice, job: JobInfo, kind: str, hashed: str = "") -> str:
    """A new message's idempotency key, kept across retries and restarts.

    Where a run's sentinels share a run id (one per node), the news of an incident
    (opened, escalated) gets the same key on every node, from the run id, rule and
    step, so a paging service folds the nodes' pages into one. Else unique.
    """
    if job.shared_run_id and kind in (NoticeKind.OPENED, NoticeKind.ESCALATED):
        step = notice.alert.get("step")
        return f"{job.shared_run_id}:{notice.rule}:{step}:{kind}:{hashed[:8]}"
    return f"{notice.incident_id}:{kind}:{uuid.uuid4().hex[:8]}"


class Outbox:
    """Durable queue of messages, one row per (target, message), in the state DB.

    ``targets`` are apprise URLs (shown by a name set later, see ``add_targets``)
    or ``Target``s; rows of targets not configured are kept but neither sent nor counted.
    """

    def __init__(self, store: StateStore, targets: Iterable[str | Target] = ()) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._targets: dict[str, Target] = {}
        #: Told the URLs of the targets that got a message or were configured (``on_change``).
        self._listeners: list[Callable[[Sequence[str]], None]] = []
        #: Where notices go while the state DB refuses writes (``REFUSED``); made then.
        self._spill: StateStore | None = None
        self._refused: str | None = None
        #: Replaced after each write this outbox makes: ``depth`` counts again only then.
        self._written = object()
        #: The last count ``depth`` made, and the write it was made after.
        self._depth: tuple[object, int] | None = None
        store.executescript(outbox_store.SCHEMA)
        self.add_targets(t if isinstance(t, Target) else Target(t, "") for t in targets)
        with self._store.transaction() as conn:
            outbox_store.prune(conn, KEEP_DELIVERED_S)

    def add_targets(self, targets: Iterable[Target]) -> None:
        """Configure targets (again); a non-empty name replaces the one known."""
        targets = list(targets)  # a generator may read this outbox: not under the lock
        with self._lock:
            for target in targets:
                hashed = target_hash(target.url)
                known = self._targets.get(hashed)
                if known is None or target.name:
                    self._targets[hashed] = target
        self._written = object()  # which targets count changed
        self._changed([target.url for target in targets])

    def on_change(self, listener: Callable[[Sequence[str]], None]) -> None:
        """Call ``listener`` with the URLs of the targets that got a message (after it is
        stored) or were configured; on the caller's thread, so it must not block."""
        self._listeners.append(listener)

    def _changed(self, urls: Sequence[str]) -> None:
        for listener in list(self._listeners):
            listener(urls)

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

    def _configured(self, url: str | None = None) -> tuple[str, ...]:
        """The hashes of the configured targets (of ``url`` alone, if given and configured)."""
        with self._lock:
            if url is None:
                return tuple(self._targets)
            hashed = target_hash(url)
            return (hashed,) if hashed in self._targets else ()

    # -- adding -----------------------------------------------------------------

    def add(
        self, notice: Notice, job: JobInfo, urls: Sequence[str], now: float, batching: Batching
    ) -> dict[str, Added]:
        """Hand ``notice`` to each target of ``urls`` in one transaction; what became of it.

        What is stored is masked: a job may print a token into the line an alert quotes.
        """
        notice = Notice.from_json(secrets.mask_data(notice.to_json()))
        outcome: dict[str, Added] = {}
        try:
            with self._store.transaction() as conn:
                for url in urls:
                    outcome[url] = self._add_one(conn, notice, job, url, now, batching)
        except REFUSED as error:
            self._refusing(error)
            outcome.clear()
            with self._spilled().transaction() as conn:
                for url in urls:
                    outcome[url] = self._add_one(conn, notice, job, url, now, batching)
        else:
            self._accepting()
        self._written = object()
        self._changed(list(urls))
        return outcome

    @property
    def refused(self) -> str | None:
        """Why the state DB refused the last notice (it went to the spill); None when not."""
        return self._refused

    def _spilled(self) -> StateStore:
        if self._spill is None:
            self._spill = StateStore.in_memory()
            self._spill.executescript(outbox_store.SCHEMA)
        return self._spill

    def _refusing(self, error: Exception) -> None:
        if self._refused is None:
            log.error(
                "the outbox cannot be written in the state dir (%s): notices are held in memory"
                " and sent from there, and are lost if sentinel dies before they are",
                error,
            )
        self._refused = str(error)

    def _accepting(self) -> None:
        if self._refused is not None:
            log.info("the outbox takes notices in the state dir again")
            self._refused = None

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
        placed = place(notice, outbox_store.open_messages(conn, hashed), now, batching)
        if placed is not None:
            added, changed = placed
            outbox_store.save_open(conn, changed)
            return added
        recent = outbox_store.recent_due_times(
            conn, hashed, now - batching.rate_window_s, batching.rate_limit
        )
        held_until = limited_until(recent, now, batching)
        digest = held_until is not None
        if held_until is not None:
            # The digest takes notices until the rate limit lets it go.
            group_until, due = now, held_until
        else:
            group_until = due = now + batching.group_wait_s
        kind = "digest" if digest else notice.kind
        with self._lock:
            name = self._targets[hashed].name if hashed in self._targets else ""
        fields: dict[str, Any] = dict(hashed=hashed, name=name, job=job, notice=notice)
        fields.update(created_at=now, group_until=group_until, due_at=due, digest=digest)
        try:
            outbox_store.insert(conn, key=message_key(notice, job, kind, hashed), **fields)
        except sqlite3.IntegrityError:  # this node sent that news already: a key of its own
            outbox_store.insert(conn, key=message_key(notice, JobInfo("", "", ""), kind), **fields)
        return Added.FOLDED if digest else Added.NEW

    # -- delivering -------------------------------------------------------------

    def due(self, now: float, limit: int = 50, target: str | None = None) -> list[Delivery]:
        """Take the undelivered messages due by ``now`` (of the ``target`` URL only, if
        given): from here on nothing joins them."""
        hashes = self._configured(target)
        taken: list[tuple[outbox_store.DueRow, bool]] = []
        if self._spill is not None:
            with self._spill.transaction() as conn:
                taken += [(row, True) for row in outbox_store.take_due(conn, hashes, now, limit)]
        try:
            with self._store.transaction() as conn:
                rows = outbox_store.take_due(conn, hashes, now, limit - len(taken))
        except REFUSED:
            if not taken:
                raise  # nothing to send from memory: the caller retries the state DB later
            rows = []
        taken += [(row, False) for row in rows]
        with self._lock:
            targets = dict(self._targets)
        return [
            Delivery(
                row.id,
                targets[row.target_hash].url,
                targets[row.target_hash].name,
                row.envelope,
                row.attempts,
                spilled,
            )
            for row, spilled in taken
        ]

    def next_due_at(self, target: str | None = None) -> float | None:
        """When the earliest undelivered message (of the ``target`` URL only, if given)
        becomes due, or None if nothing is pending."""
        earliest = self._pending("MIN(next_attempt_at)", target)
        return None if earliest is None else float(earliest)

    def release_groups(self, now: float) -> int:
        """Make messages that only wait for their group to fill due now (on stop); how many."""
        hashes = self._configured()
        with self._store.transaction() as conn:
            released = outbox_store.release_groups(conn, hashes, now)
        self._written = object()
        return released

    def mark_delivered(self, delivery: Delivery, now: float) -> None:
        """The message reached its target: it is never sent again."""
        with self._holding(delivery).transaction() as conn:
            outbox_store.mark_delivered(conn, delivery.id, now)
        self._written = object()

    def mark_failed(self, delivery: Delivery, error: str, next_attempt_at: float) -> None:
        """Count a failed attempt; ``error`` must already be masked."""
        with self._holding(delivery).transaction() as conn:
            outbox_store.mark_failed(conn, delivery.id, error, next_attempt_at)
        self._written = object()

    def _holding(self, delivery: Delivery) -> StateStore:
        return self._spilled() if delivery.spilled else self._store

    # -- reading ----------------------------------------------------------------

    def pending_count(self, target: str | None = None) -> int:
        """Undelivered messages for the configured targets (or the ``target`` URL only)."""
        return int(self._pending("COUNT(*)", target))

    def depth(self) -> int:
        """``pending_count()``, counted again only after a write of this outbox (the state
        dir is its alone): the figure each clock tick reports. Counting costs two queries,
        a millisecond or two of a turn on a VM, for a number that changes only when a
        notice is added or sent."""
        written = self._written  # before the count: a write during it counts again next time
        depth = self._depth
        if depth is None or depth[0] is not written:
            depth = self._depth = (written, self.pending_count())
        return depth[1]

    def messages(self, url: str | None = None) -> list[Message]:
        """Every stored message (of one target's URL, if given), oldest first."""
        with self._store.reading() as conn:
            return outbox_store.read_messages(conn, None if url is None else target_hash(url))

    def _pending(self, aggregate: str, target: str | None = None) -> Any:
        """``aggregate`` over the state DB's undelivered messages and the spill's."""
        hashes = self._configured(target)
        values = []
        if self._spill is not None:
            with self._spill.reading() as conn:
                values.append(outbox_store.pending(conn, hashes, aggregate))
        with self._store.reading() as conn:
            values.append(outbox_store.pending(conn, hashes, aggregate))
        known = [value for value in values if value is not None]
        if not known:
            return None
        return sum(known) if aggregate.startswith("COUNT") else min(known)
