"""One sentinel per state dir: an advisory lock on ``<state-dir>/lock``, held for life.

A lock, not a pid file: the kernel releases a ``flock`` when its holder dies,
even by SIGKILL, so a crashed sentinel never leaves a stale claim behind. The
holder's pid is written in the file only for the message a second sentinel
gives, and for ``sentinel verdict --wait`` to know whether a sentinel is alive.
The descriptor is not inherited by the job, so a job that outlives its
sentinel does not keep the state dir locked.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from sentinel.store.state import open_own, private_dir, unusable

LOCK_NAME = "lock"
#: A reader probing the lock (``holder``) holds it for microseconds; ``acquire``
#: tries again this many times, this far apart, before it names a holder.
_TRIES = 5
_TRY_GAP_S = 0.01


class StateDirLocked(Exception):
    """Another sentinel holds the state dir: a usage error (exit 2) that names its pid."""

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        who = "pid unknown" if pid is None else f"pid {pid}"
        super().__init__(f"another sentinel ({who}) holds the state dir {state_dir}")
        self.state_dir = state_dir
        self.pid = pid


class Lock:
    """The held lock on a state dir; ``release`` (or the process's end) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Free the lock. The file stays: removing it would let two sentinels lock two files."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> Lock:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()


def acquire(state_dir: Path) -> Lock:
    """Lock ``state_dir`` for this process (creating it, 0700); raise ``StateDirLocked`` if held."""
    try:
        private_dir(state_dir)
    except OSError as error:  # the state dir itself a symlink loop
        raise unusable(state_dir, error, itself=True) from None
    path = state_dir / LOCK_NAME
    fd = open_own(path, os.O_RDWR)
    try:
        for attempt in range(_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == _TRIES - 1:
                    raise StateDirLocked(state_dir, _read_pid(fd)) from None
                time.sleep(_TRY_GAP_S)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return Lock(path, fd)


def holder(state_dir: Path) -> int | None:
    """The pid of the sentinel that holds ``state_dir``; None when none does.

    0 when one holds it and its pid cannot be read (it has only just taken the lock).
    """
    try:
        fd = os.open(state_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    """The pid the holder wrote; it writes it just after taking the lock, so wait a little."""
    for _ in range(_TRIES):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        time.sleep(_TRY_GAP_S)
    return None
