"""Which process a pid names: pid and create time, so a pid the kernel reused is told apart.

Both the sources that watch a job and the actions that signal it check identity
before they read or signal a pid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import psutil

# create_time has clock-tick resolution (10 ms); two processes a tick apart differ.
_CREATE_TIME_TOLERANCE_S = 0.005

Liveness = Literal["same", "gone", "reused", "unknown"]


@dataclass(frozen=True)
class ProcessIdentity:
    """A process named by pid and create time, so a reused pid is told apart."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        """Return the identity of the running process ``pid``; ProcessLookupError if none."""
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except psutil.NoSuchProcess as exc:
            raise ProcessLookupError(f"no process with pid {pid}") from exc
        except psutil.AccessDenied as exc:
            raise PermissionError(f"cannot read the create time of pid {pid}") from exc

    def matches(self) -> bool:
        """Return whether ``pid`` still belongs to this same process (False if gone)."""
        return self.liveness() == "same"

    def running(self) -> bool:
        """Whether this same process still runs: a zombie has exited (where PID 1 does not
        reap, an orphan's zombie stays)."""
        try:
            process = psutil.Process(self.pid)
            same = abs(process.create_time() - self.create_time) <= _CREATE_TIME_TOLERANCE_S
            return same and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True  # it is there and cannot be told apart: never taken for gone

    def liveness(self) -> Liveness:
        """Return "same", "gone" (no such pid), "reused" (another process) or "unknown"."""
        try:
            create_time = psutil.Process(self.pid).create_time()
        except psutil.NoSuchProcess:
            return "gone"
        except psutil.AccessDenied:
            return "unknown"
        if abs(create_time - self.create_time) <= _CREATE_TIME_TOLERANCE_S:
            return "same"
        return "reused"
