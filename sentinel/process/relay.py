"""A tiny process that holds the job's terminals and copies its output: the job outlives sentinel.

``sentinel run`` starts this file as a script (``python -I relay.py``; the standard
library only: nothing of sentinel's package is imported, its two helpers beside it,
``gathering.py`` and ``relay_copies.py``, are loaded by their paths) and the relay
starts the job. The
job's stdout and stderr are one pseudo-terminal (``--pty``: rich and tqdm draw as for
a person, Python buffers by line, so a line is one write and two ranks' lines never
glue; both streams in the order written, as in a shell) or a pipe each. The relay owns
their other ends and copies every byte to a file per stream in the attempt's directory
and to sentinel through the relay's own stdout and stderr
(``sentinel.process.relay_copies``).

When sentinel dies (a crash, ``kill -9``) its ends of those pipes close; the relay
sees it at once (``POLLERR``), notes in ``detached.json`` how far sentinel had read
each stream (what it wrote, less what the pipe still held) and goes on copying to
the files only. So the job never blocks on a full pipe nor dies of a broken one,
and its terminals are never hung up while it runs. A restarted sentinel adopts the
job from the record sentinel left beside these files, and follows the files from
where the dead one had read.

Protocol with sentinel: fd 3 (``--control``) gets ``pid N`` once the job runs (or
``error TEXT`` if it could not be started) and ``exit S`` at the end (S as Popen's
returncode: negative for a signal). ``exit.json`` holds the same status for a
sentinel that was not there to read it. The relay exits after the job has exited
and its output is drained (or ``DRAIN_S`` after, if a grandchild keeps a terminal open).

The relay gathers for sentinel (``sentinel.follow.gathering``, loaded from beside
this file): it reads what the job wrote at most every ``--look-s`` while output flows,
and copies it to the files and to sentinel once per ``--batch-s`` window, or at once
when a read may hold a non-finite value or a traceback (once sentinel is gone, to the
files at once). A job printing
100 lines a second then wakes the relay 50 times a second, not 100, and sentinel's
reader 4 times, not 50: on a shared VM a wake-up costs 50-140 µs (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import importlib.util
import math
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from types import ModuleType
from typing import TYPE_CHECKING

#: prctl(2): the calling process adopts its descendants' orphans.
PR_SET_CHILD_SUBREAPER = 36


def _beside(name: str, package: str = "process") -> ModuleType:
    """The module ``name`` of sentinel's ``package`` folder, loaded by its path: the relay runs
    as a script (``python -I``), and imports nothing of sentinel's package."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(here), package, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"sentinel_relay_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING or __package__:
    from sentinel.follow import gathering
    from sentinel.process.relay_copies import EXIT, Relay, write_json
    from sentinel.process.relay_copies import STREAM_FILES as STREAM_FILES  # evidence's
else:  # a script: the standard library only
    gathering = _beside("gathering", "follow")
    _copies = _beside("relay_copies")
    EXIT, STREAM_FILES, Relay, write_json = (
        _copies.EXIT,
        _copies.STREAM_FILES,
        _copies.Relay,
        _copies.write_json,
    )

#: After the job has exited, how long output still held open by a grandchild is read.
DRAIN_S = 5.0
#: The terminal's size when sentinel has none of its own to copy.
DEFAULT_COLUMNS, DEFAULT_ROWS = 200, 50
#: What one read takes: a terminal holds 64 KiB; a larger read maps fresh memory each
#: time (120 against 45 us a wake-up here), which a job printing a line at a time pays per line.
_READ_BYTES = 1 << 16
#: The job's pipes (without terminals): as large as the ones to sentinel.
PIPE_BYTES = 1 << 20
#: While output flows, the relay reads after each look without asking ``poll`` first (a
#: system call less a look); it polls at least this often still, for the job's exit and
#: sentinel's.
POLL_EVERY_S = 0.25
#: How long a read that ended inside a line waits for the line's end.
NAP_S = 0.002
#: The relay's window and look, when ``--batch-s`` and ``--look-s`` are not given
#: (``sentinel.parsing.lines``).
BATCH_S = 0.25
_LINE_ENDS = (b"\n", b"\r")


def _pipe() -> tuple[int, int]:
    """A pipe as large as sentinel's own (room while the relay waits for the CPU)."""
    read_end, write_end = os.pipe()
    with contextlib.suppress(OSError, AttributeError):  # over the system's limit: keep it
        fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    return read_end, write_end


def open_terminal(columns: int, rows: int) -> tuple[int, int]:
    """A pseudo-terminal (master, slave) that passes ``\\n`` as is (no ``\\r\\n``)."""
    master, slave = pty.openpty()
    attributes = termios.tcgetattr(slave)
    attributes[1] &= ~termios.OPOST  # output as written: no \n -> \r\n, no tab expansion
    attributes[3] &= ~termios.ECHO
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    return master, slave


def _read_lines(fd: int) -> bytes:
    """A read of ``fd`` (``os.read``, its errors and all), with the rest of a line it ends
    inside of (``_rest_of_line``); empty at the stream's end."""
    data = os.read(fd, _READ_BYTES)
    if data and data[-1:] not in _LINE_ENDS:
        data += _rest_of_line(fd)
    return data


def _rest_of_line(fd: int) -> bytes:
    """The rest of a line the job writes in parts, if it comes within ``NAP_S``.

    Unbuffered Python (``PYTHONUNBUFFERED``, pipes) writes a line's text and its newline
    in two calls: handed on apart, the line's end would come to sentinel in a read of its
    own, one that says nothing of the NaN before it, and wait out a gathering window.
    """
    waiter = select.poll()
    waiter.register(fd, select.POLLIN)
    deadline = time.monotonic() + NAP_S
    more = b""
    while len(more) < _READ_BYTES:
        left_s = deadline - time.monotonic()
        if left_s <= 0 or not waiter.poll(left_s * 1000):
            break
        try:
            chunk = os.read(fd, _READ_BYTES)
        except OSError:
            break  # the end: the main loop sees it again
        if not chunk:
            break
        more += chunk
        if chunk[-1:] in _LINE_ENDS:
            break
    return more


class _Held:
    """What the relay read of one stream and has not sent to sentinel yet."""

    def __init__(self, batch_s: float, look_s: float) -> None:
        self.gathering = gathering.Gathering(batch_s, look_s)
        self.parts: list[bytes] = []
        #: What was sent last ended inside a line: the line's end goes at once too.
        self.partial = False

    def take(self, data: bytes, now: float) -> bool:
        """Hold ``data``; whether what is held is to be sent now."""
        self.parts.append(data)
        if len(data) >= _READ_BYTES or (self.partial and gathering.ends_a_line(data)):
            return True  # a flood is never held; nor the end of a line that went early
        if now >= self.gathering.due():
            return True
        small = len(data) <= gathering.LOOK_BYTES
        return small and gathering.may_be_urgent(data) and self.gathering.hand_on_now(True, now)

    def hold(self, name: str, data: bytes, out: Relay, now: float) -> None:
        """Hold ``data``, and send what is held if ``take`` says it is time."""
        if self.take(data, now):
            self.send(name, out, now)

    def _joined(self) -> bytes:
        data = b"".join(self.parts) if len(self.parts) > 1 else self.parts[0]
        self.parts = []
        return data

    def send(self, name: str, out: Relay, now: float) -> None:
        """What is held, to the file and to sentinel."""
        data = self._joined()
        out.copy(name, data)
        self.gathering.handed_on(now)
        self.partial = data[-1:] not in _LINE_ENDS

    def keep(self, name: str, out: Relay) -> None:
        """What is held, to the file alone (sentinel is gone)."""
        if self.parts:
            out.keep(name, self._joined())


def _keep_looking(
    flowing: dict[int, str], held: dict[str, _Held], out: Relay, look_s: float, until: float
) -> None:
    """While output flows, read the streams that keep flowing every ``look_s``, without a poll
    between, until ``until`` (the next poll, for the job's exit and sentinel's, or a held
    stream's window): what each read takes is held, or sent as ``_Held.take`` says.

    A look is most of what the relay does for a busy job (50 a second at 100 lines/s), so
    it does no more than that; the main loop's round (the poll, the job's exit, a stream's
    end, sentinel gone) comes after. Returns once a stream read nothing (the poll says
    whether it ended), after a flood (the poll finds the rest at once) or a failed write
    to sentinel, or at ``until``.
    """
    time.sleep(look_s)
    while True:
        for fd, name in flowing.items():
            try:
                data = _read_lines(fd)
            except OSError:  # nothing since (EAGAIN), or the end (EIO)
                return
            if not data:
                return
            now = time.monotonic()
            held[name].hold(name, data, out, now)
            if len(data) >= _READ_BYTES or not out.channels:
                return
        time.sleep(look_s)  # the poll after ``until`` comes after a look's wait too
        if now >= until:
            return


def relay(
    job: subprocess.Popen[bytes],
    sources: dict[str, int],
    out: Relay,
    *,
    batch_s: float = BATCH_S,
    look_s: float = gathering.LOOK_S,
) -> int:
    """Copy until the job has exited and its streams are drained; the job's returncode.

    What is read goes to the file and to sentinel together, as gathering says (once
    sentinel is gone, to the file at once); after a read the relay waits ``look_s``
    before it looks again, so that the lines of a busy job come a few to a wake-up."""
    poller = select.poll()
    by_fd = {fd: name for name, fd in sources.items()}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
        os.set_blocking(fd, False)  # read after a look without a poll: empty is EAGAIN
    channels = list(out.channels.values())
    for fd in channels:
        poller.register(fd, 0)  # POLLERR: sentinel closed its end
    exited: int | None = None
    try:
        exited = os.pidfd_open(job.pid)
    except (AttributeError, OSError):
        pass  # no pidfds: look every half second
    else:
        poller.register(exited, select.POLLIN)
    held = {name: _Held(batch_s, look_s) for name in sources}
    ended_at: float | None = None
    look_for_exit = True
    while by_fd:
        now = time.monotonic()
        if ended_at is None and look_for_exit and job.poll() is not None:
            ended_at = now
            if exited is not None:
                poller.unregister(exited)
        look_for_exit = exited is None
        if ended_at is not None and now - ended_at >= DRAIN_S:
            break
        timeout_s = -1.0 if exited is not None else 0.5
        if ended_at is not None:
            timeout_s = DRAIN_S - (now - ended_at)
        due = [stream.gathering.due() for stream in held.values() if stream.parts]
        if due:
            wait_s = max(0.0, min(due) - now)
            timeout_s = wait_s if timeout_s < 0 else min(timeout_s, wait_s)
        events = poller.poll(-1 if timeout_s < 0 else math.ceil(timeout_s * 1000))
        polled_at = now = time.monotonic()
        read: dict[int, str] = {}
        flood = False
        for fd, _ in events:
            name = by_fd.get(fd)
            if name is not None:
                try:
                    data = _read_lines(fd)
                except BlockingIOError:
                    continue  # nothing since the last read
                except OSError:  # EIO: a terminal whose every slave end is closed
                    data = b""
                if data:
                    stream = held[name]
                    if not out.channels:
                        stream.parts.append(data)
                        stream.keep(name, out)
                    else:
                        stream.hold(name, data, out, now)
                    read[fd] = name
                    flood = flood or len(data) >= _READ_BYTES
                    continue
                if held[name].parts:
                    held[name].send(name, out, now)
                poller.unregister(fd)
                del by_fd[fd]
            elif fd == exited:
                look_for_exit = True
            elif fd in channels:
                out.detach()
        for name, stream in held.items():
            if stream.parts and now >= stream.gathering.due():
                stream.send(name, out, now)
        if channels and not out.channels:  # detached, here or by a failed write
            for fd in channels:
                poller.unregister(fd)
            channels = []
            for name, stream in held.items():
                stream.keep(name, out)
        if read and not flood and look_s > 0:
            if out.channels:
                # What a stream that stopped flowing holds is sent by this loop, at its due.
                until = [polled_at + POLL_EVERY_S]
                for name, stream in held.items():
                    if stream.parts and name not in read.values():
                        until.append(stream.gathering.due())
                _keep_looking(read, held, out, look_s, min(until))
            else:
                time.sleep(look_s)  # sentinel is gone: to the files, still a few lines a read
    for name, stream in held.items():
        if stream.parts:
            stream.send(name, out, time.monotonic())
    return job.wait()


def _become_subreaper() -> None:
    """Make the relay its descendants' subreaper: a process that leaves the job's tree (a
    double fork, a ``setsid`` daemon) is reparented to the relay, not to PID 1, so it is still
    found below the relay and stopped with the job (Linux 3.4+; elsewhere nothing changes)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_orphans(job_pid: int) -> None:
    """Reap the adopted orphans that exited; never the job, whose status is Popen's."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == job_pid:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sentinel-relay")
    parser.add_argument("--dir", required=True, help="the attempt's directory")
    parser.add_argument("--control", type=int, required=True, help="fd for pid/exit lines")
    parser.add_argument("--pty", action="store_true", help="give the job terminals")
    parser.add_argument("--columns", type=int, default=DEFAULT_COLUMNS)
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--batch-s", type=float, default=BATCH_S, help="sentinel's window")
    parser.add_argument(
        "--look-s", type=float, default=gathering.LOOK_S, help="how often busy output is read"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # A terminal is one for both streams, as in a person's shell: what the job writes to
    # either reaches sentinel in the order it was written (tqdm redraws its bar on stderr
    # right after ``tqdm.write`` prints a Trainer's dict on stdout: that bar is the dict's
    # step). Two pipes keep the streams apart and lose their order.
    out = Relay(
        args.dir, channels={"stdout": 1, "stderr": 2}, control=args.control, one_stream=args.pty
    )
    ends: dict[str, tuple[int, int]] = {}
    if args.pty:
        ends["stdout"] = open_terminal(args.columns, args.rows)
    else:
        for name in STREAM_FILES:
            ends[name] = _pipe()
    job_stderr = ends["stdout" if args.pty else "stderr"][1]
    _become_subreaper()
    try:
        job = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=ends["stdout"][1],
            stderr=job_stderr,
            start_new_session=True,
        )
    except OSError as error:
        out.say(f"error {error.errno} {error.strerror}: {command[0] if command else ''}")
        return 127
    # Set after the job started, so that it does not inherit them. Python ignores SIGPIPE
    # already (a write to sentinel's closed end fails, it does not kill).
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: _reap_orphans(job.pid))
    for _, slave in ends.values():
        os.close(slave)
    out.say(f"pid {job.pid}")
    masters = {name: master for name, (master, _) in ends.items()}
    returncode = relay(job, masters, out, batch_s=args.batch_s, look_s=args.look_s)
    with contextlib.suppress(OSError):
        write_json(os.path.join(args.dir, EXIT), {"returncode": returncode, "at": time.time()})
    out.say(f"exit {returncode}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
