"""Where ``run``'s relay (``sentinel.process.relay``) copies the job's output: a file per
stream in the attempt's directory, and sentinel, while it is there.

When sentinel is gone, :meth:`Relay.detach` notes in ``detached.json`` how far it had
read each stream, and where one that takes over should read from. Like the relay, this
module imports nothing but the standard library (the relay loads it by its path).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import os
import struct
import termios
import time

#: What each stream's file is called in the attempt's directory.
STREAM_FILES = {"stdout": "stdout.log", "stderr": "stderr.log"}
#: Both streams in one file, in the order sentinel was sent them: what ``sentinel replay``
#: reads to see the attempt as ``run`` saw it live (a Trainer's dicts on stdout take their
#: steps from its progress bars on stderr).
BOTH_FILE = "output.log"
#: Written once sentinel is gone: how far (bytes) it had read of each stream ("read"),
#: and where one that takes over should read from ("resume": ``RESUME_S`` earlier).
DETACHED = "detached.json"
#: What sentinel had read but not yet handed on when it died (a gathering window, at most
#: a second, and the loop's lag) is lost with it: one that takes over reads again what
#: the dead one was sent in this long before it went, so that no line is missed.
RESUME_S = 2.0
#: How finely what was sent is remembered over time.
_MARK_S = 0.1
#: Written at the end: the job's status (Popen's returncode).
EXIT = "exit.json"


def write_json(path: str, record: dict[str, object]) -> None:
    """Write ``record`` to ``path`` atomically (temp file and rename), private to the user."""
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unread(fd: int) -> int:
    """Bytes still in the pipe ``fd`` writes to (Linux answers FIONREAD on either end)."""
    try:
        answer = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", answer)[0])


class Relay:
    """Copies the job's streams to their files and to sentinel, until the job is done."""

    def __init__(
        self, directory: str, *, channels: dict[str, int], control: int, one_stream: bool = False
    ) -> None:
        self.directory = directory
        #: stream -> the fd sentinel reads it from; gone once sentinel is.
        self.channels = dict(channels)
        self.control: int | None = control
        self.sent = dict.fromkeys(STREAM_FILES, 0)
        #: stream -> (monotonic time, bytes sent before that time's output) over RESUME_S.
        self.marks: dict[str, collections.deque[tuple[float, int]]] = {
            name: collections.deque() for name in STREAM_FILES
        }
        #: stream -> its file; a file that cannot be written (a full or read-only state
        #: dir) is dropped: the job and sentinel's copy matter more than the file.
        self.files: dict[str, int] = {}
        #: The stream whose last part, in the file of both, ended mid-line.
        self._cut: str | None = None
        files = dict(STREAM_FILES) if one_stream else {**STREAM_FILES, BOTH_FILE: BOTH_FILE}
        for name, file_name in files.items():
            with contextlib.suppress(OSError):
                self.files[name] = os.open(
                    os.path.join(directory, file_name),
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                    0o600,
                )
        if one_stream:
            # One terminal for both: stdout.log is the output in the order written; the
            # file of both is the same file (a link: the output is not kept twice).
            with contextlib.suppress(OSError):
                os.link(
                    os.path.join(directory, STREAM_FILES["stdout"]),
                    os.path.join(directory, BOTH_FILE),
                )

    def copy(self, name: str, data: bytes) -> None:
        """To the stream's file and to sentinel."""
        self.keep(name, data)
        self.send(name, data)

    def keep(self, name: str, data: bytes) -> None:
        """To the stream's file, and to the file of both (where the other stream's last
        part ended mid-line, on a line of its own)."""
        self._write(name, data)
        if self._cut is not None and self._cut != name:
            self._write(BOTH_FILE, b"\n")
        self._write(BOTH_FILE, data)
        self._cut = None if data[-1:] in (b"\n", b"\r") else name

    def _write(self, name: str, data: bytes) -> None:
        file = self.files.get(name)
        if file is not None:
            try:
                _write_all(file, data)
            except OSError:
                del self.files[name]
                with contextlib.suppress(OSError):
                    os.close(file)

    def send(self, name: str, data: bytes) -> None:
        """To sentinel, while it is there."""
        channel = self.channels.get(name)
        if channel is None:
            return
        now, marks = time.monotonic(), self.marks[name]
        if not marks or now - marks[-1][0] >= _MARK_S:
            marks.append((now, self.sent[name]))
            while marks[0][0] < now - RESUME_S:
                marks.popleft()
        try:
            _write_all(channel, data)
        except BrokenPipeError:
            self.detach()
        else:
            self.sent[name] += len(data)

    def detach(self) -> None:
        """Sentinel is gone: note how far it read, and copy to the files alone from now."""
        if not self.channels:
            return
        read = {name: self.sent[name] - _unread(fd) for name, fd in self.channels.items()}
        since = time.monotonic() - RESUME_S
        resume = {}
        for name, done in read.items():
            recent = [sent for at, sent in self.marks[name] if at >= since]
            resume[name] = min([done, *recent[:1]])
        record = {"read": read, "resume": resume, "at": time.time()}
        with contextlib.suppress(OSError):
            write_json(os.path.join(self.directory, DETACHED), record)
        # The fds stay open (unread by anyone): closed, their numbers could be reused
        # while the relay's poller still names them.
        self.channels = {}
        self.control = None

    def say(self, text: str) -> None:
        """One line to sentinel on the control channel, while sentinel is there."""
        if self.control is not None:
            with contextlib.suppress(OSError):
                _write_all(self.control, f"{text}\n".encode())
