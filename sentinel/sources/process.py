"""The job as a source: one attempt of it, started in its own session, its output captured.

The job's stdout and stderr are passed through to sentinel's own, byte for
byte, and also split into lines for the engine, so a job that prints its
metrics needs no ``--log``. The exit code is reported only after both pipes
are drained: the last lines (the traceback) are what a crash is classified from.

Output is gathered, not handled a line at a time. The first output after a
quiet spell is passed through and handed on at once; after that a pump looks
at the pipe only every ``batch_s / GATHER_SLICES`` and hands on what came once
per ``batch_s``, for as long as every look finds output: a job printing a
hundred lines a second wakes sentinel's threads a few times per window, not
twice per line (on a VM a wake-up, and the cold caches the code then runs in,
cost more than the line's own work). The first look that finds nothing ends
the gathering, so a line after a quiet spell of ``batch_s`` goes at once. The
pipes are enlarged where the platform allows, so that the job does not block on
a full pipe while a pump gathers.

A flood is never gathered: a pump gathers only while the output's recent rate
(bytes read, decaying with a half-life of a second) would not fill a look's
worth (``_SMALL_READ``) in a slice; otherwise it reads on at once, so a job that
is flooding, even one a moment slower, never waits on a full pipe. A read takes
what the pipe holds (up to ``PIPE_BYTES``), so under a flood a read, its
passthrough and its split cost a few hand-overs of the interpreter's lock per
mebibyte, not per 64 KiB: a reader waiting on that lock while the loop parses
is what would fill the pipe and block the job.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import BinaryIO

from sentinel.lines import BATCH_S, GATHER_SLICES, LineSplitter
from sentinel.sources.identity import ProcessIdentity

log = logging.getLogger(__name__)

OnLines = Callable[[str, list[str], float], None]

#: The pipe capacity asked for (Linux ``F_SETPIPE_SZ``; 64 KiB otherwise): room for what
#: the job writes while a pump gathers, so the job is never held up by it.
PIPE_BYTES = 1 << 20
#: The most one read takes: all the pipe holds.
_READ_BYTES = PIPE_BYTES
#: How fast what was read is forgotten when the output's rate is judged.
RATE_HALF_LIFE_S = 1.0
#: A look that finds this much ends the gathering (output is coming fast); a read this
#: small, at a rate that would not fill it in a slice, starts one.
_SMALL_READ = 32768


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell would report it (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


class JobProcess:
    """One attempt of the job."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        on_lines: OnLines,
        on_exit: Callable[[int], None],
        stdout: BinaryIO | None,
        stderr: BinaryIO | None,
        max_line_bytes: int = 1 << 20,
        batch_s: float = BATCH_S,
    ) -> None:
        """``batch_s``: how long to gather output after a read (0: hand on every read); the
        most a line (and its passthrough) waits while the job is printing fast."""
        self.argv = list(argv)
        self._env = dict(env)
        self._on_lines = on_lines
        self._on_exit = on_exit
        self._passthrough = {"stdout": stdout, "stderr": stderr}
        self._max_line_bytes = max_line_bytes
        self._batch_s = batch_s
        self._popen: subprocess.Popen[bytes] | None = None
        self.identity: ProcessIdentity | None = None
        self.started_at = 0.0
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        assert self._popen is not None
        return self._popen.pid

    def start(self) -> None:
        """Launch the job in a new session (its own process group) and start the readers."""
        self._popen = subprocess.Popen(
            self.argv,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.started_at = time.time()
        try:
            self.identity = ProcessIdentity.of(self._popen.pid)
        except ProcessLookupError:
            # Exited before we looked: nothing to signal, the waiter reports the exit.
            self.identity = None
        readers = []
        for name, pipe in (("stdout", self._popen.stdout), ("stderr", self._popen.stderr)):
            assert pipe is not None
            _enlarge(pipe.fileno())
            readers.append(
                threading.Thread(
                    target=self._read, args=(name, pipe), name=f"job-{name}", daemon=True
                )
            )
        for reader in readers:
            reader.start()
        threading.Thread(target=self._wait, args=(readers,), name="job-wait", daemon=True).start()

    def wait(self, timeout_s: float) -> bool:
        """True if the job has exited within ``timeout_s`` (the parent reaps it here)."""
        assert self._popen is not None
        try:
            self._popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _read(self, name: str, pipe: BinaryIO) -> None:
        splitter = LineSplitter(self._max_line_bytes)
        fd = pipe.fileno()
        ready = select.poll()
        ready.register(fd, select.POLLIN)
        slice_s = self._batch_s / GATHER_SLICES
        rate = _Rate()
        try:
            # Blocks until the job writes: the first output after a quiet spell goes at once.
            while chunk := os.read(fd, _READ_BYTES):
                rate.add(len(chunk))
                self._hand_on(name, splitter, chunk)
                # Output trickles: let the next lines gather (see the module).
                if rate.per_s() * slice_s < _SMALL_READ:
                    gathered = self._gather(name, fd, ready, splitter)
                    if gathered is None:
                        break  # the job closed the pipe meanwhile
                    rate.add(gathered)
            rest = splitter.flush()
            if rest:
                self._on_lines(name, rest, time.time())
        except Exception:
            log.exception("reading the job's %s failed", name)
        finally:
            pipe.close()

    def _gather(self, name: str, fd: int, ready: select.poll, splitter: LineSplitter) -> int | None:
        """Look at the pipe (``ready`` polls it) every slice of the window and hand on what
        came once a window, while every look finds output; the bytes read, None if the
        pipe closed."""
        slice_s = self._batch_s / GATHER_SLICES
        held: list[bytes] = []
        count = 0
        while True:
            for _ in range(GATHER_SLICES):
                time.sleep(slice_s)
                chunk = os.read(fd, _READ_BYTES) if ready.poll(0) else None
                if chunk == b"":  # ready with nothing to read: the job closed the pipe
                    self._hand_on(name, splitter, b"".join(held))
                    return None
                if chunk is not None:
                    held.append(chunk)
                    count += len(chunk)
                if chunk is None or len(chunk) >= _SMALL_READ:
                    # A quiet slice: the next output goes at once. Or more than a window
                    # holds: read on without waiting.
                    self._hand_on(name, splitter, b"".join(held))
                    return count
            self._hand_on(name, splitter, b"".join(held))
            held = []

    def _hand_on(self, name: str, splitter: LineSplitter, data: bytes) -> None:
        """Pass ``data`` through and hand its complete lines on."""
        if not data:
            return
        passthrough = self._passthrough[name]
        if passthrough is not None:
            self._pass(passthrough, data)
        lines = splitter.feed(data)
        if lines:
            self._on_lines(name, lines, time.time())

    @staticmethod
    def _pass(stream: BinaryIO, chunk: bytes) -> None:
        try:
            stream.write(chunk)
            stream.flush()
        except (OSError, ValueError):
            # Our own terminal went away; keep watching the job regardless.
            pass

    def _wait(self, readers: list[threading.Thread]) -> None:
        assert self._popen is not None
        self.returncode = self._popen.wait()
        for reader in readers:
            # A grandchild may hold the pipes open after the job exits: do not wait forever.
            reader.join(timeout=5.0)
        self._on_exit(self.returncode)


class _Rate:
    """How fast output came lately: the bytes read, halved every ``RATE_HALF_LIFE_S``."""

    def __init__(self) -> None:
        self._bytes = 0.0
        self._at = time.monotonic()

    def add(self, count: int) -> None:
        now = time.monotonic()
        self._bytes = self._bytes * 0.5 ** ((now - self._at) / RATE_HALF_LIFE_S) + count
        self._at = now

    def per_s(self) -> float:
        """Bytes a second (a steady rate ``r`` gives ``r``)."""
        return self._bytes * math.log(2) / RATE_HALF_LIFE_S


def _enlarge(fd: int) -> None:
    """Ask for a ``PIPE_BYTES`` pipe; keep the default where that is not allowed."""
    if sys.platform != "linux":
        return
    import fcntl

    # Over the system's pipe-max-size, or the user's pipe quota spent: EPERM; harmless.
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
