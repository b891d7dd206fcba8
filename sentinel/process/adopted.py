"""A job that an earlier ``sentinel run`` started and left running when it died, adopted.

The job still writes to its relay (``sentinel.process.relay``), which copies its output
to the attempt's files. This follows those files from where the dead sentinel had read
them, passes the output through and hands its lines on, as ``JobProcess`` does with the
relay's pipes; the end is the relay's end (it exits once the job has and its output is
drained), and the exit status is the one the relay wrote. A relay that is gone while
the job runs leaves nothing to follow: the job's own end is watched then, its status
unknown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from sentinel.follow.inotify import FileWatches
from sentinel.model import terminal
from sentinel.parsing.lines import BATCH_S, GATHER_SLICES, LineSplitter, relay_window
from sentinel.process.identity import ProcessIdentity
from sentinel.process.launched import OnLines
from sentinel.process.pidfd import PinnedProcess, pin
from sentinel.process.relay_copies import STREAM_FILES
from sentinel.process.relayed import JobRecord

log = logging.getLogger(__name__)

#: Without inotify (or a pidfd), how often the files and the relay are looked at.
POLL_S = 0.5
_READ_BYTES = 1 << 20


class AdoptedJob:
    """One attempt of the job, started by an earlier sentinel and found alive."""

    def __init__(
        self,
        record: JobRecord,
        *,
        on_lines: OnLines,
        on_exit: Callable[[int | None], None],
        stdout: BinaryIO | None,
        stderr: BinaryIO | None,
        max_line_bytes: int = 1 << 20,
        batch_s: float = BATCH_S,
    ) -> None:
        self.record = record
        # The job it was, alive or not: signalling checks the identity first (a gone or
        # reused pid is never hit), and a restarted sentinel's memory is matched by it.
        self.identity: ProcessIdentity | None = record.job
        #: The relay was gone already when this sentinel adopted the job: not a failure.
        self.relay_failed = False
        self.started_at = record.started_at
        self._on_lines = on_lines
        self._on_exit = on_exit
        self._passthrough = {"stdout": stdout, "stderr": stderr}
        self._to_terminal = {name: terminal.is_terminal(s) for name, s in self._passthrough.items()}
        self._max_line_bytes = max_line_bytes
        self._batch_s = batch_s
        self._ended = threading.Event()
        self._files: dict[str, int] = {}
        self._splitters = {name: LineSplitter(max_line_bytes) for name in STREAM_FILES}

    @property
    def pid(self) -> int:
        return self.record.job.pid

    def start(self) -> None:
        """Open the files where the dead sentinel had read them, and follow them on a thread."""
        offsets = self.record.read_offsets()
        for name in STREAM_FILES:
            try:
                fd = os.open(self.record.stream_path(name), os.O_RDONLY | os.O_CLOEXEC)
            except OSError as error:
                log.warning("cannot follow the job's %s: %s", name, error)
                continue
            os.lseek(fd, _line_start(fd, offsets[name]), os.SEEK_SET)
            self._files[name] = fd
        relayed = pin(self.record.relay)
        watched = relayed if isinstance(relayed, PinnedProcess) else pin(self.record.job)
        end = watched if isinstance(watched, PinnedProcess) else None
        if end is not None and end.identity == self.record.job:
            log.warning(
                "the job (pid %d) runs without its relay: its output is lost; watching its end",
                self.record.job.pid,
            )
        threading.Thread(target=self._follow, args=(end,), name="adopted-job", daemon=True).start()

    def wait(self, timeout_s: float) -> bool:
        """True once the job has ended (within ``timeout_s``)."""
        return self._ended.wait(timeout_s)

    def _follow(self, end: PinnedProcess | None) -> None:
        try:
            watches: FileWatches | None = FileWatches()
        except OSError:
            watches = None
        poller = select.poll()
        if watches is not None:
            for name in self._files:
                watches.watch(str(self.record.stream_path(name)))
            poller.register(watches.fileno(), select.POLLIN)
        if end is not None and end.fd is not None:
            poller.register(end.fd, select.POLLIN)
        quick = watches is not None and end is not None and end.fd is not None
        try:
            while end is not None and not end.has_exited():
                if self._read_all():
                    # Let output gather: the relay writes its files once a window of its own.
                    time.sleep(relay_window(self._batch_s) / GATHER_SLICES)
                    continue
                poller.poll(-1 if quick else POLL_S * 1000)
                if watches is not None:
                    watches.drain()
            while self._read_all():
                pass
            for name, splitter in self._splitters.items():
                rest = splitter.flush()
                if rest:
                    self._on_lines(name, rest, time.time(), ())
        except Exception:
            log.exception("following the adopted job's output failed")
        finally:
            for fd in self._files.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            if watches is not None:
                watches.close()
            if end is not None:
                end.close()
        returncode = self.record.exit_returncode() if end is not None else None
        if end is not None and end.identity == self.record.job:
            returncode = None  # no relay saw it end
        self._ended.set()
        self._on_exit(returncode)

    def _read_all(self) -> bool:
        """Hand on what is new in every file; whether anything was."""
        found = False
        for name, fd in self._files.items():
            data = os.read(fd, _READ_BYTES)
            if not data:
                continue
            found = True
            passthrough = self._passthrough[name]
            if passthrough is not None:
                with contextlib.suppress(OSError, ValueError):
                    passthrough.write(data)
                    passthrough.flush()
                    if self._to_terminal[name]:
                        terminal.job_wrote(data)
            lines = self._splitters[name].feed(data)
            if lines:
                self._on_lines(name, lines, time.time(), ())  # each read: its own bound
        return found


def _line_start(fd: int, offset: int, lookback: int = 1 << 16) -> int:
    """Where the line ``offset`` falls in starts: a line the dead sentinel had read in
    part, it never parsed."""
    before = os.pread(fd, min(offset, lookback), max(0, offset - lookback))
    end = max(before.rfind(b"\n"), before.rfind(b"\r"))
    if end < 0:
        return offset if offset > lookback else 0
    return offset - len(before) + end + 1
