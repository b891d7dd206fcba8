"""What wakes :class:`sentinel.follow.tailer.LogTailer`'s thread: file events, or nothing.

watchdog watches the directories of the tailer's patterns (files that appear, move,
go); on Linux the writes to the followed files wake the thread through their own
inotify watches (``sentinel.follow.inotify``), so no thread of watchdog's wakes for
each line. Without native file events the tailer polls (``mode`` says which). Events
only wake the thread: the tailer re-reads the truth with ``stat`` and ``pread``.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from watchdog import events
from watchdog.events import FileSystemEvent
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from sentinel.follow.inotify import FileWatches

logger = logging.getLogger(__name__)


def _watch_dir(pattern: str) -> tuple[str, bool]:
    """The directory to watch for ``pattern`` and whether to watch it recursively."""
    parts = Path(pattern).parts
    fixed: list[str] = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    directory = os.path.join(*fixed) if fixed else "."
    return directory, "**" in pattern or len(fixed) < len(parts) - 1


def _existing_ancestor(directory: str) -> str:
    """``directory`` or its nearest existing parent: where its creation will show."""
    current = os.path.abspath(directory)
    while not os.path.isdir(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return current


class TailWakeups:
    """The tailer's wake-ups: ``wake`` (any thread sets it; directory events set it too)
    and ``file_watches`` (writes to the followed files), both waited for with ``select``."""

    def __init__(self, *, poll: bool, poll_interval_s: float) -> None:
        self._poll_interval_s = poll_interval_s
        #: ``"inotify"`` (woken by file events) or ``"polling"``.
        self.mode = "polling" if poll else "inotify"
        self.wake = _Wake()
        #: The followed files' own inotify watches; None without (watchdog reports writes).
        self.file_watches: FileWatches | None = None
        self._observer: Any = None
        self._watched: set[tuple[str, bool]] = set()

    def start(self, patterns: Sequence[str]) -> None:
        """Watch the directories of ``patterns`` (in ``"inotify"`` mode; else nothing)."""
        if self.mode != "inotify":
            return
        observer = Observer()
        if isinstance(observer, PollingObserver):
            # watchdog's own polling would only duplicate ours.
            self._fall_back("no native file events on this platform")
            return
        self._observer = observer
        try:
            self.file_watches = FileWatches()
        except OSError as exc:
            logger.debug("no inotify watches on the files (%s): watchdog reports writes", exc)
        try:
            self._update_watches(patterns, ())
            if self._observer is not None:
                observer.start()
        except OSError as exc:
            self._fall_back(str(exc))

    def follow(self, patterns: Sequence[str], files: Sequence[str]) -> None:
        """Watch ``files`` for writes and the directories of ``patterns`` and ``files``."""
        if self.file_watches is not None:
            for path in files:
                self.file_watches.watch(path)
        if self._observer is not None:
            self._update_watches(patterns, files)

    def unwatch(self, path: str) -> None:
        """``path`` is no longer followed."""
        if self.file_watches is not None:
            self.file_watches.unwatch(path)

    def _update_watches(self, patterns: Sequence[str], files: Sequence[str]) -> None:
        """Watch the directory of every pattern and of every symlink's target."""
        wanted = {_watch_dir(pattern) for pattern in patterns}
        for path in files:
            real = os.path.realpath(path)
            if real != os.path.abspath(path):
                wanted.add((os.path.dirname(real), False))
        for directory, recursive in wanted:
            watch = (_existing_ancestor(directory), recursive)
            if watch in self._watched:
                continue
            try:
                self._observer.schedule(
                    _WakeHandler(self.wake),
                    watch[0],
                    recursive=watch[1],
                    # Writes come through the files' own watches where there are.
                    event_filter=_WAKE_EVENTS if self.file_watches is None else _DIR_EVENTS,
                )
            except OSError as exc:
                self._fall_back(str(exc))
                return
            self._watched.add(watch)
            # Something may have appeared before the watch was in place: look again.
            self.wake.set()

    def _fall_back(self, reason: str) -> None:
        logger.warning(
            "file events unavailable (%s); polling the logs every %g s",
            reason,
            self._poll_interval_s,
        )
        self.mode = "polling"
        self.stop()

    def stop(self) -> None:
        """Stop the file events (``wake`` still works, until ``close``)."""
        watches, self.file_watches = self.file_watches, None
        if watches is not None:
            watches.close()
        observer, self._observer = self._observer, None
        if observer is None:
            return
        with contextlib.suppress(Exception):
            observer.stop()
            if observer.is_alive():
                observer.join()

    def close(self) -> None:
        self.wake.close()


#: Events that can mean new bytes or a new file; opens and closes by readers are noise.
_WAKE_EVENTS: list[type[FileSystemEvent]] = [
    events.FileModifiedEvent,
    events.FileCreatedEvent,
    events.FileMovedEvent,
    events.FileDeletedEvent,
    events.DirCreatedEvent,
    events.DirMovedEvent,
    events.DirDeletedEvent,
]


#: The same, but writes to a file (``FileModifiedEvent``): those come through ``FileWatches``.
_DIR_EVENTS = [event for event in _WAKE_EVENTS if event is not events.FileModifiedEvent]


class _Wake:
    """A wake-up any thread can give and the tailer's thread waits for with ``select``."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)

    def fileno(self) -> int:
        return self._read_fd

    def set(self) -> None:
        # A full pipe holds wake-ups enough; a closed one means the tailer has stopped.
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"\0")

    def clear(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._read_fd, 4096):
                pass

    def close(self) -> None:
        fds, self._read_fd, self._write_fd = (self._read_fd, self._write_fd), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)


class _WakeHandler:
    """A watchdog handler that only wakes the tailer; the tailer reads for itself."""

    def __init__(self, wake: _Wake) -> None:
        self._wake = wake

    def dispatch(self, event: object) -> None:
        self._wake.set()
