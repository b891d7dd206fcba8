"""The threads around the supervisor's loop: notification delivery, log tailing, heartbeat.

Each feeds the loop through its inbox or works off the loop's decisions; none of
them decides anything. They start together before the first attempt and stop
together at the end, notification last, so what the end produced still goes out.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sentinel.actions.heartbeat import Heartbeat
from sentinel.actions.notify import Notifier, Outbox
from sentinel.config import Settings
from sentinel.state import StateStore

if TYPE_CHECKING:
    from sentinel.sources.tailer import LogTailer


class Workers:
    """The notifier, the tailer of ``--log`` files and the heartbeat of one run."""

    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        *,
        put: Callable[[tuple[str, Any]], None],
        healthy: Callable[[], bool],
        on_delivery: Callable[[str, bool], None] | None = None,
    ) -> None:
        """``on_delivery(url, ok)``: each delivery's outcome, from the target's thread."""
        self.settings = settings
        self.notifier = Notifier(
            Outbox(store, [url.get_secret_value() for url in settings.notify.urls]),
            timeout_s=settings.notify.timeout_s,
            retry_max_s=settings.notify.retry_max_s,
            on_result=on_delivery,
        )
        self.tailer = self._tailer(store, put)
        self.heartbeat: Heartbeat | None = None
        if settings.notify.heartbeat_url is not None:
            self.heartbeat = Heartbeat(
                settings.notify.heartbeat_url.get_secret_value(),
                settings.notify.heartbeat_interval_s,
                healthy,
                store=store,
                timeout_s=settings.notify.timeout_s,
            )

    def _tailer(
        self, store: StateStore, put: Callable[[tuple[str, Any]], None]
    ) -> LogTailer | None:
        """The tailer of the ``--log`` files; None without any.

        Without, neither its thread nor watchdog's wakes every second for nothing, and
        watchdog is not even imported (a few MiB of RSS).
        """
        settings = self.settings
        if not settings.logs:
            return None
        from sentinel.sources.tailer import LogTailer

        return LogTailer(
            settings.logs,
            lambda path, lines: put(("lines", (path, lines, time.time()))),
            offsets=store,
            poll=settings.tail.poll,
            poll_interval_s=settings.tail.poll_interval_s,
            max_line_bytes=settings.tail.max_line_bytes,
            batch_s=settings.tail.batch_s,
        )

    def pending(self) -> int | None:
        """Messages waiting in the outbox; None when the state dir cannot say (a full disk)."""
        try:
            return self.notifier.outbox.pending_count()
        except (OSError, sqlite3.Error):
            return None

    @property
    def alive(self) -> bool:
        """No worker whose death would leave sentinel blind has died."""
        return self.tailer is None or self.tailer.running

    def start(self) -> None:
        self.notifier.start()
        if self.tailer is not None:
            self.tailer.start()
        if self.heartbeat is not None:
            self.heartbeat.start()

    def stop_reading(self) -> None:
        """Stop what feeds the loop (the heartbeat too: sentinel is ending)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.tailer is not None:
            self.tailer.stop()

    def stop_notifying(self, drain_s: float) -> None:
        """Deliver what is pending for up to ``drain_s``, then stop."""
        self.notifier.stop(drain_s=drain_s)
