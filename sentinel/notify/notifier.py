"""Notification delivery through apprise, from the durable outbox (``outbox.py``).

The ``Notifier`` runs a worker per target (``outbox_delivery.TargetWorker``): each
takes its target's messages that are due, renders each for its target
(``messages.apprise_call``) and sends it with its own timeout, retrying in process
and then across outbox rounds, so backoff goes on across restarts. A target that
hangs holds up only itself. Delivery is at least once: a message is marked
delivered right after apprise reports success, and its idempotency key, made with
the row, is the same in every attempt, so a receiver can tell a repeat.

On stop every target gets the same drain time, in parallel; a message that could
not go out in it stays in the outbox for the next start.

A target that answers 429 or 5xx with ``Retry-After`` is not tried again for
that message before the time it names (capped at ``retry_max_s``, never sooner
than the normal backoff); the row waits in the outbox, so the worker goes on
with other messages. apprise hides HTTP answers, so the header is read by a
``requests`` response hook (see ``sentinel.notify.retry_after``).

Every attempt's outcome is stored per target (``actions.target_results``:
last success, last failure, last error) and logged, so ``sentinel status``
shows them after sentinel is gone.

apprise and ``requests`` (about a quarter of a second to import) are imported by the first
message sent: a run with no target, and every ``sentinel`` command that sends nothing,
never pays for them.

Target URLs carry secrets. The DB stores only a hash and a name (the target's
own, or its URL masked); logs and stored errors only ever show masked URLs.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sentinel.model import secrets
from sentinel.model.records import SENTINEL_SOURCE, Alert, Severity
from sentinel.model.secrets import mask_url, scrub, url_secrets, validate_url
from sentinel.notify.notices import Envelope, JobInfo, Notice, NoticeKind
from sentinel.notify.outbox import Outbox, Target, target_hash
from sentinel.notify.outbox_delivery import DeliveryError, Retries, SendFn, TargetWorker, backoff_s
from sentinel.notify.target_results import TargetResult, read_results

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


def send_envelope(target: str, envelope: Envelope, timeout_s: float) -> None:
    """Send ``envelope`` to one apprise URL, rendered for its kind; raise DeliveryError."""
    from sentinel.notify.apprise_message import apprise_call  # imports apprise (docstring)

    url, arguments = apprise_call(target, envelope)
    _notify(target, url, arguments, timeout_s)


def _notify(target: str, url: str, arguments: dict[str, Any], timeout_s: float) -> None:
    """One ``Apprise.notify`` to ``url`` (made from ``target``); errors name ``target`` masked."""
    import apprise

    from sentinel.notify.retry_after import observe_responses  # imports requests

    plugin = secrets.apprise_plugin(url)
    if plugin is None:
        raise DeliveryError(f"unsupported or malformed notification URL {mask_url(target)}")
    plugin.socket_connect_timeout = timeout_s
    plugin.socket_read_timeout = timeout_s
    if hasattr(plugin.asset, "_service_timeout"):
        # apprise 2 sends a call with a time limit from its own thread pool, whose threads
        # the interpreter waits for at exit: a hung target would hold sentinel's exit for
        # its whole timeout. The socket timeouts bound each attempt, so without the limit
        # the call runs on this target's own (daemon) worker. The asset is this plugin's.
        plugin.asset._service_timeout = 0.0
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


class Notifier:
    """Delivers the outbox, a thread per target, with retry and backoff; never blocks
    the caller."""

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
        on_result: Callable[[str, bool], None] | None = None,
    ) -> None:
        """``on_result(url, ok)``: told of every delivery's outcome, from its target's thread."""
        self.outbox = outbox
        self._on_result = on_result
        self._send: SendFn = send or send_envelope
        self._retries = Retries(
            timeout_s=timeout_s,
            tries=tries,
            try_wait_initial_s=try_wait_initial_s,
            try_wait_max_s=try_wait_max_s,
            retry_initial_s=retry_initial_s,
            retry_max_s=retry_max_s,
        )
        self._lock = threading.Lock()
        #: The running workers, by target URL; None while not started.
        self._workers: dict[str, TargetWorker] | None = None
        for url in outbox.targets:
            secrets.register(url_secrets(url))
        outbox.add_targets(
            Target(url, mask_url(url)) for url in outbox.targets if not outbox.name(url)
        )
        outbox.on_change(self._wake)

    def start(self) -> None:
        with self._lock:
            if self._workers is not None:
                return
            self._workers = {}
        self._wake(self.outbox.targets)

    def stop(self, drain_s: float = 5.0) -> None:
        """Send what is due, messages still gathering their group included, giving every
        target up to ``drain_s`` (all in parallel); then stop. What a target did not take
        in that time stays in the DB for the next start."""
        deadline = time.monotonic() + drain_s
        try:
            self.outbox.release_groups(time.time())
        except (OSError, sqlite3.Error) as error:
            logger.error("notifications: cannot release the messages still gathering: %s", error)
        with self._lock:
            workers, self._workers = self._workers, None
        for worker in (workers or {}).values():
            worker.stop(deadline)
        for worker in (workers or {}).values():
            if worker.join(deadline - time.monotonic()):
                continue
            worker.close()
            logger.warning(
                "notifications to %s: still sending after %.1fs; what it has not taken"
                " stays in the outbox for the next start",
                worker.name,
                drain_s,
            )
        self._say_undelivered()

    def _say_undelivered(self) -> None:
        """At the end, how many messages nobody has received yet: they are not lost."""
        try:
            undelivered = self.outbox.pending_count()
        except (OSError, sqlite3.Error) as error:
            logger.error("notifications: cannot count what is undelivered: %s", error)
            return
        if undelivered:
            logger.warning(
                "%d notification message(s) not delivered yet: they stay in the outbox and go"
                " out when sentinel next starts on this state dir (`sentinel status` lists them)",
                undelivered,
            )

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

    def _wake(self, urls: Sequence[str]) -> None:
        """Wake the workers of ``urls`` (started, once running, for a target new to them)."""
        configured = set(self.outbox.targets)
        with self._lock:
            if self._workers is None:
                return
            for url in urls:
                worker = self._workers.get(url)
                if worker is None:
                    if url not in configured:
                        continue
                    worker = TargetWorker(
                        self.outbox, url, self._send, self._retries, self._on_result
                    )
                    self._workers[url] = worker
                    worker.start()  # under the lock: stop() joins only started workers
                worker.wake.set()


def notify_test_envelope(job: JobInfo, now: float) -> Envelope:
    """A TEST message: proves a target is reachable, about no incident."""
    alert = Alert(
        rule="notify_test",
        severity=Severity.INFO,
        message=f"test message from sentinel on {job.host}: this target is reachable",
        time=now,
        source=SENTINEL_SOURCE,
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
