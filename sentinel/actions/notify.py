"""Notification delivery through apprise from a durable outbox in the state DB.

An alert becomes one outbox row per target, written in one SQLite transaction, so
it survives a ``kill -9`` and a dead Slack never causes a second delivery to a
working webhook. A worker thread sends what is due, retries in process with
tenacity, and on exhaustion persists the next attempt time, so backoff goes on
across restarts. Delivery is at least once: a row is marked delivered right
after apprise reports success, and (key, target) is unique, so re-enqueuing the
same alert after a restart adds nothing.

A target that answers 429 or 5xx with ``Retry-After`` is not tried again for
that message before the time it names (capped at ``retry_max_s``, never sooner
than the normal backoff); the row waits in the outbox, so the worker goes on
with other messages and targets. apprise hides HTTP answers, so the header is
read by a ``requests`` response hook (see ``sentinel.actions.retry_after``).

Target URLs carry secrets. The DB stores only a hash and a masked form of each;
logs and stored errors only ever show masked URLs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import apprise
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_when_event_set,
    wait_exponential,
    wait_random,
)

from sentinel import secrets
from sentinel.actions.messages import Envelope, apprise_call
from sentinel.actions.retry_after import observe_responses
from sentinel.records import Severity
from sentinel.state import StateStore

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS notify_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    target_hash TEXT NOT NULL,
    target_masked TEXT NOT NULL,
    title TEXT NOT NULL,
    body TEXT NOT NULL,
    severity TEXT NOT NULL,
    alert TEXT NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    delivered_at REAL,
    last_error TEXT,
    UNIQUE (key, target_hash)
);
CREATE INDEX IF NOT EXISTS notify_outbox_due
    ON notify_outbox (delivered_at, next_attempt_at);
"""

_NOTIFY_TYPES = {
    Severity.CRITICAL: apprise.NotifyType.FAILURE,
    Severity.WARNING: apprise.NotifyType.WARNING,
    Severity.INFO: apprise.NotifyType.INFO,
}
_JSON_SCHEMES = frozenset({"json", "jsons"})
# Query parameters that name routing, not credentials, and may be shown as given.
_PLAIN_QUERY_KEYS = frozenset({"from", "to", "cc", "bcc", "smtp", "mode", "method", "format"})
_MASK = "****"


class DeliveryError(Exception):
    """A delivery attempt failed; the message is safe to log (URLs masked).

    ``retry_at`` (epoch seconds) is when the target asked to be tried again, if it did.
    """

    def __init__(self, message: str, retry_at: float | None = None) -> None:
        super().__init__(message)
        self.retry_at = retry_at


def _retry_now(exc: BaseException) -> bool:
    """Retry in process unless the target asked to wait: that wait is the outbox's job."""
    return isinstance(exc, DeliveryError) and exc.retry_at is None


@dataclass(frozen=True)
class Message:
    """One notification: text for people, the alert for machines, an idempotency key."""

    title: str
    body: str
    severity: Severity
    alert: dict[str, Any]
    key: str


@dataclass(frozen=True)
class Delivery:
    """One outbox row: a message still owed to one target."""

    id: int
    target: str
    message: Message
    attempts: int


@dataclass(frozen=True)
class TargetStatus:
    """How delivery to one target went in this process (times are epoch seconds)."""

    last_success: float | None = None
    last_failure: float | None = None
    last_error: str | None = None


SendFn = Callable[[str, Message, float], None]


def _scheme(url: str) -> str:
    scheme = url.partition("://")[0].lower()
    return scheme if re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme) else "unknown"


def _instantiate(url: str) -> Any:
    return apprise.Apprise.instantiate(url)


def _tokens(url: str) -> set[str]:
    return {token for token in re.split(r"[/:@?&=#]+", url) if token}


def _secrets(url: str) -> list[str]:
    """The fragments of ``url`` that must never be shown, longest first."""
    parts = urlsplit(url)
    found = {value for key, value in parse_qsl(parts.query) if key not in _PLAIN_QUERY_KEYS}
    if parts.password:
        found.add(parts.password)
    plugin = _instantiate(url)
    if plugin is not None:
        found |= _tokens(plugin.url(privacy=False)) - _tokens(plugin.url(privacy=True))
    else:  # nothing tells which part of an unknown URL is a token
        found |= _tokens(parts.path) | {parts.username or ""}
    found = {secret for secret in found if len(secret) >= 3}
    found |= {quote(secret, safe="") for secret in found}
    return sorted(found, key=len, reverse=True)


def mask_url(url: str) -> str:
    """``url`` with its credentials and tokens masked, readable otherwise.

    Host and path come from apprise's own privacy form; query values are kept
    only for routing keys (``from``, ``to``, ``smtp``, ...). A URL apprise does
    not know is reduced to its scheme, since nothing tells which part is secret.
    """
    plugin = _instantiate(url)
    if plugin is None:
        return f"{_scheme(url)}://{_MASK}"
    masked = str(plugin.url(privacy=True)).partition("?")[0]
    query = [
        f"{key}={value if key in _PLAIN_QUERY_KEYS else _MASK}"
        for key, value in parse_qsl(urlsplit(url).query)
    ]
    return f"{masked}?{'&'.join(query)}" if query else masked


def scrub(text: str, url: str) -> str:
    """``text`` with ``url`` and each of its secrets replaced by masked forms."""
    text = text.replace(url, mask_url(url))
    for secret in _secrets(url):
        text = text.replace(secret, _MASK)
    return text


def validate_url(url: str) -> str | None:
    """None if apprise accepts ``url``, else why not (secrets masked)."""
    try:
        plugin = apprise.Apprise.instantiate(url, suppress_exceptions=False)
    except Exception as exc:  # apprise raises TypeError and friends for bad arguments
        return scrub(f"invalid notification URL {mask_url(url)}: {exc}", url)
    if plugin is None:
        return f"unsupported or malformed notification URL {mask_url(url)}"
    return None


def send_apprise(target: str, message: Message, timeout_s: float) -> None:
    """Send ``message`` to one apprise URL; raise DeliveryError on failure."""
    body = json.dumps(message.alert) if _scheme(target) in _JSON_SCHEMES else message.body
    _notify(
        target,
        target,
        {"body": body, "title": message.title, "notify_type": _NOTIFY_TYPES[message.severity]},
        timeout_s,
    )


def send_envelope(target: str, envelope: Envelope, timeout_s: float) -> None:
    """Send ``envelope`` to one apprise URL, rendered for its kind; raise DeliveryError."""
    url, arguments = apprise_call(target, envelope)
    _notify(target, url, arguments, timeout_s)


def _notify(target: str, url: str, arguments: dict[str, Any], timeout_s: float) -> None:
    """One ``Apprise.notify`` to ``url`` (made from ``target``); errors name ``target`` masked."""
    plugin = _instantiate(url)
    if plugin is None:
        raise DeliveryError(f"unsupported or malformed notification URL {mask_url(target)}")
    plugin.socket_connect_timeout = timeout_s
    plugin.socket_read_timeout = timeout_s
    notifier = apprise.Apprise()
    notifier.add(plugin)
    capture = apprise.LogCapture(level=logging.WARNING, fmt="%(message)s")  # type: ignore[no-untyped-call]
    with capture as captured, observe_responses() as answers:
        try:
            result = notifier.notify(**arguments)
        except Exception as exc:  # a plugin bug must fail this row, not the worker
            raise DeliveryError(scrub(f"{type(exc).__name__}: {exc}", target)) from None
    if not result:
        if hasattr(result, "logs"):  # apprise 2 keeps each call's own log entries
            lines = [e.message for e in result.logs() if e.level in ("WARNING", "ERROR")]
        else:
            lines = captured.getvalue().splitlines()
        error = scrub(" ".join(lines) or "apprise reported failure", target)
        raise DeliveryError(error, retry_at=answers.retry_at)


def _target_hash(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


class Outbox:
    """Durable queue of (message, target) deliveries in the state DB."""

    def __init__(self, store: StateStore, targets: Sequence[str]) -> None:
        self._store = store
        self._targets = {_target_hash(url): url for url in targets}
        self.masked = {url: mask_url(url) for url in targets}
        for url in targets:
            secrets.register(_secrets(url))
        store.executescript(_SCHEMA)

    @property
    def targets(self) -> list[str]:
        return list(self._targets.values())

    def _configured(self) -> tuple[str, tuple[str, ...]]:
        hashes = tuple(self._targets)
        return ", ".join("?" * len(hashes)) or "NULL", hashes

    def enqueue(self, message: Message) -> int:
        """Add one row per target unless (key, target) is already there; return rows added."""
        now = time.time()
        alert = json.dumps(message.alert)
        head = (message.key,)
        tail = (message.title, message.body, str(message.severity), alert, now, now)
        rows = [(*head, hashed, self.masked[url], *tail) for hashed, url in self._targets.items()]
        with self._store.transaction() as conn:
            cursor = conn.executemany(
                "INSERT OR IGNORE INTO notify_outbox (key, target_hash, target_masked, title,"
                " body, severity, alert, created_at, next_attempt_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            return max(cursor.rowcount, 0)

    def due(self, now: float, limit: int = 50) -> list[Delivery]:
        """Undelivered rows for the configured targets whose next attempt is at or before now."""
        marks, hashes = self._configured()
        with self._store.transaction() as conn:
            rows = conn.execute(
                "SELECT id, target_hash, key, title, body, severity, alert, attempts"
                f" FROM notify_outbox WHERE delivered_at IS NULL AND target_hash IN ({marks})"
                " AND next_attempt_at <= ? ORDER BY next_attempt_at, id LIMIT ?",
                (*hashes, now, limit),
            ).fetchall()
        deliveries = []
        for row_id, hashed, key, title, body, severity, alert, attempts in rows:
            message = Message(title, body, Severity(severity), json.loads(alert), key)
            deliveries.append(Delivery(row_id, self._targets[hashed], message, attempts))
        return deliveries

    def next_due_at(self) -> float | None:
        """When the earliest undelivered row becomes due, or None if nothing is pending."""
        earliest = self._pending("MIN(next_attempt_at)")
        return None if earliest is None else float(earliest)

    def mark_delivered(self, delivery_id: int, now: float) -> None:
        with self._store.transaction() as conn:
            conn.execute(
                "UPDATE notify_outbox SET delivered_at = ?, attempts = attempts + 1 WHERE id = ?",
                (now, delivery_id),
            )

    def mark_failed(self, delivery_id: int, error: str, next_attempt_at: float) -> None:
        """Count a failed attempt; ``error`` must already be masked."""
        with self._store.transaction() as conn:
            conn.execute(
                "UPDATE notify_outbox SET attempts = attempts + 1, last_error = ?,"
                " next_attempt_at = ? WHERE id = ?",
                (error, next_attempt_at, delivery_id),
            )

    def pending_count(self) -> int:
        """Undelivered rows for the configured targets."""
        return int(self._pending("COUNT(*)"))

    def _pending(self, aggregate: str) -> Any:
        """One aggregate over the undelivered rows of the configured targets."""
        marks, hashes = self._configured()
        with self._store.transaction() as conn:
            row = conn.execute(
                f"SELECT {aggregate} FROM notify_outbox"
                f" WHERE delivered_at IS NULL AND target_hash IN ({marks})",
                hashes,
            ).fetchone()
        return row[0]


def backoff_s(attempts: int, initial_s: float, max_s: float) -> float:
    """Delay before the next round after ``attempts`` failed rounds: exponential, jittered."""
    ceiling = min(max_s, initial_s * 2.0 ** min(max(attempts - 1, 0), 32))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


class Notifier:
    """Delivers the outbox on its own thread, with retry and backoff; never blocks the caller."""

    def __init__(
        self,
        outbox: Outbox,
        *,
        send: SendFn | None = None,
        timeout_s: float = 10.0,
        retry_max_s: float = 300.0,
        retry_initial_s: float = 5.0,
        tries: int = 3,
        try_wait_initial_s: float = 0.2,
        try_wait_max_s: float = 2.0,
    ) -> None:
        self._outbox = outbox
        self._send: SendFn = send or send_apprise
        self._timeout_s = timeout_s
        self._retry_max_s = retry_max_s
        self._retry_initial_s = retry_initial_s
        self._tries = tries
        # Equivalent to wait_exponential_jitter, whose ``initial`` is deprecated in tenacity 9
        # while its replacement ``multiplier`` does not exist in 8.x.
        self._try_wait = wait_exponential(
            multiplier=try_wait_initial_s, max=try_wait_max_s
        ) + wait_random(0, try_wait_initial_s)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._drain_until = float("inf")
        self._thread: threading.Thread | None = None
        self._status_lock = threading.Lock()
        self._status = {outbox.masked[url]: TargetStatus() for url in outbox.targets}

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._drain_until = float("inf")
        self._thread = threading.Thread(target=self._run, name="sentinel-notify", daemon=True)
        self._thread.start()

    def notify(self, message: Message) -> None:
        """Enqueue ``message`` for every target and wake the worker; returns at once."""
        self._outbox.enqueue(message)
        self._wake.set()

    def stop(self, drain_s: float = 5.0) -> None:
        """Deliver what is due for up to ``drain_s``, then stop; the rest stays in the DB."""
        self._drain_until = time.monotonic() + drain_s
        self._stopping.set()
        self._wake.set()
        if self._thread is None:
            return
        self._thread.join(timeout=drain_s + 0.5)
        if self._thread.is_alive():
            logger.warning("notification worker still sending after %.1fs; leaving it", drain_s)
        self._thread = None

    def results(self) -> dict[str, TargetStatus]:
        """Per masked target: when delivery last succeeded and failed, and why."""
        with self._status_lock:
            return dict(self._status)

    def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                self._deliver_due()
                next_due = self._outbox.next_due_at()
            except Exception:
                logger.exception("notification worker failed; retrying in %.1fs", 1.0)
                next_due = time.time() + 1.0
            if self._stopping.is_set():
                return
            timeout = None if next_due is None else max(0.0, next_due - time.time())
            self._wake.wait(timeout)

    def _deliver_due(self, batch_size: int = 50) -> None:
        while batch := self._outbox.due(time.time(), limit=batch_size):
            for delivery in batch:
                if self._stopping.is_set() and time.monotonic() >= self._drain_until:
                    return
                self._deliver(delivery)
            if len(batch) < batch_size:
                return

    def _deliver(self, delivery: Delivery) -> None:
        masked = self._outbox.masked[delivery.target]
        retrying = Retrying(
            stop=stop_after_attempt(self._tries) | stop_when_event_set(self._stopping),
            wait=self._try_wait,
            retry=retry_if_exception(_retry_now),
            sleep=self._pause,
            reraise=True,
        )
        try:
            retrying(self._send, delivery.target, delivery.message, self._timeout_s)
        except Exception as exc:
            error = scrub(str(exc), delivery.target)
            delay = backoff_s(delivery.attempts + 1, self._retry_initial_s, self._retry_max_s)
            now = time.time()
            if isinstance(exc, DeliveryError) and exc.retry_at is not None:
                delay = min(self._retry_max_s, max(delay, exc.retry_at - now))
            self._outbox.mark_failed(delivery.id, error, now + delay)
            self._set_status(masked, last_failure=now, last_error=error)
            logger.warning(
                "notification %s to %s failed (attempt %d), next try in %.1fs: %s",
                delivery.message.key,
                masked,
                delivery.attempts + 1,
                delay,
                error,
            )
            return
        now = time.time()
        self._outbox.mark_delivered(delivery.id, now)
        self._set_status(masked, last_success=now)
        logger.info("notification %s delivered to %s", delivery.message.key, masked)

    def _pause(self, seconds: float) -> None:
        # Between in-process tries; cut short by stop() so a drain is not spent sleeping.
        self._stopping.wait(seconds)

    def _set_status(self, masked: str, **changes: Any) -> None:
        with self._status_lock:
            self._status[masked] = replace(self._status.get(masked, TargetStatus()), **changes)
