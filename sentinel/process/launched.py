"""The job as a source: one attempt of it, started in its own session, its output captured.

The job's stdout and stderr are passed through to sentinel's own, byte for
byte, and also split into lines for the engine, so a job that prints its
metrics needs no ``--log``. The exit code is reported only after both pipes
are drained: the last lines (the traceback) are what a crash is classified from.

Output is gathered, not handled a line at a time (``sentinel.follow.gathering``):
what the job writes after a quiet spell is handed on at once, and while it keeps
writing, a pump reads at most every ``LOOK_S`` and hands lines on once per
``batch_s``, unless a read may hold a non-finite value or a traceback, which goes
at once. The pipes are enlarged where the platform allows, so that the job does
not block on a full pipe while a pump gathers. A flood is never gathered: a read
that fills a look's worth is handed on with all the pipe holds (up to
``PIPE_BYTES``) at once, so under a flood a read, its passthrough and its split
cost a few hand-overs of the interpreter's lock per mebibyte, not per 64 KiB: a
reader waiting on that lock while the loop parses is what would fill the pipe and
block the job.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import BinaryIO

from sentinel.follow.gathering import LOOK_S, pump
from sentinel.model import terminal
from sentinel.model.records import Marks
from sentinel.parsing.lines import BATCH_S, Bounds, LineSplitter, relay_window
from sentinel.process.identity import ProcessIdentity
from sentinel.process.relayed import RelayedStart

log = logging.getLogger(__name__)

#: ``(stream, lines, read_at, marks)``: lines of the job's stream read by ``read_at``, and
#: when they were written at the earliest (``Marks``).
OnLines = Callable[[str, list[str], float, Marks], None]

#: The pipe capacity asked for (Linux ``F_SETPIPE_SZ``; 64 KiB otherwise): room for what
#: the job writes while a pump gathers, so the job is never held up by it.
PIPE_BYTES = 1 << 20
#: How often a job whose relay died is looked at, until it ends.
RELAY_GONE_POLL_S = 0.5
#: The most one read of a flood takes: all the pipe holds.
_READ_BYTES = PIPE_BYTES


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
        on_exit: Callable[[int | None], None],
        stdout: BinaryIO | None,
        stderr: BinaryIO | None,
        max_line_bytes: int = 1 << 20,
        batch_s: float = BATCH_S,
        relay: RelayedStart | None = None,
        look_s: float = LOOK_S,
    ) -> None:
        """``batch_s``: how long to gather output after a read (0: hand on every read); the
        most a line (and its passthrough) waits while the job is printing fast. ``look_s``:
        how often a busy pipe is looked at for a NaN (``sentinel.follow.gathering``). ``relay``:
        start the job under a relay (``sentinel.process.relay``) and read its output from it."""
        self.argv = list(argv)
        self._env = dict(env)
        self._on_lines = on_lines
        self._on_exit = on_exit
        self._passthrough = {"stdout": stdout, "stderr": stderr}
        #: Which passthrough is a terminal (whose cursor a log line must not find mid-line).
        self._to_terminal = {name: terminal.is_terminal(s) for name, s in self._passthrough.items()}
        self._max_line_bytes = max_line_bytes
        self._batch_s = batch_s
        self._look_s = look_s
        self._relay = relay
        #: The job's process, or its relay's.
        self._popen: subprocess.Popen[bytes] | None = None
        self.identity: ProcessIdentity | None = None
        self.started_at = 0.0
        self.returncode: int | None = None
        #: The relay died before the job: the job's end is sentinel's failure.
        self.relay_failed = False

    @property
    def pid(self) -> int:
        assert self._popen is not None
        return self._relay.job_pid if self._relay is not None else self._popen.pid

    def start(self) -> None:
        """Launch the job in a new session (its own process group) and start the readers."""
        if self._relay is not None:
            self._popen = self._relay.start(
                self.argv, self._env, batch_s=relay_window(self._batch_s), look_s=self._look_s
            )
        else:
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
            self.identity = ProcessIdentity.of(self.pid)
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
        bounds = Bounds()
        passthrough = self._passthrough[name]
        # A relay gathers as a pump would (``sentinel.process.relay``), for a shorter window:
        # what it sends is passed through at once, and no look follows (the relay sends a
        # window's lines in one write); its lines are handed on per ``batch_s``. Two pipes'
        # (no terminal) go on per the relay's window: a dict on stdout takes its step from
        # the bar on stderr next to it, and a second apart they would be far from it.
        relayed = self._relay is not None
        batch_s = self._batch_s
        if self._relay is not None and not self._relay.pty:
            batch_s = relay_window(batch_s)
        try:
            pump(
                pipe.fileno(),
                batch_s,
                lambda reads: self._hand_on(name, splitter, bounds, reads),
                _READ_BYTES,
                look_s=0.0 if relayed else self._look_s,
                on_read=None if passthrough is None else partial(self._pass, name, passthrough),
            )
            lines: list[str] = []
            marks: list[tuple[int, float]] = []
            bounds.flush(splitter, lines, marks)
            if lines:
                self._on_lines(name, lines, time.time(), tuple(marks))
        except Exception:
            log.exception("reading the job's %s failed", name)
        finally:
            pipe.close()

    def _hand_on(
        self, name: str, splitter: LineSplitter, bounds: Bounds, reads: list[tuple[bytes, float]]
    ) -> None:
        """Hand the complete lines of ``reads`` on, with their bounds."""
        lines: list[str] = []
        marks: list[tuple[int, float]] = []
        for data, since in reads:
            bounds.part(since, splitter)
            bounds.feed(splitter, data, lines, marks)
        if lines:
            self._on_lines(name, lines, time.time(), tuple(marks))

    def _pass(self, name: str, stream: BinaryIO, chunk: bytes) -> None:
        try:
            stream.write(chunk)
            stream.flush()
            if self._to_terminal[name]:
                terminal.job_wrote(chunk)
        except (OSError, ValueError):
            # Our own terminal went away; keep watching the job regardless.
            pass

    def _wait(self, readers: list[threading.Thread]) -> None:
        assert self._popen is not None
        self.returncode = self._popen.wait()
        for reader in readers:
            # A grandchild may hold the pipes open after the job exits: do not wait forever.
            reader.join(timeout=5.0)
        if self._relay is not None:
            self.returncode = self._relay.returncode(self.returncode)
            if self.returncode is None:
                self.relay_failed = True
                self._outlived_relay()
        self._on_exit(self.returncode)

    def _outlived_relay(self) -> None:
        """The relay died before the job: the job's end is waited for by its identity (its
        status is its new parent's to read), so that the attempt is not over while it runs."""
        identity = self.identity
        if identity is None or not identity.running():
            return
        log.error(
            "the job (pid %d) still runs without its relay: waiting for its end", identity.pid
        )
        while identity.running():
            time.sleep(RELAY_GONE_POLL_S)


def _enlarge(fd: int) -> None:
    """Ask for a ``PIPE_BYTES`` pipe; keep the default where that is not allowed."""
    if sys.platform != "linux":
        return
    import fcntl

    # Over the system's pipe-max-size, or the user's pipe quota spent: EPERM; harmless.
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
