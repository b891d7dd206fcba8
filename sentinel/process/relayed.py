"""Sentinel's side of the relay (``sentinel.process.relay``): start a job under it, leave a
record of it in the state dir, and find that job again after a restart of sentinel.

Each attempt gets a directory of its own under ``<state-dir>/job/``, where the relay
writes the job's output (``stdout.log``, ``stderr.log``) and, at the end, its status.
``<state-dir>/job/current.json`` names the attempt that runs now: the relay's and the
job's identities (pid and create time), so that a restarted sentinel adopts that very
job and never a process that took over a pid.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sentinel.follow.gathering import LOOK_S
from sentinel.model.untrusted import json_value
from sentinel.parsing.lines import BATCH_S
from sentinel.process.identity import ProcessIdentity
from sentinel.process.relay import DEFAULT_COLUMNS, DEFAULT_ROWS
from sentinel.process.relay_copies import DETACHED, EXIT, STREAM_FILES, write_json

log = logging.getLogger(__name__)

RELAY_SCRIPT = str(Path(__file__).with_name("relay.py"))
#: Under the state dir: the attempts' directories and the record of the current one.
JOBS_DIR = "job"
CURRENT = "current.json"
#: Beside the record: the current attempt's pid alone, for ``sentinel watch --pidfile``.
PIDFILE = "job.pid"


def jobs_dir(state_dir: Path) -> Path:
    return state_dir / JOBS_DIR


def terminal_size() -> tuple[int, int]:
    """Sentinel's own terminal's (columns, rows), for the job's; a wide default without one."""
    try:
        size = os.get_terminal_size(sys.__stdout__.fileno() if sys.__stdout__ else 1)
    except (OSError, ValueError):
        return DEFAULT_COLUMNS, DEFAULT_ROWS
    if size.columns <= 0 or size.lines <= 0:  # a terminal that gives no size (``script``)
        return DEFAULT_COLUMNS, DEFAULT_ROWS
    return size.columns, size.lines


class RelayedStart:
    """Starts one attempt of the job under the relay, in ``directory``."""

    def __init__(self, directory: Path, *, pty: bool) -> None:
        self.directory = directory
        self.pty = pty
        #: The job's pid (the relay's child), once ``start`` returned.
        self.job_pid = 0
        #: The relay's pid, once ``start`` returned.
        self.relay_pid = 0
        self._control: IO[bytes] | None = None

    def start(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        batch_s: float = BATCH_S,
        look_s: float = LOOK_S,
    ) -> subprocess.Popen[bytes]:
        """The relay's process (its stdout and stderr carry the job's); OSError when the job
        could not be started (the relay's ``error`` line says why).

        The relay gathers the job's output for sentinel (``batch_s``, ``look_s``: as
        ``sentinel.follow.gathering``'s): what it sends is to be handed on as it comes."""
        # Private, as the state dir is: the job's output may hold anything.
        self.directory.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory.mkdir(exist_ok=True, mode=0o700)
        columns, rows = terminal_size()
        control_r, control_w = os.pipe()
        try:
            relay = subprocess.Popen(
                [
                    *(sys.executable, "-I", RELAY_SCRIPT, "--dir", str(self.directory)),
                    *("--control", str(control_w), *(["--pty"] if self.pty else [])),
                    *("--columns", str(columns), "--rows", str(rows)),
                    *("--batch-s", str(batch_s), "--look-s", str(look_s), "--", *argv),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(control_w,),
                # Its own session: a Ctrl-C at sentinel's terminal is sentinel's to handle.
                start_new_session=True,
            )
        except BaseException:
            os.close(control_r)
            raise
        finally:
            os.close(control_w)
        self._control = control = open(control_r, "rb")  # noqa: SIM115 (read again at the end)
        first = control.readline().decode(errors="replace").strip()
        if first.startswith("pid "):
            self.job_pid = int(first.split()[1])
            self.relay_pid = relay.pid
            return relay
        _, said = relay.communicate()
        control.close()
        if first.startswith("error "):
            number, _, text = first[len("error ") :].partition(" ")
            raise OSError(int(number), text)  # FileNotFoundError for ENOENT, and so on
        error = said.decode(errors="replace").strip() if said else ""
        raise OSError(f"the relay could not start the job: {error or 'no reason given'}")

    def returncode(self, relay_code: int) -> int | None:
        """The job's returncode, once the relay has ended; None when the relay ended without
        saying it: the relay failed (it was killed), and what follows is sentinel's doing,
        not the job's (logged as such)."""
        control = self._control
        said = control.read().decode(errors="replace").split() if control is not None else []
        if control is not None:
            control.close()
        if len(said) >= 2 and said[-2] == "exit":
            return int(said[-1])
        how = f"signal {-relay_code}" if relay_code < 0 else f"status {relay_code}"
        log.error(
            "sentinel's relay (pid %s) ended (%s) before the job: the job's output can no longer"
            " be read, and its exit is sentinel's failure, not the job's crash",
            self.relay_pid, how,
        )  # fmt: skip
        return None


@dataclass(frozen=True)
class JobRecord:
    """An attempt sentinel started under a relay, as left in ``current.json``."""

    attempt: int
    directory: Path
    relay: ProcessIdentity
    job: ProcessIdentity
    argv: list[str]
    started_at: float
    #: The restart budget and memory the attempt was started under (``Restarts.to_state``).
    restarts: dict[str, str] = field(default_factory=dict)

    def save(self, state_dir: Path) -> None:
        """Write the record, and the job's pid to ``job.pid`` (both atomically)."""
        pidfile = jobs_dir(state_dir) / PIDFILE
        temporary = pidfile.with_name(f"{PIDFILE}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, f"{self.job.pid}\n".encode())
        finally:
            os.close(fd)
        os.replace(temporary, pidfile)
        write_json(
            str(jobs_dir(state_dir) / CURRENT),
            {
                "attempt": self.attempt,
                "directory": str(self.directory),
                "relay": [self.relay.pid, self.relay.create_time],
                "job": [self.job.pid, self.job.create_time],
                "argv": self.argv,
                "started_at": self.started_at,
                "restarts": self.restarts,
            },
        )

    @classmethod
    def load(cls, state_dir: Path) -> JobRecord | None:
        """The record of the attempt that ran last; None without one (or an unreadable one)."""
        path = jobs_dir(state_dir) / CURRENT
        try:
            data: dict[str, Any] = json_value(path.read_text())
            return cls(
                attempt=int(data["attempt"]),
                directory=Path(data["directory"]),
                relay=ProcessIdentity(int(data["relay"][0]), float(data["relay"][1])),
                job=ProcessIdentity(int(data["job"][0]), float(data["job"][1])),
                argv=[str(arg) for arg in data["argv"]],
                started_at=float(data["started_at"]),
                restarts={str(k): str(v) for k, v in dict(data.get("restarts") or {}).items()},
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, IndexError, TypeError) as error:
            log.warning("cannot read %s: %s", path, error)
            return None

    def stream_path(self, name: str) -> Path:
        return self.directory / STREAM_FILES[name]

    def exit_returncode(self) -> int | None:
        """The job's returncode as the relay wrote it at the end; None before (or if lost)."""
        try:
            return int(json_value((self.directory / EXIT).read_text())["returncode"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def read_offsets(self, wait_s: float = 1.0) -> dict[str, int]:
        """Where to read each stream from (bytes): where the sentinel that died had read it,
        less what it may not have handed on yet, as the relay noted when it saw it go (at
        once; ``wait_s`` for it to write the note). Without the note, the files' ends: the
        relay is gone too, or never saw it."""
        path = self.directory / DETACHED
        deadline = time.monotonic() + wait_s
        while True:
            try:
                resume = json_value(path.read_text())["resume"]
                return {name: max(0, int(resume.get(name, 0))) for name in STREAM_FILES}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                if time.monotonic() >= deadline or self.relay.liveness() != "same":
                    break
                time.sleep(0.05)
        offsets = {}
        for name in STREAM_FILES:
            try:
                offsets[name] = self.stream_path(name).stat().st_size
            except OSError:
                offsets[name] = 0
        return offsets


def attempt_dir(state_dir: Path, attempt: int) -> Path:
    """A fresh directory's path for ``attempt`` (named by the time, so runs never share one)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime())
    # Absolute: a sentinel started again from another directory finds it.
    base = jobs_dir(state_dir).absolute() / f"{stamp}-{attempt}"
    path, count = base, 1
    while path.exists():
        count += 1
        path = base.with_name(f"{base.name}.{count}")
    return path


def prune(state_dir: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` attempts' directories (their output files)."""
    root = jobs_dir(state_dir)
    try:
        directories = sorted(
            (entry for entry in root.iterdir() if entry.is_dir()), key=lambda p: p.stat().st_mtime
        )
    except OSError:
        return
    for old in directories[: max(0, len(directories) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
