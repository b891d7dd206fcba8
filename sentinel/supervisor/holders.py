"""How the supervisor holds the job: a child it launches (``run``) or one it finds (``watch``).

Both give the loop the same thing for each attempt, a ``Handle``: who the job is
(pid and create time), when it started, and an ``JobExited``
event once it has ended. Everything else (detection, incidents, rollback,
verdicts, notification) is one code path for both verbs. The differences are
said here once: a child's output is captured, an attached job's is read from the
files it writes; a child is relaunched by sentinel, an attached job by whoever
started it (kubelet, systemd, Slurm, torchrun), which sentinel then finds as its
next attempt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
from pathlib import Path
from typing import BinaryIO, Protocol

import psutil

from sentinel.config import ENV_PREFIX, RESTART_ENV, Settings
from sentinel.follow.terminal_text import TerminalLines
from sentinel.model.records import Marks
from sentinel.process.adopted import AdoptedJob
from sentinel.process.attached import AttachedJob
from sentinel.process.identity import ProcessIdentity
from sentinel.process.launched import JobProcess, OnLines, exit_status
from sentinel.process.relayed import JobRecord, RelayedStart, attempt_dir, prune
from sentinel.process.target import MatchTarget, PidfileTarget, PidTarget, SystemdUnitTarget, Target
from sentinel.service.sdnotify import strip_notify_env
from sentinel.supervisor.events import JobExited, OutputLines, Put
from sentinel.supervisor.restarts import Restarts

log = logging.getLogger(__name__)

#: Hands an event to the loop's inbox (thread-safe).
#: The attempts' output directories kept in the state dir (the newest).
KEEP_ATTEMPT_DIRS = 10


class Handle(Protocol):
    """One attempt of the job, as the loop sees it."""

    @property
    def pid(self) -> int: ...

    identity: ProcessIdentity | None
    #: When the attempt started (time.time()).
    started_at: float
    #: Whether sentinel's relay died before the job: its end is sentinel's failure.
    relay_failed: bool

    def wait(self, timeout_s: float) -> bool:
        """True once the attempt has ended (within ``timeout_s``)."""
        ...


class Holder(Protocol):
    """Starts or finds each attempt of the job."""

    #: "run" or "watch", for logs, metrics and the report.
    mode: str
    #: Whether sentinel itself starts the next attempt after a rollback.
    relaunches: bool
    #: Whether a later attempt can be found again (a bare ``--pid`` names one process only).
    follows_restarts: bool

    def begin(self, attempt: int, restarts: Restarts, put: Put) -> Handle | None:
        """The attempt's handle; None when the job is not there (yet). OSError: it could
        not be started."""
        ...

    def members(self) -> list[ProcessIdentity]:
        """Processes known to be the job's besides its root's descendants (a unit's cgroup)."""
        ...

    def last_attempt(self) -> int | None:
        """The number of the attempt an earlier sentinel started last, where it is known."""
        ...

    def exit_status_of(self, attempt: int) -> int | None:
        """How an earlier sentinel's ``attempt`` ended (its exit status), where known."""
        ...

    def forget_orphan(self) -> None:
        """The job an earlier sentinel started is not to be adopted: it is gone."""
        ...

    def adopts(self, job: ProcessIdentity) -> bool:
        """Whether the next ``begin`` holds ``job`` (a process an earlier sentinel stopped)
        rather than start the command again."""
        ...

    def describe(self) -> str:
        """The job in words: its command, or the target sentinel looks for."""
        ...

    def found_started_at(self) -> float | None:
        """When the job found running began (epoch seconds): what of its folder may be its
        own; None where it is not known or not found (``run``: it begins now)."""
        ...


class Child:
    """``sentinel run``: the job is a child; its output is captured and passed through.

    The job runs under a relay that holds its terminals (or pipes) and copies its output
    to files in the state dir as well as to sentinel, so the job outlives a crash of
    sentinel; a ``sentinel run`` started again on that state dir adopts it (its first
    attempt is the job found running, not a second copy beside it).
    """

    mode = "run"
    relaunches = True
    follows_restarts = True

    def __init__(
        self,
        command: list[str],
        settings: Settings,
        *,
        stdout: BinaryIO,
        stderr: BinaryIO,
    ) -> None:
        self.command = command
        self.settings = settings
        self._stdout = stdout
        self._stderr = stderr
        #: The arguments of the attempt started last.
        self.argv = list(command)
        self._current = 0
        self._group: int | None = None
        #: The attempt's relay: the subreaper of whatever leaves the job's tree.
        self._relay: ProcessIdentity | None = None
        self._looked_for_orphan = False

    def begin(self, attempt: int, restarts: Restarts, put: Put) -> Handle:
        if not self._looked_for_orphan:
            self._looked_for_orphan = True
            adopted = self._adopt(attempt, restarts, put)
            if adopted is not None:
                return adopted
        # The job is not sentinel's systemd service: it must not speak for it; nor does it
        # get sentinel's settings, whose notify URLs hold tokens.
        env = {
            key: value
            for key, value in strip_notify_env(os.environ).items()
            if not key.upper().startswith(ENV_PREFIX) or key.upper() in RESTART_ENV
        }
        terminal = self.settings.job.pty
        if self.settings.job.unbuffered and not terminal:
            # A terminal buffers Python's output by line: a line is one write, where
            # unbuffered output writes a line's text and its newline apart (and two
            # ranks' lines glue on one pipe).
            env.setdefault("PYTHONUNBUFFERED", "1")
        argv, restart_env = restarts.argv_and_env(self.command)
        env.update(restart_env)
        self.argv = argv
        self._current = attempt

        on_lines = self._lines_of(attempt, put, terminal=terminal)
        state_dir = self.settings.state_dir
        prune(state_dir, KEEP_ATTEMPT_DIRS - 1)
        relay = RelayedStart(attempt_dir(state_dir, attempt), pty=terminal)
        job = JobProcess(
            argv,
            env=env,
            on_lines=on_lines,
            on_exit=lambda code: put(JobExited(attempt, code)),
            stdout=self._stdout,
            stderr=self._stderr,
            max_line_bytes=self.settings.tail.max_line_bytes,
            batch_s=self.settings.tail.batch_s,
            look_s=self.settings.tail.look_s,
            relay=relay,
        )
        job.start()
        self._group = job.pid  # started in a session of its own: its pid is the group's id
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self._relay = ProcessIdentity.of(relay.relay_pid)
        if job.identity is not None:
            try:
                JobRecord(
                    attempt, relay.directory, ProcessIdentity.of(relay.relay_pid),
                    job.identity, argv, job.started_at, restarts.to_state(),
                ).save(state_dir)  # fmt: skip
            except (OSError, ProcessLookupError) as error:
                log.error("cannot record the job for a restart of sentinel to adopt: %s", error)
        return job

    def _lines_of(self, attempt: int, put: Put, *, terminal: bool) -> OnLines:
        """What hands the attempt's lines to the loop: a terminal's cleaned of escapes (which
        drops lines, never adds one: the marks stay true)."""
        cleaners = {"stdout": TerminalLines(), "stderr": TerminalLines()} if terminal else {}

        def on_lines(source: str, lines: list[str], at: float, marks: Marks) -> None:
            # A straggler of an earlier attempt (a grandchild that escaped the stop) still
            # writing to its old terminal: its output is not this attempt's.
            if attempt != self._current:
                log.warning("%d line(s) from attempt %d's leftovers ignored", len(lines), attempt)
                return
            cleaner = cleaners.get(source)
            if cleaner is not None:
                lines = cleaner.clean(lines)
            if lines:
                put(OutputLines(source, lines, at, marks))

        return on_lines

    def adopts(self, job: ProcessIdentity) -> bool:
        """Only a job recorded for adoption (``JobRecord``) is adopted; any other, ``begin``
        would start the command beside."""
        if self._looked_for_orphan:
            return False
        record = JobRecord.load(self.settings.state_dir)
        return record is not None and record.job == job

    def _adopt(self, attempt: int, restarts: Restarts, put: Put) -> Handle | None:
        """The job an earlier ``sentinel run`` on this state dir left running, adopted, with
        the restart budget and memory it was started under; None when there is none.
        OSError: one may run that cannot be told apart."""
        record = JobRecord.load(self.settings.state_dir)
        if record is None:
            return None
        relay, job = record.relay.liveness(), record.job.liveness()
        if "unknown" in (relay, job):
            raise OSError(
                f"the job sentinel started before (pid {record.job.pid}) may still run and"
                " cannot be told apart (its create time is hidden): not starting a second copy"
            )
        if relay != "same" and job != "same":
            status = record.exit_returncode()
            if status is not None:
                log.info("the job sentinel started before ended with status %d", status)
            return None
        self.argv = record.argv
        self._current = attempt
        self._group = record.job.pid
        self._relay = record.relay
        restarts.from_state(record.restarts)
        adopted = AdoptedJob(
            record,
            on_lines=self._lines_of(attempt, put, terminal=self.settings.job.pty),
            on_exit=lambda code: put(JobExited(attempt, code)),
            stdout=self._stdout,
            stderr=self._stderr,
            max_line_bytes=self.settings.tail.max_line_bytes,
            batch_s=self.settings.tail.batch_s,
        )
        adopted.start()
        log.warning(
            "adopted the job an earlier sentinel started and left running (pid %d, its attempt"
            " %d, output in %s)",
            record.job.pid, record.attempt, record.directory,
        )  # fmt: skip
        return adopted

    def last_attempt(self) -> int | None:
        record = JobRecord.load(self.settings.state_dir)
        return None if record is None else record.attempt

    def exit_status_of(self, attempt: int) -> int | None:
        record = JobRecord.load(self.settings.state_dir)
        if record is None or record.attempt != attempt:
            return None
        returncode = record.exit_returncode()
        return None if returncode is None else exit_status(returncode)

    def forget_orphan(self) -> None:
        self._looked_for_orphan = True

    def found_started_at(self) -> float | None:
        return None  # sentinel starts it: now

    def members(self) -> list[ProcessIdentity]:
        """The process group sentinel made for the job, and whatever the relay adopted: a
        member that left the tree (its parent died), even into a session of its own (a
        ``setsid`` daemon, reparented to the relay, its subreaper), is still the job's."""
        found = []
        group = self._group
        if group is None:
            return []
        for process in psutil.process_iter(["pid", "create_time"]):
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                if process.pid != os.getpid() and os.getpgid(process.pid) == group:
                    found.append(ProcessIdentity(process.pid, process.info["create_time"]))
        relay = self._relay
        if relay is not None and relay.matches():
            with contextlib.suppress(psutil.Error):
                for process in psutil.Process(relay.pid).children(recursive=True):
                    found.append(ProcessIdentity(process.pid, process.create_time()))
        return list(dict.fromkeys(found))

    def describe(self) -> str:
        return shlex.join(self.argv)


class Attached:
    """``sentinel watch``: the job was started elsewhere; each process found is an attempt."""

    mode = "watch"
    relaunches = False

    def __init__(self, target: Target) -> None:
        self.target = target
        self.follows_restarts = target.follows_restarts

    def begin(self, attempt: int, restarts: Restarts, put: Put) -> Handle | None:
        identity = self.target.find()
        if identity is None:
            return None
        job = AttachedJob(
            identity,
            on_exit=lambda status: put(JobExited(attempt, status)),
            exit_status=self.target.exit_status,
        )
        job.start()
        return _AttachedHandle(job)

    def members(self) -> list[ProcessIdentity]:
        return self.target.members()

    def adopts(self, job: ProcessIdentity) -> bool:
        return True  # it starts nothing: whatever it finds is the job

    def last_attempt(self) -> int | None:
        return None  # whoever starts the job numbers its attempts

    def exit_status_of(self, attempt: int) -> int | None:
        return None  # not sentinel's child: its status is not known

    def forget_orphan(self) -> None:
        pass  # nothing is adopted: the job is found

    def found_started_at(self) -> float | None:
        identity = self.target.find()
        return None if identity is None else identity.create_time

    def describe(self) -> str:
        return self.target.describe()


class _AttachedHandle:
    """An ``AttachedJob`` as a ``Handle``."""

    def __init__(self, job: AttachedJob) -> None:
        self.job = job
        self.identity: ProcessIdentity | None = job.identity
        self.started_at = job.identity.create_time
        self.relay_failed = False  # no relay: whoever started the job holds it

    @property
    def pid(self) -> int:
        return self.job.identity.pid

    def wait(self, timeout_s: float) -> bool:
        return self.job.wait(timeout_s)


def target_of(settings: Settings) -> Target:
    """The target ``[watch]`` names. ValueError when it names none, or more than one."""
    watch = settings.watch
    named = [
        name
        for name, value in (
            ("--pid", watch.pid),
            ("--pidfile", watch.pidfile),
            ("--match", watch.match),
            ("--systemd-unit", watch.systemd_unit),
        )
        if value is not None
    ]
    if len(named) != 1:
        given = ", ".join(named) if named else "none"
        raise ValueError(
            f"give exactly one of --pid, --pidfile, --match, --systemd-unit (given: {given})"
        )
    if watch.user is not None and watch.match is None:
        raise ValueError("--user only goes with --match")
    if watch.systemd_user and watch.systemd_unit is None:
        raise ValueError("--systemd-user only goes with --systemd-unit")
    if watch.pid is not None:
        return PidTarget(watch.pid)
    if watch.pidfile is not None:
        return PidfileTarget(Path(watch.pidfile))
    if watch.match is not None:
        return MatchTarget(watch.match, user=watch.user)
    assert watch.systemd_unit is not None
    systemctl = ("systemctl", "--user") if watch.systemd_user else ("systemctl",)
    return SystemdUnitTarget(watch.systemd_unit, systemctl=systemctl)


def job_name(settings: Settings, holder: Holder) -> str:
    """The job's name in messages: ``[job] name``, else its script, else the target."""
    if settings.job.name:
        return settings.job.name
    if not isinstance(holder, Child):
        return holder.describe()
    for arg in holder.command:
        base = Path(arg).name
        if not base.startswith("python") and not base.startswith("-"):
            return base
    return Path(holder.command[0]).name
