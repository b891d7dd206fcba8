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
"""

from __future__ import annotations

import contextlib
import logging
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

_CHUNK = 65536
#: After a read this much smaller than a chunk, the pipe is (nearly) empty: gather.
_SMALL_READ = _CHUNK // 2
#: The pipe capacity asked for (Linux ``F_SETPIPE_SZ``; 64 KiB otherwise): room for what
#: the job writes while a pump gathers, so the job is never held up by it.
PIPE_BYTES = 1 << 20


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
        try:
            # Blocks until the job writes: the first output after a quiet spell goes at once.
            while chunk := os.read(fd, _CHUNK):
                self._hand_on(name, splitter, chunk)
                # The pipe is drained: let the next lines gather (see the module).
                gathers = self._batch_s > 0 and len(chunk) < _SMALL_READ
                if gathers and not self._gather(name, fd, ready, splitter):
                    break  # the job closed the pipe meanwhile
            rest = splitter.flush()
            if rest:
                self._on_lines(name, rest, time.time())
        except Exception:
            log.exception("reading the job's %s failed", name)
        finally:
            pipe.close()

    def _gather(self, name: str, fd: int, ready: select.poll, splitter: LineSplitter) -> bool:
        """Look at the pipe (``ready`` polls it) every slice of the window and hand on what
        came once a window, while every look finds output; False if the pipe closed."""
        slice_s = self._batch_s / GATHER_SLICES
        held: list[bytes] = []
        while True:
            for _ in range(GATHER_SLICES):
                time.sleep(slice_s)
                chunk = os.read(fd, _CHUNK) if ready.poll(0) else None
                if chunk == b"":  # ready with nothing to read: the job closed the pipe
                    self._hand_on(name, splitter, b"".join(held))
                    return False
                if chunk is not None:
                    held.append(chunk)
                if chunk is None or len(chunk) >= _SMALL_READ:
                    # A quiet slice: the next output goes at once. Or more than a window
                    # holds: read on without waiting.
                    self._hand_on(name, splitter, b"".join(held))
                    return True
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


def _enlarge(fd: int) -> None:
    """Ask for a ``PIPE_BYTES`` pipe; keep the default where that is not allowed."""
    if sys.platform != "linux":
        return
    import fcntl

    # Over the system's pipe-max-size, or the user's pipe quota spent: EPERM; harmless.
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
