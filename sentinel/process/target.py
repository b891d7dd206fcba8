"""Which process is the job ``sentinel watch`` attaches to: ``--pid``, ``--pidfile``,
``--match`` (with ``--user``) or ``--systemd-unit``.

A target is looked for again whenever the job is gone: the process it finds next is
the next attempt of the same run (a job its orchestrator restarted). ``find`` returns
None while there is none, so a caller can wait for one. A target never resolves to
sentinel itself or to a zombie; ``--match`` never to an ancestor of sentinel either
(``--pid $$`` names one on purpose: ``sentinel watch --pid $$ & exec torchrun ...``).
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import psutil

from sentinel.process.identity import ProcessIdentity
from sentinel.process.systemd_unit import (
    CGROUP_ROOT,
    SystemctlError,
    UnitState,
    cgroup_pids,
    show_unit,
)

log = logging.getLogger(__name__)

#: A pidfile is written after the process it names starts; a process that started
#: later than this after the file's last write holds a recycled pid (a stale pidfile).
#: Generous, for file systems that keep mtimes to the second.
PIDFILE_SLACK_S = 2.0
#: How long systemd is given to notice that its main process ended, for the status.
UNIT_SETTLE_S = 2.0
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)


class Target(Protocol):
    """How to find the job, and what can be learnt about it from whoever started it."""

    #: False where the job cannot come back (a bare pid): the watch ends with it.
    follows_restarts: bool

    def find(self) -> ProcessIdentity | None:
        """The job's root process now, or None while there is none."""
        ...

    def exit_status(self, identity: ProcessIdentity) -> int | None:
        """How ``identity`` ended, where its starter reports it; None when not knowable."""
        ...

    def members(self) -> list[ProcessIdentity]:
        """Processes known to be the job's beyond the tree below its root (a unit's cgroup)."""
        ...

    def describe(self) -> str:
        """The target in words, for logs ("pidfile run/job.pid")."""
        ...


class PidTarget:
    """``--pid PID``: that one process. A pid that ends is not followed: a process that
    gets the same pid later is someone else."""

    follows_restarts = False

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._looked = False
        self._identity: ProcessIdentity | None = None

    def find(self) -> ProcessIdentity | None:
        if not self._looked:
            self._looked = True
            self._identity = _running(self.pid)
        identity = self._identity
        if identity is not None and identity.liveness() == "same" and not _zombie(identity.pid):
            return identity
        return None

    def exit_status(self, identity: ProcessIdentity) -> int | None:
        return None

    def members(self) -> list[ProcessIdentity]:
        return []

    def describe(self) -> str:
        return f"pid {self.pid}"


class PidfileTarget:
    """``--pidfile FILE``: the pid the file names, read again at every look."""

    follows_restarts = True

    def __init__(self, path: Path) -> None:
        self.path = path
        self._said: str | None = None

    def find(self) -> ProcessIdentity | None:
        try:
            text = self.path.read_text()
            written_at = self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._say(f"cannot read {self.path}: {exc}")
            return None
        try:
            pid = int(text.strip())
        except ValueError:
            # Empty or half written: the next look reads it whole.
            self._say(f"{self.path} does not hold a pid: {text.strip()[:40]!r}")
            return None
        if pid <= 0:
            return None
        identity = _running(pid)
        if identity is None:
            return None
        if identity.create_time > written_at + PIDFILE_SLACK_S:
            self._say(
                f"{self.path} names pid {pid}, which started after the file was written: "
                "a stale pidfile, waiting for it to be written again"
            )
            return None
        self._said = None
        return identity

    def exit_status(self, identity: ProcessIdentity) -> int | None:
        return None

    def members(self) -> list[ProcessIdentity]:
        return []

    def describe(self) -> str:
        return f"pidfile {self.path}"

    def _say(self, words: str) -> None:
        if words != self._said:
            self._said = words
            log.warning("%s", words)


class MatchTarget:
    """``--match REGEX`` (``--user NAME``): the job's root, the process whose command line
    matches and whose parent's does not (workers below a launcher match too). Where two or
    more such roots match, none is taken until one is left: the oldest of an unrelated job
    and the watched one was the unrelated one, which got the watched job's SIGTERM."""

    follows_restarts = True

    def __init__(self, pattern: str, *, user: str | None = None) -> None:
        """ValueError if ``pattern`` is not a regular expression or ``user`` is unknown."""
        try:
            self.regex = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {pattern!r} ({exc})") from exc
        self.user = user
        self.uid = None if user is None else _uid(user)
        #: The pids of the roots last said to be too many (said once per set).
        self._ambiguous: frozenset[int] = frozenset()

    def find(self) -> ProcessIdentity | None:
        me = psutil.Process()
        excluded = {me.pid, *(parent.pid for parent in me.parents())}
        matching: dict[int, psutil.Process] = {}
        for process in psutil.process_iter(["cmdline", "uids", "status"]):
            info = process.info
            cmdline = info["cmdline"]
            if not cmdline or info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if self.uid is not None and (
                info["uids"] is None or info["uids"].effective != self.uid
            ):
                continue
            if self.regex.search(" ".join(cmdline)):
                matching[process.pid] = process
        roots: list[ProcessIdentity] = []
        for pid, process in matching.items():
            if pid in excluded:
                continue
            try:
                if process.ppid() in matching:
                    continue
                roots.append(ProcessIdentity(pid, process.create_time()))
            except _GONE:
                continue
        if len(roots) > 1:
            pids = frozenset(who.pid for who in roots)
            if pids != self._ambiguous:
                self._ambiguous = pids
                log.warning(
                    "%d processes match %r (pids %s), none started by another: not guessing"
                    " which is the job; give --pid, --pidfile or a narrower --match",
                    len(roots),
                    self.regex.pattern,
                    ", ".join(str(pid) for pid in sorted(pids)),
                )
            return None
        self._ambiguous = frozenset()
        return roots[0] if roots else None

    def exit_status(self, identity: ProcessIdentity) -> int | None:
        return None

    def members(self) -> list[ProcessIdentity]:
        return []

    def describe(self) -> str:
        who = f" of user {self.user}" if self.user is not None else ""
        return f"the one process{who} matching {self.regex.pattern!r}"


class SystemdUnitTarget:
    """``--systemd-unit UNIT``: the unit's main process; its exit status from systemd."""

    follows_restarts = True

    def __init__(
        self,
        unit: str,
        *,
        systemctl: Sequence[str] = ("systemctl",),
        cgroup_root: Path = CGROUP_ROOT,
        settle_s: float = UNIT_SETTLE_S,
    ) -> None:
        """``systemctl``: the command (``("systemctl", "--user")`` for a user's unit)."""
        self.unit = unit
        self.systemctl = tuple(systemctl)
        self.cgroup_root = cgroup_root
        self.settle_s = settle_s
        #: The unit's cgroup as last read ("" before the first reading).
        self.control_group = ""
        self._found: ProcessIdentity | None = None
        self._said: str | None = None

    def show(self) -> UnitState:
        """The unit's state now; SystemctlError if systemctl cannot tell."""
        state = show_unit(self.unit, systemctl=self.systemctl)
        if state.control_group:
            self.control_group = state.control_group
        return state

    def find(self) -> ProcessIdentity | None:
        try:
            state = self.show()
        except SystemctlError as exc:
            self._say(str(exc))
            return None
        if state.load_state == "not-found":
            self._say(f"systemd knows no unit {self.unit}")
            return None
        self._said = None
        if state.main_pid <= 0:
            return None
        found = self._found
        if found is not None and found.pid == state.main_pid and found.liveness() == "same":
            return None if _zombie(found.pid) else found
        identity = _running(state.main_pid)
        if identity is None:
            return None
        # Read again: the pid systemd named could have ended, and been reused, meanwhile.
        try:
            again = self.show()
        except SystemctlError:
            return None
        if again.main_pid != identity.pid:
            return None
        self._found = identity
        return identity

    def exit_status(self, identity: ProcessIdentity) -> int | None:
        """From ``ExecMainCode``/``ExecMainStatus``, once systemd has seen the end
        (``Result`` says why); None if it restarted the unit before it was read."""
        deadline = time.monotonic() + self.settle_s
        while True:
            try:
                state = self.show()
            except SystemctlError as exc:
                log.warning("no exit status for pid %d: %s", identity.pid, exc)
                return None
            status = state.exit_status_of(identity.pid)
            if status is not None:
                log.info(
                    "%s: pid %d ended, %s, status %d",
                    self.unit,
                    identity.pid,
                    state.result or "no result",
                    status,
                )
                return status
            if state.main_pid != identity.pid or time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def members(self) -> list[ProcessIdentity]:
        """The processes in the unit's cgroup (double-forked ones the tree walk misses)."""
        found: list[ProcessIdentity] = []
        for pid in cgroup_pids(self.control_group, root=self.cgroup_root):
            identity = _running(pid)
            if identity is not None and pid != os.getpid():
                found.append(identity)
        return found

    def describe(self) -> str:
        return f"systemd unit {self.unit}"

    def _say(self, words: str) -> None:
        if words != self._said:
            self._said = words
            log.warning("%s", words)


def wait_for(
    target: Target,
    *,
    stop: threading.Event,
    interval_s: float = 1.0,
    timeout_s: float | None = None,
) -> ProcessIdentity | None:
    """Look for ``target`` every ``interval_s`` until it is found, ``stop`` is set or
    ``timeout_s`` passes (None: forever); says once that it waits."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    said = False
    while True:
        identity = target.find()
        if identity is not None:
            if said:
                log.info("found %s: pid %d", target.describe(), identity.pid)
            return identity
        if not said:
            log.info("waiting for %s", target.describe())
            said = True
        wait_s = interval_s
        if deadline is not None:
            wait_s = min(wait_s, deadline - time.monotonic())
            if wait_s <= 0:
                return None
        if stop.wait(wait_s):
            return None


def _running(pid: int) -> ProcessIdentity | None:
    """The identity of running process ``pid`` (not a zombie, not sentinel), or None."""
    if pid == os.getpid():
        return None
    try:
        identity = ProcessIdentity.of(pid)
    except ProcessLookupError:
        return None
    return None if _zombie(pid) else identity


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _uid(user: str) -> int:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        if user.isdigit():
            return int(user)
        raise ValueError(f"no such user: {user!r}") from None
