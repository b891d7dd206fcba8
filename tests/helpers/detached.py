"""Real processes sentinel did not start: launched by a launcher that exits, so they are
reparented, each writing its pid (once its signal handlers are in place) and every signal
it gets into a folder the test reads."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

from sentinel.process.identity import ProcessIdentity

DEADLINE_S = 10.0

#: One script, several roles (argv: folder, role, then role arguments):
#: job      handles SIGTERM/SIGINT by recording it and exiting; starts a child; waits
#: child    the same; starts a grandchild
#: grandchild  calls setsid(), records signals and carries on (only SIGKILL ends it)
#: wrapper  records signals and carries on; starts a job and waits for it, writes its status
#: saver    (started by a job on SIGTERM) records signals and carries on
#: sleeper  records signals and carries on; nothing else
ROLES = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
folder, role = Path(sys.argv[1]), sys.argv[2]
extra = sys.argv[3:]

def write_pid():
    tmp = folder / f".{role}.pid.tmp"
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, folder / f"{role}.pid")

def start(child_role, *args):
    code = f"SCRIPT = {SCRIPT!r}\n{SCRIPT}"
    return subprocess.Popen([sys.executable, "-c", code, str(folder), child_role, *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

def record(sig, _frame):
    with open(folder / f"{role}.got", "a") as out:
        out.write(signal.Signals(sig).name + "\n")
    if role in ("job", "child"):
        if "saver" in extra and sig == signal.SIGTERM:
            # Ignored from birth (SIG_IGN is inherited), so that a SIGTERM before its
            # handler is in place does not end it: only SIGKILL may.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            start("saver")
            time.sleep(1.5)
        sys.exit(0)

for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, record)
if role == "grandchild":
    os.setsid()
if role == "job" and "tree" in extra:
    start("child")
if role == "child":
    start("grandchild")
if role == "wrapper":
    job = start("job", *extra)
    write_pid()
    status = job.wait()
    (folder / "wrapper.status.tmp").write_text(str(status))  # whole: read once it exists
    (folder / "wrapper.status.tmp").replace(folder / "wrapper.status")
    while True:
        time.sleep(60)
write_pid()
while True:
    time.sleep(60)
"""
#: The script passes itself to its children through this name.
SCRIPT_ARGV = [sys.executable, "-c", f"SCRIPT = {ROLES!r}\n{ROLES}"]

LAUNCHER = """
import subprocess, sys
job = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
print(job.pid, flush=True)
"""


def launch_detached(argv: Sequence[str]) -> int:
    """Start ``argv`` through a launcher that exits at once; the started process's pid."""
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=DEADLINE_S,
    )
    return int(done.stdout)


def role_argv(folder: Path, role: str, *extra: str) -> list[str]:
    """The command line of a process playing ``role`` (see ``ROLES``)."""
    return [*SCRIPT_ARGV, str(folder), role, *extra]


def wait_for_pid(folder: Path, role: str, timeout_s: float = DEADLINE_S) -> ProcessIdentity:
    """The identity of ``role`` once it has written its pid (its handlers are in place)."""
    path = folder / f"{role}.pid"
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{role} wrote no pid within {timeout_s} s"
        time.sleep(0.01)
    return ProcessIdentity.of(int(path.read_text()))


def signals_got(folder: Path, role: str) -> list[str]:
    """The signals ``role`` recorded, in order."""
    path = folder / f"{role}.got"
    return path.read_text().split() if path.exists() else []


def wait_until(predicate: object, timeout_s: float = DEADLINE_S, what: str = "") -> None:
    """Wait until ``predicate()`` is true, failing after ``timeout_s``."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.01)


def running(identity: ProcessIdentity) -> bool:
    """Whether ``identity`` is still running (a zombie is not)."""
    if identity.liveness() != "same":
        return False
    try:
        return psutil.Process(identity.pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def reaped(folder: Path) -> Iterator[Path]:
    """``folder``; on the way out every process that wrote a pid there is SIGKILLed."""
    try:
        yield folder
    finally:
        for path in folder.glob("*.pid"):
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                pid = int(path.read_text())
                if psutil.Process(pid).create_time() <= path.stat().st_mtime + 1:
                    os.kill(pid, signal.SIGKILL)


def start_with_pid(pid: int, argv: list[str], attempts: int = 50) -> subprocess.Popen[bytes] | None:
    """Start ``argv`` as pid ``pid`` (root: the next pid is set through ns_last_pid)."""
    for _ in range(attempts):
        with open("/proc/sys/kernel/ns_last_pid", "w") as last:
            last.write(str(pid - 1))
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
    return None
