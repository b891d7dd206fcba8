"""One sentinel per state dir: a real flock, real holder processes, a real ``kill -9``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sentinel.store.lock import LOCK_NAME, StateDirLocked, acquire, holder

DEADLINE_S = 10.0

# Takes the lock, starts a child (the job) that inherits nothing on purpose, says so, waits.
HOLDER = """
import subprocess, sys, time
from pathlib import Path
from sentinel.store.lock import acquire
lock = acquire(Path(sys.argv[1]))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def until(condition: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not callable(condition) or not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A real process holding ``tmp_path/st``'s lock, and the pid of the child it started."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "st")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert process.stdout is not None
    child_pid = int(process.stdout.readline())
    yield process, child_pid
    for pid in (process.pid, child_pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()
    process.stdout.close()
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(child_pid).wait(timeout=5)


def test_a_second_lock_on_the_same_state_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    with acquire(tmp_path / "st") as lock:
        assert lock.held
        assert (tmp_path / "st" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with pytest.raises(StateDirLocked) as refused:
            acquire(tmp_path / "st")
        assert str(refused.value) == (
            f"another sentinel (pid {os.getpid()}) holds the state dir {tmp_path / 'st'}"
        )
        assert holder(tmp_path / "st") == os.getpid()
    assert holder(tmp_path / "st") is None
    with acquire(tmp_path / "st"):  # released: it can be taken again, the file left in place
        pass


def test_no_state_dir_has_no_holder(tmp_path: Path) -> None:
    assert holder(tmp_path / "nothing") is None
    (tmp_path / "st").mkdir()
    assert holder(tmp_path / "st") is None
    assert not (tmp_path / "st" / LOCK_NAME).exists()  # asking creates nothing


def test_asking_who_holds_it_does_not_take_it(tmp_path: Path) -> None:
    with acquire(tmp_path / "st"):
        for _ in range(50):
            assert holder(tmp_path / "st") == os.getpid()
    assert holder(tmp_path / "st") is None
    with acquire(tmp_path / "st"):
        assert holder(tmp_path / "st") == os.getpid()


@pytest.mark.slow
def test_kill_9_of_the_holder_frees_the_lock_though_its_job_lives_on(
    tmp_path: Path, held: tuple[subprocess.Popen[str], int]
) -> None:
    process, child_pid = held
    assert holder(tmp_path / "st") == process.pid
    with pytest.raises(StateDirLocked, match=f"pid {process.pid}"):
        acquire(tmp_path / "st")
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=DEADLINE_S)
    assert psutil.pid_exists(child_pid)  # the job it started lives on ...
    until(lambda: holder(tmp_path / "st") is None, "the lock to be free")  # ... without it
    with acquire(tmp_path / "st") as lock:
        assert (tmp_path / "st" / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        assert lock.held
    assert psutil.pid_exists(child_pid)
