"""Run :class:`FileFollower` instances for paths and globs on one thread, like ``tail -F``.

A :class:`LogTailer` finds the files its patterns match (files may not exist
yet), reads each to its end and hands the lines on. Events only wake its
thread (``sentinel.follow.tail_wakeups``); the truth is always re-read with
``stat`` and ``pread``, because events can be dropped (queue overflow) or never
come (NFS, some overlays).

Lines are gathered like the job's own output (``sentinel.follow.gathering``):
the first after a quiet spell is read and handed on at once; while the log keeps
growing the thread reads the files once per ``batch_s`` window and hands their lines
on, and in between only looks at the new bytes, at most every ``LOOK_S``: a look
that may hold a non-finite value or a traceback reads and hands on at once. A log
written a line at a time then costs a hand-over per window, not per line, a look
costs a ``pread`` (not a ``stat``, the checks for rotation and truncation, the
split), and a NaN waits at most a look, not a window. Each look also notes when the
bytes it found were written at the earliest (the look before it), so a line handed on a
window late still says when it was written, to a look (``Marks``).
"""

from __future__ import annotations

import glob
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sentinel.follow.gathering import LOOK_BYTES, LOOK_S, Gathering, ends_a_line, may_be_urgent
from sentinel.follow.logfile import FileFollower, NewSplitter, OffsetStore, plain_lines
from sentinel.follow.tail_wakeups import TailWakeups
from sentinel.model.records import Marks
from sentinel.parsing.lines import BATCH_S

logger = logging.getLogger(__name__)

#: A globbed file gone this long is dropped (a rotated-away one may still be written first).
VANISHED_GRACE_S = 10.0
#: How often read offsets are saved (and at stop): a restart of sentinel after a crash
#: reads at most this much of the logs again, where saving every batch was a SQLite
#: transaction twenty times a second.
COMMIT_INTERVAL_S = 1.0
#: A ``--log`` that matches no file this long after the start is named once: a typo in its
#: path leaves the run unwatched by that file, which nothing else would say.
MISSING_WARN_S = 60.0


class LogTailer:
    """Follows paths and globs (files may not exist yet); delivers lines from its own thread.

    ``on_lines(path, lines, marks)`` gets each batch in file order, with when its lines
    were written at the earliest (``Marks``: by the look that first saw them); offsets are
    committed only after it returns, at most every ``COMMIT_INTERVAL_S`` and at
    ``stop``. Events only wake the thread, which also re-checks every
    ``poll_interval_s`` because events can be missed. After a read that found
    lines it gathers for ``batch_s`` windows while lines keep coming (0: never),
    looking at the new bytes every ``look_s`` for a NaN that cannot wait.
    ``splitting(path)``: what splits the files at a path (``FileFollower``'s
    ``new_splitter``; by default each is a plain log).
    """

    def __init__(
        self,
        patterns: Sequence[str],
        on_lines: Callable[[str, list[str], Marks], None],
        *,
        offsets: OffsetStore | None = None,
        poll: bool = False,
        poll_interval_s: float = 1.0,
        max_line_bytes: int = 1 << 20,
        batch_s: float = BATCH_S,
        look_s: float = LOOK_S,
        splitting: Callable[[Path], NewSplitter] = plain_lines,
        missing_warn_s: float = MISSING_WARN_S,
    ) -> None:
        self._splitting = splitting
        self._missing_warn_s = missing_warn_s
        #: When the tailer started (monotonic), for ``missing_warn_s``.
        self._started_at: float | None = None
        #: Patterns that matched a file at some point, and those named as never matching.
        self._ever_found: set[str] = set()
        self._named_missing: set[str] = set()
        self._patterns = [os.path.expanduser(pattern) for pattern in patterns]
        #: The patterns the user gave (``add`` adds found files to ``_patterns``).
        self._given = tuple(self._patterns)
        self._on_lines = on_lines
        self._offsets = offsets
        self._poll_interval_s = poll_interval_s
        self._max_line_bytes = max_line_bytes
        self._batch_s = batch_s
        self._look_s = look_s
        #: Lines read and not yet handed on, by path in the order first read, and when
        #: they were written at the earliest (``Marks``, as lists).
        self._held: dict[str, list[str]] = {}
        self._held_marks: dict[str, list[tuple[int, float]]] = {}
        #: Whether the last ``_cycle`` read any line.
        self._read_any = False
        #: Whether a look found bytes not read yet: they are read at the window's end.
        self._unread = False
        #: A look found something urgent in a line not ended yet: its end is read at once.
        self._urgent_line = False
        #: What is held goes at the next look, the window or not (``hand_on_soon``).
        self._soon = False
        self._commit_due_s = 0.0
        # Directories are looked at again only after a directory event (or a quiet
        # poll interval), not after every write to a followed file.
        self._dirs_changed = True
        self._followers: dict[str, FileFollower] = {}
        self._files: tuple[str, ...] = ()
        self._wakeups = TailWakeups(poll=poll, poll_interval_s=poll_interval_s)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._globbed: set[str] = set()
        #: Paths given to ``add``: dropped like globbed ones once gone.
        self._added: set[str] = set()
        #: Bytes of an added file written before the run, by path (``add``).
        self._skips: dict[str, tuple[int, int, int]] = {}
        self._missing_since: dict[str, float] = {}

    @property
    def mode(self) -> str:
        """``"inotify"`` (woken by file events) or ``"polling"``."""
        return self._wakeups.mode

    @property
    def files(self) -> list[str]:
        """Paths currently followed."""
        return list(self._files)

    @property
    def running(self) -> bool:
        """Whether the following thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Read every matching file once, then follow them on a thread."""
        self._wakeups.start(self._patterns)
        self._started_at = time.monotonic()
        # Watches first, then the first read: nothing written in between is missed.
        self._cycle()
        self._flush()
        self._thread = threading.Thread(target=self._run, name="sentinel-log-tailer", daemon=True)
        self._thread.start()

    def add(self, path: str, skip: tuple[int, int, int] | None = None) -> None:
        """Follow ``path`` too, from its start (any thread; a path followed already: nothing).

        ``skip``: ``(device, inode, offset)``, bytes of that file written before the run
        (``FileFollower``). Like a globbed file, it is dropped once gone ``VANISHED_GRACE_S``.
        """
        pattern = glob.escape(path) if glob.has_magic(path) else path
        if pattern in self._patterns:
            return
        if skip is not None:
            self._skips[path] = skip
        self._added.add(path)
        # A new list, not an append: the tailer's thread may be iterating the old one.
        self._patterns = [*self._patterns, pattern]
        self._wakeups.wake.set()

    def hand_on_soon(self) -> None:
        """Hand on what the files hold at the next look, not at the window's end (any
        thread): the job ended, and its last lines are wanted now."""
        self._soon = True
        self._wakeups.wake.set()

    def stop(self) -> None:
        """Stop the thread and the observer, then read what was appended before stop."""
        self._stopping.set()
        self._wakeups.wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._wakeups.stop()
        self._cycle()
        self._flush()
        for follower in self._followers.values():
            follower.close()
        self._followers.clear()
        self._files = ()
        self._wakeups.close()

    def _run(self) -> None:
        gathering = Gathering(self._batch_s, self._look_s)
        while not self._stopping.is_set():
            watches = self._wakeups.file_watches
            waited = [self._wakeups.wake.fileno()]
            if watches is not None:
                waited.append(watches.fileno())
            timeout_s = self._poll_interval_s
            if self._unread:  # until they are due
                timeout_s = max(0.0, min(timeout_s, gathering.due() - time.monotonic()))
            readable, _, _ = select.select(waited, [], [], timeout_s)
            quiet = not readable and timeout_s == self._poll_interval_s
            # Kept until a rescan has looked: a directory event whose turn finds nothing to
            # read yet (a log created empty) must still get the new file its watch.
            if quiet or waited[0] in readable:
                self._dirs_changed = True
                # Cleared before reading, so a write during the read wakes us again.
                self._wakeups.wake.clear()
            if watches is not None and watches.fileno() in readable:
                watches.drain()
            if self._stopping.is_set():
                return
            if not self._look(gathering):
                continue  # nothing new inside the window: wait for a write or its end
            self._cycle()
            if self._held:
                self._flush()
                gathering.handed_on(time.monotonic())
                self._urgent_line = False
            self._unread = False
            if self._read_any and gathering.look_s:
                # Let the next lines gather; a stop meanwhile wakes the select above.
                time.sleep(gathering.look_s)

    def _look(self, gathering: Gathering) -> bool:
        """Inside the window, look at the new bytes every ``LOOK_S``; True once the lines are
        to be read and handed on (the window ended, or a look found something urgent),
        False when a look found nothing new."""
        while not self._stopping.is_set():
            now_s = time.monotonic()
            if gathering.hand_on_now(False, now_s) or self._soon:
                self._soon = False
                return True
            new = self._peek()
            if not new:
                return False
            self._unread = True
            if self._urgent_line and ends_a_line(new):
                return True  # the end of the urgent line a look found before it was written
            if may_be_urgent(new) and gathering.hand_on_now(True, now_s):
                self._urgent_line = True
                return True
            time.sleep(gathering.look_s)
            if gathering.due() - now_s <= gathering.look_s:
                # The window ended during this look's wait: hand on now, not after a wake-up
                # of its own at the window's end (50 wake-ups a second at 100 lines/s, not 54).
                return True
        return True

    def _peek(self) -> bytes:
        """The bytes appended to the followed files since the last read or look."""
        return b"".join(follower.peek(LOOK_BYTES) for follower in self._followers.values())

    def _cycle(self) -> None:
        """Find files and read each to its end; the lines are held for ``_flush``."""
        self._read_any = False
        try:
            self._rescan()
        except Exception:
            logger.exception("cannot scan the log patterns %s", self._patterns)
        self._name_missing()
        for path, follower in list(self._followers.items()):
            try:
                self._pump(path, follower)
                if self._vanished(path):
                    self._hold(path, follower.finish(), follower.marks)
                    self._flush()  # before its offset is saved for the last time
                    follower.commit()
                    follower.close()
                    del self._followers[path]
                    self._wakeups.unwatch(path)
                    self._globbed.discard(path)
                    self._missing_since.pop(path, None)
            except Exception:
                logger.exception("cannot follow %s", path)
        self._files = tuple(self._followers)

    def _flush(self) -> None:
        """Hand on the held lines, then save the offsets if that is due (or stopping)."""
        held, self._held = self._held, {}
        marks, self._held_marks = self._held_marks, {}
        for path, lines in held.items():
            try:
                self._on_lines(path, lines, tuple(marks.get(path, ())))
            except Exception:
                logger.exception("on_lines failed for %d lines of %s", len(lines), path)
        now_s = time.monotonic()
        if now_s >= self._commit_due_s or self._stopping.is_set():
            self._commit_due_s = now_s + COMMIT_INTERVAL_S
            for follower in self._followers.values():
                follower.commit()

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
            self._hold(path, follower.read(), follower.marks)
            if not follower.has_backlog:
                return
            # A long backlog: hand on each batch of it, and keep what was handed on.
            self._flush()
            follower.commit()

    def _hold(self, path: str, lines: list[str], marks: list[tuple[int, float]]) -> None:
        if lines:
            self._read_any = True
            held = self._held.setdefault(path, [])
            base = len(held)
            self._held_marks.setdefault(path, []).extend(
                (base + index, since) for index, since in marks
            )
            held.extend(lines)

    def _name_missing(self) -> None:
        """Name, once each, the patterns that matched no file ``missing_warn_s`` after the
        start: sentinel goes on looking for them."""
        started = self._started_at
        if started is None or time.monotonic() - started < self._missing_warn_s:
            return
        for pattern in self._given:
            if pattern in self._ever_found or pattern in self._named_missing:
                continue
            self._named_missing.add(pattern)
            logger.warning(
                "--log %s: no such file %g s after the start; is the path right? (sentinel"
                " keeps looking for it; the job's own output is read either way under run)",
                pattern,
                self._missing_warn_s,
            )

    def _rescan(self) -> None:
        followed = self._files
        for pattern in self._patterns:
            globbed = glob.has_magic(pattern)
            paths = sorted(glob.glob(pattern, recursive=True)) if globbed else [pattern]
            if pattern not in self._ever_found and (paths if globbed else os.path.exists(pattern)):
                self._ever_found.add(pattern)
            for path in paths:
                if path not in self._followers and not os.path.isdir(path):
                    if globbed or path in self._added:
                        self._globbed.add(path)
                    self._followers[path] = FileFollower(
                        Path(path),
                        offsets=self._offsets,
                        max_line_bytes=self._max_line_bytes,
                        skip=self._skips.get(path),
                        new_splitter=self._splitting(Path(path)),
                    )
        self._files = tuple(self._followers)
        # A path names another file only after a directory event: look only then.
        if not self._dirs_changed and self._files == followed:
            return
        self._dirs_changed = False
        self._wakeups.follow(self._patterns, self._files)
