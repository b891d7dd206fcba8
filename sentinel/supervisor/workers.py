"""The threads around the supervisor's loop: notification delivery, log tailing, heartbeat.

Log tailing follows the ``--log`` files and the metric files found under the job's
folder (``sentinel.follow.discover``) as they appear.

Each feeds the loop through its inbox or works off the loop's decisions; none of
them decides anything. They start together before the first attempt and stop
together at the end, notification last, so what the end produced still goes out.
"""

from __future__ import annotations

import glob
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sentinel.config import Settings
from sentinel.follow.discover import WHOLE_FILES, MetricFileFinder
from sentinel.notify.notifier import Notifier, Outbox
from sentinel.store.state import StateStore
from sentinel.supervisor.events import OutputLines, Put, TrainerStateRead
from sentinel.supervisor.metric_files import is_metric_file, splitting, unreadable

if TYPE_CHECKING:
    from sentinel.follow.tailer import LogTailer
    from sentinel.notify.heartbeat import Heartbeat

#: ``watch``: a metric file written this recently is the attached job's...
WATCH_RECENT_S = 600.0
#: ...and not before the job began, less this (a process's start time is to the clock
#: tick; a file's mtime to the filesystem's grain).
STARTED_GRAIN_S = 1.0


class Workers:
    """The notifier, the tailer of ``--log`` files and the heartbeat of one run."""

    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        *,
        put: Put,
        healthy: Callable[[], bool],
        on_delivery: Callable[[str, bool], None] | None = None,
        mode: str = "run",
        job_started_at: float | None = None,
    ) -> None:
        """``on_delivery(url, ok)``: each delivery's outcome, from the target's thread.
        ``mode``: ``run`` or ``watch``, where metric files are looked for (``discovery``)."""
        self.settings = settings
        self._put = put
        self._store = store
        #: The tailer is made by the first file found when there is no ``--log``.
        self._tailer_lock = threading.Lock()
        self.notifier = Notifier(
            Outbox(store, [url.get_secret_value() for url in settings.notify.urls]),
            timeout_s=settings.notify.timeout_s,
            retry_max_s=settings.notify.retry_max_s,
            on_result=on_delivery,
        )
        self.tailer = self._tailer(store, put)
        self.finder: MetricFileFinder | None = None
        found_in = discovery(settings, mode, job_started_at)
        if found_in is not None:
            root, since = found_in
            self.finder = MetricFileFinder(
                root,
                self._found,
                since=since,
                is_metric_file=is_metric_file,
                unreadable=unreadable,
                skip=[settings.state_dir],
                poll=settings.tail.poll,
                poll_interval_s=settings.tail.poll_interval_s,
            )
        self.heartbeat: Heartbeat | None = None
        if settings.notify.heartbeat_url is not None:
            from sentinel.notify.heartbeat import Heartbeat  # imports requests: only when used

            self.heartbeat = Heartbeat(
                settings.notify.heartbeat_url.get_secret_value(),
                settings.notify.heartbeat_interval_s,
                healthy,
                store=store,
                timeout_s=settings.notify.timeout_s,
            )

    def _tailer(
        self,
        store: StateStore,
        put: Put,
        *,
        found: bool = False,
    ) -> LogTailer | None:
        """The tailer of the ``--log`` files (and of those ``found``, then added); None
        without any.

        Without, neither its thread nor watchdog's wakes every second for nothing, and
        watchdog is not even imported (a few MiB of RSS).
        """
        settings = self.settings
        if not settings.logs and not found:
            return None
        from sentinel.follow.tailer import LogTailer

        return LogTailer(
            settings.logs,
            lambda path, lines, marks: put(OutputLines(path, lines, time.time(), marks)),
            offsets=store,
            poll=settings.tail.poll,
            poll_interval_s=settings.tail.poll_interval_s,
            max_line_bytes=settings.tail.max_line_bytes,
            batch_s=settings.tail.batch_s,
            look_s=settings.tail.look_s,
            splitting=splitting,
        )

    def pending(self) -> int | None:
        """Messages waiting in the outbox; None when the state dir cannot say (a full disk)."""
        try:
            return self.notifier.outbox.depth()
        except (OSError, sqlite3.Error):
            return None

    def _found(self, path: str, skip: tuple[int, int, int] | None = None) -> None:
        """From the finder's thread: follow a metric file (past ``skip``, the bytes written
        before the run), unless a ``--log`` already does; hand a ``trainer_state.json`` to
        the loop whole (``trainer_state`` event)."""
        if os.path.basename(path) in WHOLE_FILES:
            with open(path, encoding="utf-8", errors="replace") as stream:
                self._put(TrainerStateRead(path, stream.read(), time.time()))
            return
        if _configured(path, self.settings.logs):
            return
        with self._tailer_lock:
            tailer = self.tailer
            if tailer is None:
                tailer = self._tailer(self._store, self._put, found=True)
                assert tailer is not None
                tailer.add(path, skip)
                tailer.start()
                self.tailer = tailer
            else:
                tailer.add(path, skip)

    @property
    def alive(self) -> bool:
        """No worker whose death would leave sentinel blind has died."""
        tailer = self.tailer
        return (tailer is None or tailer.running) and (self.finder is None or self.finder.running)

    def start(self) -> None:
        self.notifier.start()
        if self.tailer is not None:
            self.tailer.start()
        if self.finder is not None:
            self.finder.start()
        if self.heartbeat is not None:
            self.heartbeat.start()

    def stop_reading(self) -> None:
        """Stop what feeds the loop (the heartbeat too: sentinel is ending)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.finder is not None:
            self.finder.stop()  # first: it may make or feed the tailer
        if self.tailer is not None:
            self.tailer.stop()

    def stop_notifying(self, drain_s: float) -> None:
        """Deliver what is pending for up to ``drain_s``, then stop."""
        self.notifier.stop(drain_s=drain_s)


def _configured(path: str, patterns: list[str]) -> bool:
    """Whether a ``--log`` path or glob names ``path`` (the same file, however spelled)."""
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        named = glob.glob(expanded, recursive=True) if glob.has_magic(expanded) else [expanded]
        for other in named:
            try:
                if os.path.samefile(other, path):
                    return True
            except OSError:
                continue
    return False


def discovery(
    settings: Settings, mode: str, job_started_at: float | None = None
) -> tuple[str, float] | None:
    """The folder whose metric files are found and followed (``[tail] discover``), and the
    time since which a file must have been written to count; None: no finding.

    ``run``: the job's working directory (sentinel's own) unless ``discover_dir`` says,
    files written from now on (the job starts now). ``watch``: only ``discover_dir``, since
    the job it attaches to may run elsewhere, and files written in the last
    ``WATCH_RECENT_S`` (a running job's files may be held open, unseen until written), and
    not before the job found running began (``job_started_at``, less a second of the
    clocks' grain): a file last written before it is an earlier run's, whose NaN would
    stop a healthy job.
    """
    tail = settings.tail
    if not tail.discover:
        return None
    now = time.time()
    if mode == "watch":
        if tail.discover_dir is None:
            return None
        since = now - WATCH_RECENT_S
        if job_started_at is not None:
            since = max(since, job_started_at - STARTED_GRAIN_S)
        return str(tail.discover_dir), since
    return str(tail.discover_dir or os.getcwd()), now
