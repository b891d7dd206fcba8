"""Tail log files the way ``tail -F`` does, with offsets that survive a restart.

A :class:`FileFollower` follows one path, not one inode: it finishes a file
that was renamed away, reads its replacement from the start, and notices
truncation (copytruncate, ``>``) and symlink retargeting. A :class:`LogTailer`
runs followers for paths and globs on its own thread. watchdog events only wake
that thread; the truth is always re-read with ``stat`` and ``pread``, because
events can be dropped (queue overflow) or never come (NFS, some overlays).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from watchdog import events
from watchdog.events import FileSystemEvent
from watchdog.observers import Observer
from watchdog.observers.polling import PollingObserver

from sentinel.sources.lines import LineSplitter
from sentinel.state import FileOffset

logger = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
#: How many bytes fingerprint a file's head and the bytes before an offset.
FINGERPRINT_BYTES = 4096
#: A read stops after about this much text, so a huge backlog is handed on in batches.
BATCH_TEXT_BYTES = 4 * 1024 * 1024
#: A globbed file gone this long is dropped (a rotated-away one may still be written first).
VANISHED_GRACE_S = 10.0


class OffsetStore(Protocol):
    """Where followers keep how far they read (``StateStore`` is one)."""

    def load_offset(self, dev: int, inode: int) -> FileOffset | None: ...

    def save_offset(self, record: FileOffset) -> None: ...


def _fingerprint(data: bytes) -> str:
    """``"<len>:<hex>"``: the length makes a short head comparable with a longer file."""
    return f"{len(data)}:{hashlib.blake2b(data, digest_size=16).hexdigest()}"


def _matches(fd: int, fingerprint: str, end: int | None) -> bool:
    """Whether the bytes before ``end`` (the head when None) have this fingerprint."""
    length_text, _, _ = fingerprint.partition(":")
    try:
        length = int(length_text)
    except ValueError:
        return False
    start = 0 if end is None else end - length
    if start < 0:
        return False
    return _fingerprint(os.pread(fd, length, start)) == fingerprint


class FileFollower:
    """Follows one path (not one inode) through rotation, truncation and retargeting.

    ``read`` returns new complete lines; ``commit`` then persists how far they
    went, so a caller commits only once the lines are really handed on.
    """

    def __init__(
        self, path: Path, *, offsets: OffsetStore | None = None, max_line_bytes: int = 1 << 20
    ) -> None:
        self.path = path
        self._offsets = offsets
        self._max_line_bytes = max_line_bytes
        self._splitter = LineSplitter(max_line_bytes)
        self._fd: int | None = None
        self._dev = 0
        self._inode = 0
        self._position = 0
        # The bytes just before _position: a file whose bytes there changed was
        # truncated and regrew before we looked.
        self._tail = b""
        self._head_hash = ""
        self._resume_checked = False
        self._backlog = False
        self._unsaved: list[FileOffset] = []
        self._last_error = ""

    @property
    def has_backlog(self) -> bool:
        """True when the last ``read`` stopped early on a large backlog; read again."""
        return self._backlog

    @property
    def offset(self) -> int:
        """End of the last complete line read from the current file."""
        return self._position - self._splitter.pending_bytes

    def read(self) -> list[str]:
        """Complete lines new since the last call; a missing file gives none, not an error."""
        lines: list[str] = []
        self._backlog = False
        try:
            self._read_into(lines)
        except OSError as exc:
            # Once per distinct error: a file we may not read must not flood the log.
            if str(exc) != self._last_error:
                logger.warning("cannot read %s: %s", self.path, exc)
            self._last_error = str(exc)
        else:
            self._last_error = ""
        return lines

    def commit(self) -> None:
        """Persist the offsets of everything ``read`` returned so far."""
        if self._offsets is None:
            self._unsaved.clear()
            return
        while self._unsaved:
            try:
                self._offsets.save_offset(self._unsaved[0])
            except Exception:
                logger.exception("cannot save the offset of %s", self.path)
                return
            del self._unsaved[0]

    def finish(self) -> list[str]:
        """The rest of the current file, its unfinished last line included; then close it."""
        lines = self.read() if self._fd is not None else []
        if self._fd is not None and not self._backlog:
            lines.extend(self._splitter.flush())
            self._remember_offset()
            self.close()
        return lines

    def close(self) -> None:
        """Close the followed file's descriptor."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _read_into(self, lines: list[str]) -> None:
        try:
            path_stat: os.stat_result | None = os.stat(self.path)
        except OSError:
            path_stat = None
        if self._fd is not None:
            same = path_stat is not None and (path_stat.st_dev, path_stat.st_ino) == (
                self._dev,
                self._inode,
            )
            if same:
                self._check_truncated()
                self._drain(lines)
                return
            # Renamed, deleted or retargeted: what the old file still holds comes first.
            self._drain(lines)
            if path_stat is None or self._backlog:
                # Keep the old file open: a writer may still append to it until
                # the new file appears (rename, then reopen).
                return
            lines.extend(self._splitter.flush())
            self._remember_offset()
            logger.info("%s was replaced; reading the new file from the start", self.path)
            self.close()
        if path_stat is None:
            return
        self._open()
        self._drain(lines)

    def _open(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        opened = os.fstat(fd)
        self._fd, self._dev, self._inode = fd, opened.st_dev, opened.st_ino
        self._splitter = LineSplitter(self._max_line_bytes)
        self._position, self._tail, self._head_hash = 0, b"", ""
        # Only the first file of this follower may be the one an earlier run was
        # reading; any later one appeared while we watched and starts at 0.
        if not self._resume_checked:
            self._resume_checked = True
            self._resume(fd, opened.st_size)

    def _resume(self, fd: int, size: int) -> None:
        if self._offsets is None:
            return
        try:
            saved = self._offsets.load_offset(self._dev, self._inode)
        except Exception:
            logger.exception("cannot load the offset of %s", self.path)
            return
        if saved is None or saved.offset > size:
            return
        if _matches(fd, saved.head_hash, None) and _matches(fd, saved.tail_hash, saved.offset):
            self._position = saved.offset
            self._tail = os.pread(fd, FINGERPRINT_BYTES, max(0, saved.offset - FINGERPRINT_BYTES))
            logger.debug("resuming %s at byte %d", self.path, saved.offset)
        else:
            logger.info("%s is not the file read before (inode reused); reading from 0", self.path)

    def _check_truncated(self) -> None:
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < self._position:
            reason = "shrank"
        elif size > self._position and self._tail:
            before = os.pread(self._fd, len(self._tail), self._position - len(self._tail))
            if before == self._tail:
                return
            reason = "was rewritten"
        else:
            return
        logger.info("%s %s (truncated); reading from the start", self.path, reason)
        self._splitter = LineSplitter(self._max_line_bytes)
        self._position, self._tail, self._head_hash = 0, b"", ""

    def _drain(self, lines: list[str]) -> None:
        """Read the open file to its end (or a batch's worth of text)."""
        assert self._fd is not None
        start_offset = self.offset
        text_bytes = 0
        while True:
            # pread: the position is ours, whatever the descriptor's says.
            chunk = os.pread(self._fd, CHUNK_BYTES, self._position)
            if not chunk:
                break
            self._position += len(chunk)
            self._tail = (
                chunk[-FINGERPRINT_BYTES:]
                if len(chunk) >= FINGERPRINT_BYTES
                else (self._tail + chunk)[-FINGERPRINT_BYTES:]
            )
            new_lines = self._splitter.feed(chunk)
            lines.extend(new_lines)
            text_bytes += sum(len(line) for line in new_lines)
            if text_bytes >= BATCH_TEXT_BYTES:
                self._backlog = True
                break
        if self.offset != start_offset:
            self._remember_offset()

    def _remember_offset(self) -> None:
        """Queue a record of the current offset for ``commit``."""
        if self._offsets is None or self._fd is None:
            return
        offset = self.offset
        if not self._head_hash.startswith(f"{FINGERPRINT_BYTES}:"):
            self._head_hash = _fingerprint(
                os.pread(self._fd, min(self._position, FINGERPRINT_BYTES), 0)
            )
        tail_length = min(offset, FINGERPRINT_BYTES)
        record = FileOffset(
            path=str(self.path),
            dev=self._dev,
            inode=self._inode,
            offset=offset,
            head_hash=self._head_hash,
            tail_hash=_fingerprint(os.pread(self._fd, tail_length, offset - tail_length)),
        )
        if self._unsaved and (self._unsaved[-1].dev, self._unsaved[-1].inode) == (
            record.dev,
            record.inode,
        ):
            self._unsaved[-1] = record
        else:
            self._unsaved.append(record)


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


class LogTailer:
    """Follows paths and globs (files may not exist yet); delivers lines from its own thread.

    ``on_lines(path, lines)`` gets each batch in file order; offsets are
    committed only after it returns. Events from watchdog only wake the thread,
    which also re-checks every ``poll_interval_s`` because events can be missed.
    """

    def __init__(
        self,
        patterns: Sequence[str],
        on_lines: Callable[[str, list[str]], None],
        *,
        offsets: OffsetStore | None = None,
        poll: bool = False,
        poll_interval_s: float = 1.0,
        max_line_bytes: int = 1 << 20,
    ) -> None:
        self._patterns = [os.path.expanduser(pattern) for pattern in patterns]
        self._on_lines = on_lines
        self._offsets = offsets
        self._poll_interval_s = poll_interval_s
        self._max_line_bytes = max_line_bytes
        self._mode = "polling" if poll else "inotify"
        self._followers: dict[str, FileFollower] = {}
        self._files: tuple[str, ...] = ()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self._watched: set[tuple[str, bool]] = set()
        self._globbed: set[str] = set()
        self._missing_since: dict[str, float] = {}

    @property
    def mode(self) -> str:
        """``"inotify"`` (woken by file events) or ``"polling"``."""
        return self._mode

    @property
    def files(self) -> list[str]:
        """Paths currently followed."""
        return list(self._files)

    def start(self) -> None:
        """Read every matching file once, then follow them on a thread."""
        if self._mode == "inotify":
            self._start_observer()
        # Watches first, then the first read: nothing written in between is missed.
        self._cycle()
        self._thread = threading.Thread(target=self._run, name="sentinel-log-tailer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and the observer, then read what was appended before stop."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._stop_observer()
        self._cycle()
        for follower in self._followers.values():
            follower.close()
        self._followers.clear()
        self._files = ()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._poll_interval_s)
            # Cleared before reading, so a write during the read wakes us again.
            self._wake.clear()
            if self._stopping.is_set():
                return
            self._cycle()

    def _cycle(self) -> None:
        """Find files, read each to its end and hand the lines on."""
        try:
            self._rescan()
        except Exception:
            logger.exception("cannot scan the log patterns %s", self._patterns)
        for path, follower in list(self._followers.items()):
            try:
                self._pump(path, follower)
                if self._vanished(path):
                    self._deliver(path, follower.finish())
                    follower.commit()
                    follower.close()
                    del self._followers[path]
                    self._globbed.discard(path)
                    self._missing_since.pop(path, None)
            except Exception:
                logger.exception("cannot follow %s", path)
        self._files = tuple(self._followers)

    def _vanished(self, path: str) -> bool:
        """Whether a globbed file has been gone long enough to stop following it.

        The grace keeps the old file open through a rename rotation, when its
        writer may still append to it until the new file appears.
        """
        if path not in self._globbed or os.path.lexists(path):
            self._missing_since.pop(path, None)
            return False
        since = self._missing_since.setdefault(path, time.monotonic())
        return time.monotonic() - since >= VANISHED_GRACE_S

    def _pump(self, path: str, follower: FileFollower) -> None:
        while True:
            self._deliver(path, follower.read())
            follower.commit()
            if not follower.has_backlog:
                return

    def _deliver(self, path: str, lines: list[str]) -> None:
        if not lines:
            return
        try:
            self._on_lines(path, lines)
        except Exception:
            logger.exception("on_lines failed for %d lines of %s", len(lines), path)

    def _rescan(self) -> None:
        for pattern in self._patterns:
            globbed = glob.has_magic(pattern)
            paths = sorted(glob.glob(pattern, recursive=True)) if globbed else [pattern]
            for path in paths:
                if path not in self._followers and not os.path.isdir(path):
                    if globbed:
                        self._globbed.add(path)
                    self._followers[path] = FileFollower(
                        Path(path), offsets=self._offsets, max_line_bytes=self._max_line_bytes
                    )
        self._files = tuple(self._followers)
        if self._observer is not None:
            self._update_watches()

    # -- wake-ups -----------------------------------------------------------

    def _start_observer(self) -> None:
        observer = Observer()
        if isinstance(observer, PollingObserver):
            # watchdog's own polling would only duplicate ours.
            self._fall_back("no native file events on this platform")
            return
        self._observer = observer
        try:
            self._update_watches()
            if self._observer is not None:
                observer.start()
        except OSError as exc:
            self._fall_back(str(exc))

    def _update_watches(self) -> None:
        """Watch the directory of every pattern and of every symlink's target."""
        wanted = {_watch_dir(pattern) for pattern in self._patterns}
        for path in self._files:
            real = os.path.realpath(path)
            if real != os.path.abspath(path):
                wanted.add((os.path.dirname(real), False))
        for directory, recursive in wanted:
            watch = (_existing_ancestor(directory), recursive)
            if watch in self._watched:
                continue
            try:
                self._observer.schedule(
                    _WakeHandler(self._wake),
                    watch[0],
                    recursive=watch[1],
                    event_filter=_WAKE_EVENTS,
                )
            except OSError as exc:
                self._fall_back(str(exc))
                return
            self._watched.add(watch)
            # Something may have appeared before the watch was in place: look again.
            self._wake.set()

    def _fall_back(self, reason: str) -> None:
        logger.warning(
            "file events unavailable (%s); polling the logs every %g s",
            reason,
            self._poll_interval_s,
        )
        self._mode = "polling"
        self._stop_observer()

    def _stop_observer(self) -> None:
        observer, self._observer = self._observer, None
        if observer is None:
            return
        with contextlib.suppress(Exception):
            observer.stop()
            if observer.is_alive():
                observer.join()


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


class _WakeHandler:
    """A watchdog handler that only wakes the tailer; the tailer reads for itself."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake

    def dispatch(self, event: object) -> None:
        self._wake.set()
