"""Following a job sentinel did not start: real reparented processes, their real end."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sentinel.process.attached import AttachedJob
from sentinel.process.identity import ProcessIdentity
from sentinel.process.pidfd import pidfds_work
from tests.helpers.detached import (
    launch_detached,
    reaped,
    role_argv,
    running,
    signals_got,
    wait_for_pid,
)

MODES = [
    pytest.param(True, id="pidfd", marks=pytest.mark.skipif(not pidfds_work(), reason="no pidfd")),
    pytest.param(False, id="polled"),
]
DEADLINE_S = 5.0


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    with reaped(tmp_path) as path:
        yield path


class Exits:
    """Records each ``on_exit`` call and the thread it came from."""

    def __init__(self) -> None:
        self.statuses: list[int | None] = []
        self.threads: list[str] = []
        self.called = threading.Event()

    def __call__(self, status: int | None) -> None:
        self.statuses.append(status)
        self.threads.append(threading.current_thread().name)
        self.called.set()


@pytest.mark.slow
@pytest.mark.parametrize("use_pidfd", MODES)
def test_the_end_of_a_reparented_job_is_seen_once_with_no_status(
    folder: Path, use_pidfd: bool
) -> None:
    launch_detached(role_argv(folder, "job"))
    job = wait_for_pid(folder, "job")
    assert psutil.Process(job.pid).ppid() != os.getpid()
    exits = Exits()
    attached = AttachedJob(job, on_exit=exits, use_pidfd=use_pidfd, poll_s=0.05)
    attached.start()
    assert not attached.wait(0.2)
    assert exits.statuses == []

    os.kill(job.pid, signal.SIGTERM)

    assert attached.wait(DEADLINE_S)
    assert exits.called.wait(DEADLINE_S)
    time.sleep(0.1)
    assert exits.statuses == [None]  # a non-child's status is not knowable
    assert exits.threads == ["attached-job"]
    assert attached.exited
    attached.stop()


def test_the_status_comes_from_the_jobs_starter_when_it_reports_one(folder: Path) -> None:
    launch_detached(role_argv(folder, "job"))
    job = wait_for_pid(folder, "job")
    asked: list[ProcessIdentity] = []

    def unit_status(identity: ProcessIdentity) -> int | None:
        asked.append(identity)
        return 143

    exits = Exits()
    attached = AttachedJob(job, on_exit=exits, exit_status=unit_status)
    attached.start()
    os.kill(job.pid, signal.SIGTERM)

    assert exits.called.wait(DEADLINE_S)
    assert exits.statuses == [143]
    assert attached.status == 143
    assert asked == [job]
    attached.stop()


def test_a_job_already_gone_ends_at_once(folder: Path) -> None:
    launch_detached(role_argv(folder, "job"))
    job = wait_for_pid(folder, "job")
    os.kill(job.pid, signal.SIGKILL)
    while running(job):
        time.sleep(0.01)
    exits = Exits()

    AttachedJob(job, on_exit=exits).start()

    assert exits.called.wait(DEADLINE_S)
    assert exits.statuses == [None]


def test_a_pid_held_by_another_process_is_not_the_job(folder: Path) -> None:
    launch_detached(role_argv(folder, "sleeper"))
    other = wait_for_pid(folder, "sleeper")
    exits = Exits()
    attached = AttachedJob(ProcessIdentity(other.pid, other.create_time - 60), on_exit=exits)

    attached.start()

    assert exits.called.wait(DEADLINE_S)
    assert attached.tree() == []
    assert running(other)
    assert signals_got(folder, "sleeper") == []


@pytest.mark.slow
def test_stop_leaves_the_job_running_and_calls_nothing(folder: Path) -> None:
    launch_detached(role_argv(folder, "job"))
    job = wait_for_pid(folder, "job")
    exits = Exits()
    attached = AttachedJob(job, on_exit=exits)
    attached.start()

    attached.stop()
    os.kill(job.pid, signal.SIGTERM)
    while running(job):
        time.sleep(0.01)

    time.sleep(0.1)
    assert exits.statuses == []
    assert not attached.exited
    assert signals_got(folder, "job") == ["SIGTERM"]  # only the test's own signal
    attached.stop()


@pytest.mark.slow
def test_the_tree_is_the_root_and_all_its_descendants(folder: Path) -> None:
    launch_detached(role_argv(folder, "job", "tree"))
    roles = {role: wait_for_pid(folder, role) for role in ("job", "child", "grandchild")}
    exits = Exits()
    attached = AttachedJob(roles["job"], on_exit=exits)
    attached.start()

    tree = attached.tree()

    assert tree[0] == roles["job"]
    assert set(tree) == set(roles.values())  # the setsid() grandchild too
    assert os.getpid() not in {who.pid for who in tree}
    os.kill(roles["job"].pid, signal.SIGTERM)
    assert exits.called.wait(DEADLINE_S)
    assert attached.tree() == []
    attached.stop()
