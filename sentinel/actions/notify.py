"""Notification delivery through apprise, from the durable outbox (``outbox.py``).

A worker thread takes the messages that are due, renders each for its target
(``messages.apprise_call``) and sends it, retrying in process with tenacity
(exponential backoff with jitter); when those tries are spent it stores the
next attempt time in the outbox, so backoff goes on across restarts. Delivery
is at least once: a message is marked delivered right after apprise reports
success, and its idempotency key, made with the row, is the same in every
attempt, so a receiver can tell a repeat.

A target that answers 429 or 5xx with ``Retry-After`` is not tried again for
that message before the time it names (capped at ``retry_max_s``, never sooner
than the normal backoff); the row waits in the outbox, so the worker goes on
with other messages and targets. apprise hides HTTP answers, so the header is
read by a ``requests`` response hook (see ``sentinel.actions.retry_after``).

Every attempt's outcome is stored per target (``actions.target_results``:
last success, last failure, last error) and logged, so ``sentinel status``
shows them after sentinel is gone.

Target URLs carry secrets. The DB stores only a hash and a name (the target's
own, or its URL masked); logs and stored errors only ever show masked URLs.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

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
from sentinel.actions.apprise_message import apprise_call
from sentinel.actions.notices import Envelope, JobInfo, Notice, NoticeKind
from sentinel.actions.outbox import Delivery, Outbox, Target, target_hash
from sentinel.actions.retry_after import observe_responses
from sentinel.actions.target_results import TargetResult, read_results, record_result
from sentinel.records import Alert, Severity
from sentinel.secrets import mask_url, scrub, url_secrets, validate_url

__all__ = [
    "DeliveryError",
    "Notifier",
    "Outbox",
    "backoff_s",
    "mask_url",
    "notify_test_envelope",
    "scrub",
    "send_envelope",
    "send_notify_test",
    "validate_url",
]

logger = logging.getLogger(__name__)



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


SendFn = Callable[[str, Envelope, float], None]


def send_envelope(target: str, envelope: Envelope, timeout_s: float) -> None:
    """Send ``envelope`` to one apprise URL, rendered for its kind; raise DeliveryError."""
    url, arguments = apprise_call(target, envelope)
    _notify(target, url, arguments, timeout_s)


def _notify(target: str, url: str, arguments: dict[str, Any], timeout_s: float) -> None:
    """One ``Apprise.notify`` to ``url`` (made from ``target``); errors name ``target`` masked."""
    plugin = secrets.apprise_plugin(url)
    if plugin is None:
        raise DeliveryError(f"unsupported or malformed notification URL {mask_url(target)}")
    plugin.socket_connect_timeout = timeout_s
    plugin.socket_read_timeout = timeout_s
    notifier = apprise.Apprise()
    notifier.add(plugin)
    capture = apprise.LogCapture(level=logging.WARNING, fmt="%(message)s")  # type: ignore[no-untyped-call]
    with capture as captured, observe_responses(plugin) as answers:
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
        self.outbox = outbox
        self._send: SendFn = send or send_envelope
        self._timeout_s = timeout_s
        self._retry_max_s = retry_max_s
        self._retry_initial_s = retry_initial_s
        self._tries = tries
        # Equivalent to wait_exponential_jitter, whose ``initial`` is deprecated in tenacity 9
        # while its replacement ``multiplier`` does not exist in 8.x.
        self._try_wait = wait_exponential(
            multiplier=try_wait_initial_s, max=try_wait_max_s
        ) + wait_random(0, try_wait_initial_s)
        # Set by the outbox whenever a message is added, and by stop().
        self._wake = outbox.changed
        self._stopping = threading.Event()
        self._drain_until = float("inf")
        self._thread: threading.Thread | None = None
        for url in outbox.targets:
            secrets.register(url_secrets(url))
        outbox.add_targets(
            Target(url, mask_url(url)) for url in outbox.targets if not outbox.name(url)
        )

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._drain_until = float("inf")
        self._thread = threading.Thread(target=self._run, name="sentinel-notify", daemon=True)
        self._thread.start()

    def stop(self, drain_s: float = 5.0) -> None:
        """Send what is due, messages still gathering their group included, for up to
        ``drain_s``; then stop. The rest stays in the DB for the next start."""
        self.outbox.release_groups(time.time())
        self._drain_until = time.monotonic() + drain_s
        self._stopping.set()
        self._wake.set()
        if self._thread is None:
            return
        self._thread.join(timeout=drain_s + 0.5)
        if self._thread.is_alive():
            logger.warning("notification worker still sending after %.1fs; leaving it", drain_s)
        self._thread = None

    def results(self) -> dict[str, TargetResult]:
        """Per configured target's name: how its deliveries last went (from the DB)."""
        with self.outbox.store.transaction() as conn:
            stored = read_results(conn)
        results = {}
        for url in self.outbox.targets:
            name = self.outbox.name(url)
            found = stored.get(target_hash(url))
            results[name] = replace(found, name=name) if found else TargetResult(name)
        return results

    def _run(self) -> None:
        while True:
            self._wake.clear()
            # Read before the pass: a stop() during it released more, so one pass more.
            stopping = self._stopping.is_set()
            try:
                self._deliver_due()
                next_due = self.outbox.next_due_at()
            except Exception:
                logger.exception("notification worker failed; retrying in %.1fs", 1.0)
                next_due = time.time() + 1.0
            if stopping:
                return
            timeout = None if next_due is None else max(0.0, next_due - time.time())
            self._wake.wait(timeout)

    def _deliver_due(self, batch_size: int = 50) -> None:
        while batch := self.outbox.due(time.time(), limit=batch_size):
            for delivery in batch:
                if self._stopping.is_set() and time.monotonic() >= self._drain_until:
                    return
                self._deliver(delivery)
            if len(batch) < batch_size:
                return

    def _deliver(self, delivery: Delivery) -> None:
        retrying = Retrying(
            stop=stop_after_attempt(self._tries) | stop_when_event_set(self._stopping),
            wait=self._try_wait,
            retry=retry_if_exception(_retry_now),
            sleep=self._pause,
            reraise=True,
        )
        key = delivery.envelope.key
        try:
            retrying(self._send, delivery.target, delivery.envelope, self._timeout_s)
        except Exception as exc:
            error = scrub(str(exc), delivery.target)
            delay = backoff_s(delivery.attempts + 1, self._retry_initial_s, self._retry_max_s)
            now = time.time()
            if isinstance(exc, DeliveryError) and exc.retry_at is not None:
                delay = min(self._retry_max_s, max(delay, exc.retry_at - now))
            self.outbox.mark_failed(delivery, error, now + delay)
            record_result(self.outbox.store, delivery.target, delivery.name, now, error)
            logger.warning(
                "notification %s to %s failed (attempt %d), next try in %.1fs: %s",
                key,
                delivery.name,
                delivery.attempts + 1,
                delay,
                error,
            )
            return
        now = time.time()
        self.outbox.mark_delivered(delivery, now)
        record_result(self.outbox.store, delivery.target, delivery.name, now, None)
        logger.info(
            "notification %s (%d notice(s)) delivered to %s",
            key,
            len(delivery.envelope.notices) + sum(delivery.envelope.folded.values()),
            delivery.name,
        )

    def _pause(self, seconds: float) -> None:
        # Between in-process tries; cut short by stop() so a drain is not spent sleeping.
        self._stopping.wait(seconds)


def notify_test_envelope(job: JobInfo, now: float) -> Envelope:
    """A TEST message: proves a target is reachable, about no incident."""
    alert = Alert(
        rule="notify_test",
        severity=Severity.INFO,
        message=f"test message from sentinel on {job.host}: this target is reachable",
        time=now,
        source="sentinel",
    )
    notice = Notice(
        kind=NoticeKind.TEST,
        incident_id="notify-test",
        rule="notify_test",
        severity=Severity.INFO,
        alert=alert.to_json(),
        time=now,
    )
    return Envelope(key=f"notify-test:{uuid.uuid4().hex[:8]}", job=job, notices=(notice,))


def send_notify_test(
    targets: Sequence[Target], job: JobInfo, timeout_s: float, now: float
) -> list[tuple[Target, str | None]]:
    """Send a TEST message to each target, once, in order; each one's error (masked) or None."""
    envelope = notify_test_envelope(job, now)
    results: list[tuple[Target, str | None]] = []
    for target in targets:
        try:
            send_envelope(target.url, envelope, timeout_s)
        except DeliveryError as error:
            message = scrub(str(error), target.url)
            results.append((target, message))
            logger.warning("test message to %s failed: %s", target.name, message)
        else:
            results.append((target, None))
            logger.info("test message delivered to %s", target.name)
    return results
