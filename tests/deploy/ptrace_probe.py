"""Can a non-root sentinel, set up as a deployment sets it up, read a job's stacks with py-spy?

The deploy tests that answer it run real processes under ``setpriv``, which applies what a
container runtime or systemd applies (user, bounding set, inheritable and ambient
capabilities, no_new_privs): a job of another user (uid 1001) stuck in a function with a
telling name, and a stand-in for sentinel (uid 1000) that runs ``py-spy dump`` on it and
says what came back. Another user's job needs CAP_SYS_PTRACE whatever Yama's ptrace_scope
is, so it shows the capability arriving where py-spy runs. They need root (to switch users
and write file capabilities) and a Python that uid 1000 may run; ``skip_reason`` says when
they cannot run here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SENTINEL_UID = 1000
JOB_UID = 1001
#: The function the job is stuck in; py-spy's dump must name it.
STUCK_IN = "stuck_in_a_telling_name"

#: What sentinel does before a stop, reduced: run py-spy on the job, say what came back.
STAND_IN = """\
import json, subprocess, sys
try:
    done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=20)
    print(json.dumps({"rc": done.returncode, "out": done.stdout, "err": done.stderr}))
except OSError as error:
    print(json.dumps({"oserror": error.errno}))
"""
_JOB = f"""\
import time
def {STUCK_IN}():
    print("ready", flush=True)
    time.sleep(120)
{STUCK_IN}()
"""


def as_user(
    uid: int,
    argv: list[str],
    *,
    bounding: str = "-all",
    ambient: str = "-all",
    no_new_privs: bool = True,
) -> list[str]:
    """``argv`` run as ``uid`` (no supplementary groups) with the bounding set ``bounding``
    and the ambient set ``ambient`` (setpriv's ``-all,+cap`` lists; an ambient capability
    is made inheritable too, as the kernel requires), and no_new_privs."""
    return [
        "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
        f"--inh-caps={ambient}", f"--ambient-caps={ambient}", f"--bounding-set={bounding}",
        *(["--no-new-privs"] if no_new_privs else []), *argv,
    ]  # fmt: skip


def py_spy() -> Path:
    """The py-spy of the test environment (the ``evidence`` extra puts it beside Python)."""
    return Path(sys.executable).with_name("py-spy")


def system_python() -> str | None:
    """A Python another user can run (the venv's may live under a private home)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists():
            done = subprocess.run(
                as_user(SENTINEL_UID, [candidate, "-c", "pass"]), capture_output=True, timeout=30
            )
            if done.returncode == 0:
                return candidate
    return None


def skip_reason() -> str | None:
    """Why the probe cannot run here, or None."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv (to run processes as other users with set capabilities)"
    if not py_spy().exists():
        return "py-spy is not installed (the evidence extra)"
    if system_python() is None:
        return f"no Python here that uid {SENTINEL_UID} may run"
    return None


@contextlib.contextmanager
def stuck_job() -> Iterator[int]:
    """A job of uid 1001, stuck in ``STUCK_IN``; its pid."""
    python = system_python()
    assert python is not None
    job = subprocess.Popen(
        as_user(JOB_UID, [python, "-c", _JOB]), stdout=subprocess.PIPE, text=True
    )
    try:
        assert job.stdout is not None and job.stdout.readline() == "ready\n"
        yield job.pid
    finally:
        job.kill()
        job.communicate(timeout=30)


def dump(sentinel: list[str], binary: Path, pid: int) -> dict[str, object]:
    """What ``sentinel`` (a command line ending in the stand-in) got from ``binary dump``."""
    done = subprocess.run(
        [*sentinel, str(binary), "dump", "--pid", str(pid)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said: dict[str, object] = json.loads(done.stdout)
    return said
