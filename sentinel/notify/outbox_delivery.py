"""Delivery of one target's messages from the outbox, on a thread of its own.

Each target has its own worker, so a target that hangs (accepts the connection and
never answers) holds up only itself: the others get their messages at once, each
attempt bounded by its own timeout. Within a target, messages go in order.

A worker tries a message a few times in process (tenacity: exponential backoff
with jitter); when those tries are spent it stores the next attempt time in the
outbox, so backoff goes on across restarts. A target that answered 429 or 5xx
with ``Retry-After`` is not tried again for that message before the time it
names. The outbox is the only record: a message is marked delivered right after
its target took it, and one that was not stays due for the next round or the
next start of sentinel.

On stop a worker gets until the drain deadline; one still waiting for its target
then is left (``close``): it touches the state DB no more, even when the send
returns later, so the DB can be closed under it. Its message stays undelivered in
the outbox and goes out on the next start.
"""

from __future__ import annotations

import contextlib
import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sentinel.model.secrets import scrub
from sentinel.notify.notices import Envelope
from sentinel.notify.outbox import REFUSED, Delivery, Outbox
from sentinel.notify.target_results import record_result

logger = logging.getLogger(__name__)

#: How soon a worker tries the state DB again after it failed (a full or read-only disk).
STORE_RETRY_S = 5.0

SendFn = Callable[[str, Envelope, float], None]
_T = TypeVar("_T")


class DeliveryError(Exception):
    """A delivery attempt failed; the message is safe to log (URLs masked).

    ``retry_at`` (epoch seconds) is when the target asked to be tried again, if it did.
    """

    def __init__(self, message: str, retry_at: float | None = None) -> None:
        super().__init__(message)
        self.retry_at = retry_at


def backoff_s(attempts: int, initial_s: float, max_s: float) -> float:
    """Delay before the next round after ``attempts`` failed rounds: exponential, jittered."""
    ceiling = min(max_s, initial_s * 2.0 ** min(max(attempts - 1, 0), 32))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def _retry_now(exc: BaseException) -> bool:
    """Retry in process unless the target asked to wait: that wait is the outbox's job."""
    return isinstance(exc, DeliveryError) and exc.retry_at is None


@dataclass(frozen=True)
class Retries:
    """How a message is sent and tried again: in process, then across outbox rounds."""

    #: Seconds one attempt may take (connect, and each wait for the answer).
    timeout_s: float = 10.0
    #: Attempts in process before the message waits in the outbox.
    tries: int = 3
    try_wait_initial_s: float = 0.2
    try_wait_max_s: float = 2.0
    #: The first outbox round's delay; it doubles up to ``retry_max_s``.
    retry_initial_s: float = 5.0
    retry_max_s: float = 300.0


class _Closed(Exception):
    """The worker was left at stop: the state DB is no longer its to touch."""


class TargetWorker:
    """Delivers the messages of one target (``url``) in order, on its own thread."""

    def __init__(
        self,
        outbox: Outbox,
        url: str,
        send: SendFn,
        retries: Retries,
        on_result: Callable[[str, bool], None] | None = None,
    ) -> None:
        """``on_result(url, ok)``: told of each delivery round's outcome (for metrics)."""
        self.url = url
        self._on_result = on_result
        self.name = outbox.name(url)
        self._outbox = outbox
        self._send = send
        self._retries = retries
        # tenacity is imported by the first target's worker: a run with no target never
        # pays for it (about 60 ms of every sentinel's start).
        from tenacity import wait_exponential, wait_random

        # Equivalent to wait_exponential_jitter, whose ``initial`` is deprecated in tenacity 9
        # while its replacement ``multiplier`` does not exist in 8.x.
        self._try_wait = wait_exponential(
            multiplier=retries.try_wait_initial_s, max=retries.try_wait_max_s
        ) + wait_random(0, retries.try_wait_initial_s)
        #: Set when this target has a new message, and by ``stop``.
        self.wake = threading.Event()
        self._stopping = threading.Event()
        self._drain_until = float("inf")
        # Held for every use of the state DB; ``close`` takes it to end them for good.
        self._gate = threading.Lock()
        self._closed = False
        self._store_error: str | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"sentinel-notify {self.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, drain_until: float) -> None:
        """Deliver what is due until ``drain_until`` (``time.monotonic``), then end."""
        self._drain_until = drain_until
        self._stopping.set()
        self.wake.set()

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the thread to end; whether it did."""
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    def close(self) -> None:
        """From now on the worker never touches the state DB (waits for a use in progress)."""
        with self._gate:
            self._closed = True

    # -- the thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self.wake.clear()
                # Read before the pass: a stop() during it released more, so one pass more.
                stopping = self._stopping.is_set()
                next_due = self._pass()
                if stopping:
                    return
                timeout = None if next_due is None else max(0.0, next_due - time.time())
                self.wake.wait(timeout)
        except _Closed:
            return  # left at stop; what was not delivered is in the outbox

    def _pass(self) -> float | None:
        """Deliver what is due; when the next message is (None: nothing pending)."""
        try:
            self._deliver_due()
            next_due = self._store(lambda: self._outbox.next_due_at(self.url))
        except (OSError, sqlite3.Error) as error:
            self._store_failed(error)
            return time.time() + STORE_RETRY_S
        except _Closed:
            raise
        except Exception:  # a bug must not end this target's deliveries for good
            logger.exception("notifications to %s failed; trying again", self.name)
            return time.time() + STORE_RETRY_S
        if self._store_error is not None:
            self._store_error = None
            logger.info("notifications to %s: the state DB works again", self.name)
        return next_due

    def _store(self, use: Callable[[], _T]) -> _T:
        with self._gate:
            if self._closed:
                raise _Closed
            return use()

    def _store_failed(self, error: Exception) -> None:
        """Said once per streak, without a traceback: a full or read-only state dir."""
        if self._store_error is None:
            logger.error(
                "notifications to %s: the state DB failed (%s); trying again every %.0fs",
                self.name,
                error,
                STORE_RETRY_S,
            )
        self._store_error = str(error)

    def _draining_over(self) -> bool:
        return self._stopping.is_set() and time.monotonic() >= self._drain_until

    def _deliver_due(self, batch_size: int = 50) -> None:
        outbox = self._outbox
        while batch := self._store(lambda: outbox.due(time.time(), batch_size, self.url)):
            for delivery in batch:
                if self._draining_over():
                    return
                self._deliver(delivery)
            if len(batch) < batch_size:
                return

    def _deliver(self, delivery: Delivery) -> None:
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_when_event_set

        retries = self._retries
        retrying = Retrying(
            stop=stop_after_attempt(retries.tries) | stop_when_event_set(self._stopping),
            wait=self._try_wait,
            retry=retry_if_exception(_retry_now),
            sleep=self._pause,
            reraise=True,
        )
        key = delivery.envelope.key
        try:
            retrying(self._send, delivery.target, delivery.envelope, retries.timeout_s)
        except Exception as exc:
            error = scrub(str(exc), delivery.target)
            delay = backoff_s(delivery.attempts + 1, retries.retry_initial_s, retries.retry_max_s)
            now = time.time()
            if isinstance(exc, DeliveryError) and exc.retry_at is not None:
                delay = min(retries.retry_max_s, max(delay, exc.retry_at - now))
            self._store(lambda: self._failed(delivery, error, now, delay))
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
        self._store(lambda: self._delivered(delivery, now))
        logger.info(
            "notification %s (%d notice(s)) delivered to %s",
            key,
            len(delivery.envelope.notices) + sum(delivery.envelope.folded.values()),
            delivery.name,
        )

    def _failed(self, delivery: Delivery, error: str, now: float, delay: float) -> None:
        self._outbox.mark_failed(delivery, error, now + delay)
        with contextlib.suppress(*REFUSED):  # for `sentinel status` only
            record_result(self._outbox.store, delivery.target, delivery.name, now, error)
        if self._on_result is not None:
            self._on_result(delivery.target, False)

    def _delivered(self, delivery: Delivery, now: float) -> None:
        self._outbox.mark_delivered(delivery, now)
        with contextlib.suppress(*REFUSED):  # for `sentinel status` only
            record_result(self._outbox.store, delivery.target, delivery.name, now, None)
        if self._on_result is not None:
            self._on_result(delivery.target, True)

    def _pause(self, seconds: float) -> None:
        # Between in-process tries; cut short by stop() so a drain is not spent sleeping.
        self._stopping.wait(seconds)
