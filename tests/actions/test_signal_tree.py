"""Stopping a job's tree that sentinel did not start: real processes, reparented by a launcher
that exits, really signalled; a pid really reused."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sentinel.process.identity import ProcessIdentity
from sentinel.process.pidfd import pidfds_work, pin
from sentinel.process.signal_tree import begin_stop, stop_tree
from tests.helpers.detached import (
    launch_detached,
    reaped,
    role_argv,
    running,
    signals_got,
    start_with_pid,
    wait_for_pid,
    wait_until,
)

MODES = [
    pytest.param(True, id="pidfd", marks=pytest.mark.skipif(not pidfds_work(), reason="no pidfd")),
    pytest.param(False, id="checked-pid"),
]


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    with reaped(tmp_path) as path:
        yield path


def start_tree(folder: Path, *extra: str) -> dict[str, ProcessIdentity]:
    """A job with a child and a setsid() grandchild, its launcher gone."""
    launch_detached(role_argv(folder, "job", "tree", *extra))
    return {role: wait_for_pid(folder, role) for role in ("job", "child", "grandchild")}


@pytest.mark.slow
@pytest.mark.parametrize("use_pidfd", MODES)
def test_the_whole_tree_is_stopped_and_a_setsid_grandchild_is_killed(
    folder: Path, use_pidfd: bool
) -> None:
    tree = start_tree(folder)
    job, child, grandchild = tree["job"], tree["child"], tree["grandchild"]
    assert psutil.Process(job.pid).ppid() != os.getpid()  # reparented: not our child
    assert os.getsid(grandchild.pid) != os.getsid(job.pid)  # out of reach of a group signal

    result = stop_tree(job, grace_s=0.5, use_pidfd=use_pidfd)

    assert result.tree[0] == job
    assert set(result.tree) == {job, child, grandchild}
    # Job and child exit on SIGTERM; the grandchild records it, carries on, and is killed.
    for role in ("job", "child", "grandchild"):
        assert signals_got(folder, role) == ["SIGTERM"], role
    assert result.got(job) == [signal.SIGTERM]
    assert result.got(grandchild) == [signal.SIGTERM, signal.SIGKILL]
    assert result.killed == (grandchild,)
    assert result.survivors == ()
    assert not any(running(who) for who in (job, child, grandchild))
    assert "SIGKILL to pid" in result.detail


@pytest.mark.slow
def test_an_ancestor_waiting_for_the_job_is_never_signalled(folder: Path) -> None:
    launch_detached(role_argv(folder, "wrapper", "tree"))
    wrapper = wait_for_pid(folder, "wrapper")
    job = wait_for_pid(folder, "job")
    grandchild = wait_for_pid(folder, "grandchild")
    assert psutil.Process(job.pid).ppid() == wrapper.pid

    result = stop_tree(job, grace_s=0.5)

    assert wrapper not in result.tree
    assert grandchild in result.killed
    wait_until(lambda: (folder / "wrapper.status").exists(), what="the wrapper saw the job end")
    assert (folder / "wrapper.status").read_text() == "0"  # the job's own exit on SIGTERM
    assert signals_got(folder, "wrapper") == []
    assert running(wrapper)


@pytest.mark.slow
def test_a_process_started_during_the_grace_is_stopped_too(folder: Path) -> None:
    # On SIGTERM the job starts a saver that ignores SIGTERM, then takes 1.5 s to exit.
    launch_detached(role_argv(folder, "job", "saver"))
    job = wait_for_pid(folder, "job")

    result = stop_tree(job, grace_s=3.0)

    (saver,) = result.late
    assert result.got(saver) == [signal.SIGTERM, signal.SIGKILL]
    assert not running(saver)
    assert saver not in result.survivors
    assert "started during the grace" in result.detail


def test_the_stop_signal_is_the_one_asked_for(folder: Path) -> None:
    launch_detached(role_argv(folder, "job"))
    job = wait_for_pid(folder, "job")

    result = stop_tree(job, grace_s=5.0, stop_signal=signal.SIGINT)

    assert signals_got(folder, "job") == ["SIGINT"]
    assert result.sent == ((job, signal.SIGINT),)
    assert result.killed == ()
    assert not running(job)


def test_sigkill_as_the_stop_signal_kills_at_once(folder: Path) -> None:
    launch_detached(role_argv(folder, "sleeper"))
    sleeper = wait_for_pid(folder, "sleeper")
    started = time.monotonic()

    result = stop_tree(sleeper, grace_s=30.0, stop_signal=signal.SIGKILL)

    assert time.monotonic() - started < 5.0  # no grace after a SIGKILL
    assert result.sent == ((sleeper, signal.SIGKILL),)
    assert signals_got(folder, "sleeper") == []
    assert not running(sleeper)


@pytest.mark.slow
@pytest.mark.parametrize("use_pidfd", MODES)
def test_a_live_process_with_another_create_time_is_refused(folder: Path, use_pidfd: bool) -> None:
    launch_detached(role_argv(folder, "sleeper"))
    real = wait_for_pid(folder, "sleeper")
    # The pid of a live process with the create time of another: what a reused pid looks like.
    stale = ProcessIdentity(real.pid, real.create_time - 60.0)

    assert pin(stale, use_pidfd=use_pidfd) == "reused"
    result = stop_tree(stale, grace_s=0.1, use_pidfd=use_pidfd)

    assert result.sent == ()
    assert result.tree == ()
    assert result.refused == ((stale, "pid reused"),)
    assert "not the job" in result.detail
    time.sleep(0.1)
    assert signals_got(folder, "sleeper") == []
    assert running(real)


def test_a_process_that_has_exited_is_gone_not_signalled(tmp_path: Path) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = ProcessIdentity.of(done.pid)
    done.wait()

    result = stop_tree(identity, grace_s=0.1)

    assert result.sent == ()
    assert result.gone == (identity,)
    assert "had already exited" in result.detail


@contextlib.contextmanager
def killed_on_exit(process: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.skipif(
    not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK), reason="needs root to reuse a pid"
)
@pytest.mark.slow
@pytest.mark.parametrize("use_pidfd", MODES)
def test_a_reused_pid_is_never_signalled(folder: Path, use_pidfd: bool) -> None:
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    old = ProcessIdentity.of(first.pid)
    first.kill()
    first.wait()
    # The kernel's create times have clock-tick resolution: let the next one differ.
    time.sleep(0.05)

    second = start_with_pid(old.pid, role_argv(folder, "sleeper"))
    if second is None:
        pytest.skip(f"pid {old.pid} went elsewhere on a busy host")
    with killed_on_exit(second):
        now = wait_for_pid(folder, "sleeper")
        assert now.pid == old.pid and now != old

        result = stop_tree(old, grace_s=0.1, use_pidfd=use_pidfd)

        assert result.sent == ()
        assert result.refused == ((old, "pid reused"),)
        assert signals_got(folder, "sleeper") == []
        assert second.poll() is None


@pytest.mark.slow
def test_dry_run_names_the_tree_and_signals_nothing(folder: Path) -> None:
    tree = start_tree(folder)

    result = stop_tree(tree["job"], grace_s=0.1, dry_run=True)

    assert set(result.tree) == set(tree.values())
    assert result.sent == ()
    assert f"would send SIGTERM to pid {tree['job'].pid}" in result.detail
    time.sleep(0.1)
    assert all(signals_got(folder, role) == [] for role in tree)
    assert all(running(who) for who in tree.values())


def test_sentinel_is_left_out_when_it_runs_below_the_root() -> None:
    # pytest stands in for a sentinel started by the job (``sentinel watch --pid $$ & exec``).
    parent = ProcessIdentity.of(os.getppid())

    result = stop_tree(parent, grace_s=0.1, dry_run=True)

    assert result.tree[0] == parent
    assert os.getpid() not in {who.pid for who in result.tree}
    assert result.sent == ()


@pytest.mark.slow
def test_members_known_beforehand_are_stopped_even_when_the_root_is_gone(folder: Path) -> None:
    tree = start_tree(folder)
    os.kill(tree["job"].pid, signal.SIGKILL)
    wait_until(lambda: not running(tree["job"]), what="the job died")

    result = stop_tree(
        tree["job"],
        grace_s=5.0,
        members=[tree["child"], tree["grandchild"]],
        stop_signal=signal.SIGKILL,
    )

    assert result.gone == (tree["job"],)
    assert set(result.killed) == {tree["child"], tree["grandchild"]}
    assert not running(tree["grandchild"])


@pytest.mark.slow
def test_a_job_that_is_sentinels_own_child_is_stopped_and_reaped_by_it(folder: Path) -> None:
    # Run mode: sentinel started the job, so sentinel reaps it and learns its status.
    with subprocess.Popen(role_argv(folder, "job", "tree")) as job_process:
        grandchild = wait_for_pid(folder, "grandchild")
        job = ProcessIdentity.of(job_process.pid)

        result = stop_tree(job, grace_s=0.5)

        assert job_process.wait(timeout=5.0) == 0  # its SIGTERM handler exits 0
    assert result.got(job) == [signal.SIGTERM]
    assert grandchild in result.killed
    assert not running(grandchild)


# Sentinel run by the job's own wrapper (``sentinel watch --pid $$ & exec torchrun``): it stops
# its parent's tree, and neither it nor a child it starts during the grace is signalled.
SENTINEL_BELOW_THE_ROOT = """
import json, os, subprocess, sys, threading, time
from pathlib import Path
from sentinel.process.signal_tree import begin_stop, stop_tree
from sentinel.process.identity import ProcessIdentity
folder = Path(sys.argv[1])
saver_argv = json.loads(sys.argv[2])
while not (folder / "sleeper.pid").exists():
    time.sleep(0.01)
def start_own_child():
    time.sleep(0.3)
    subprocess.Popen(saver_argv)
threading.Thread(target=start_own_child).start()
result = stop_tree(ProcessIdentity.of(os.getppid()), grace_s=1.5)
sent = [[who.pid, sig.name] for who, sig in result.sent]
tree = [who.pid for who in result.tree]
# Whole or not at all (temp file and rename): the test reads it as soon as it exists.
(folder / "result.json.tmp").write_text(json.dumps({"tree": tree, "sent": sent}))
(folder / "result.json.tmp").replace(folder / "result.json")
"""
# The root outlives SIGTERM (as torchrun does while its workers stop), so that the grace's
# looks walk the tree through it.
ROOT_OF_TWO = """
import json, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *_: None)
children = [subprocess.Popen(argv) for argv in json.loads(sys.argv[1])]
time.sleep(60)
"""


@pytest.mark.slow
def test_sentinel_below_the_root_spares_itself_and_its_own_children(folder: Path) -> None:
    sentinel_argv = [
        sys.executable,
        "-c",
        SENTINEL_BELOW_THE_ROOT,
        str(folder),
        json.dumps(role_argv(folder, "saver")),
    ]
    root_pid = launch_detached(
        [
            sys.executable,
            "-c",
            ROOT_OF_TWO,
            json.dumps([role_argv(folder, "sleeper"), sentinel_argv]),
        ]
    )
    sleeper = wait_for_pid(folder, "sleeper")
    wait_until(lambda: (folder / "result.json").exists(), what="the stand-in sentinel finished")
    result = json.loads((folder / "result.json").read_text())
    saver = wait_for_pid(folder, "saver")

    signalled = {pid for pid, _ in result["sent"]}
    assert {root_pid, sleeper.pid} <= signalled
    assert saver.pid not in result["tree"] and saver.pid not in signalled
    assert signals_got(folder, "saver") == []
    assert running(saver)
    assert all(pid in {root_pid, sleeper.pid} for pid in signalled)  # never itself


def as_nobody(identity: ProcessIdentity) -> dict[str, object]:
    """What a sentinel running as user nobody makes of ``identity``: it forks, drops to
    nobody (no exec: the interpreter needs no access) and reports through a pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_fd)
            os.setgid(65534)
            os.setuid(65534)
            pinned = pin(identity)
            assert not isinstance(pinned, str), pinned
            may_signal = pinned.may_signal()
            pinned.close()
            result = stop_tree(identity, grace_s=0.1)
            said = {
                "may_signal": may_signal,
                "refused": [reason for _, reason in result.refused],
                "sent": len(result.sent),
            }
            os.write(write_fd, json.dumps(said).encode())
        except BaseException as exc:
            os.write(write_fd, json.dumps({"error": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as reader:
        data = reader.read()
    os.waitpid(pid, 0)
    said: dict[str, object] = json.loads(data)
    return said


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_another_users_process_is_refused_and_said_so_up_front(folder: Path) -> None:
    launch_detached(role_argv(folder, "sleeper"))
    sleeper = wait_for_pid(folder, "sleeper")

    said = as_nobody(sleeper)

    assert said == {"may_signal": False, "refused": ["SIGTERM not permitted"], "sent": 0}
    assert signals_got(folder, "sleeper") == []
    assert running(sleeper)


@pytest.mark.slow
def test_the_tree_has_the_signal_before_the_other_members_are_looked_for() -> None:
    with blocking_sigterm() as identity:
        pending_when_asked: list[bool] = []

        def members() -> list[ProcessIdentity]:
            pending_when_asked.append(sigterm_pending(identity.pid))
            return []

        result = stop_tree(identity, grace_s=0.1, members=members)
    assert pending_when_asked == [True]
    assert result.got(identity) == [signal.SIGTERM, signal.SIGKILL]


def sigterm_pending(pid: int) -> bool:
    """Whether a SIGTERM waits in ``pid``'s shared pending set (it blocks the signal)."""
    status = Path(f"/proc/{pid}/status").read_text()
    pending = next(row for row in status.splitlines() if row.startswith("ShdPnd:"))
    return int(pending.split()[1], 16) >> (signal.SIGTERM - 1) & 1 == 1


@contextlib.contextmanager
def blocking_sigterm() -> Iterator[ProcessIdentity]:
    """A job that blocks SIGTERM, so a SIGTERM sent stays pending where /proc shows it."""
    code = (
        "import signal, sys, time\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert job.stdout is not None and job.stdout.readline() == b"ready\n"
        yield ProcessIdentity.of(job.pid)
    finally:
        job.kill()
        job.wait()
        assert job.stdout is not None
        job.stdout.close()


@pytest.mark.slow
def test_begin_stop_signals_the_tree_and_finish_does_the_rest() -> None:
    with blocking_sigterm() as identity:
        begun = begin_stop(identity)
        assert sigterm_pending(identity.pid)
        assert begun.sent == ((identity, signal.SIGTERM),)
        result = begun.finish(grace_s=0.1)
    assert result.got(identity) == [signal.SIGTERM, signal.SIGKILL]
    assert result.killed == (identity,)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dry_run", "already_sent"])
def test_begin_stop_sends_nothing_on_a_dry_run_or_a_signal_already_sent(how: str) -> None:
    with blocking_sigterm() as identity:
        begun = begin_stop(identity, **{how: True})
        assert not sigterm_pending(identity.pid)
        assert begun.sent == ()
        result = begun.finish(grace_s=0.1)
    assert result.got(identity) == ([] if how == "dry_run" else [signal.SIGKILL])
