"""Tests for safe termination, with real child processes that really get signals."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from sentinel.actions.terminate import KILL_WAIT_S, ProcessIdentity, send_sigterm, terminate

DEADLINE_S = 5.0

# Echoes stdin lines back, so a round trip proves it is alive and was not signalled:
# a pending SIGTERM with the default action kills it before it could answer.
ECHO = """
import sys
print("ready", flush=True)
for line in sys.stdin:
    print(line.strip(), flush=True)
"""

GRACEFUL = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("ready", flush=True)
time.sleep(60)
"""

STUBBORN = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""

GRANDCHILD = """
import pathlib, signal, sys, time
def on_term(*_):
    pathlib.Path(sys.argv[1]).write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
"""

PARENT = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {GRANDCHILD!r}, sys.argv[1]],
                         stdout=subprocess.PIPE)
child.stdout.readline()
print("ready", child.pid, flush=True)
child.wait()
"""


def read_line(proc: subprocess.Popen[bytes], timeout: float = DEADLINE_S) -> str:
    """Read one line of the child's stdout, failing after ``timeout``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output from pid {proc.pid} within {timeout} s"
    return proc.stdout.readline().decode().strip()


def assert_alive(proc: subprocess.Popen[bytes]) -> None:
    """Round-trip a line through an ECHO child: proves it runs and got no SIGTERM."""
    assert proc.stdin is not None
    proc.stdin.write(b"ping\n")
    proc.stdin.flush()
    assert read_line(proc) == "ping"
    assert proc.poll() is None


def wait_until(condition: Callable[[], bool], timeout: float = DEADLINE_S) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def popen_waiter(proc: subprocess.Popen[bytes]) -> Callable[[float], bool]:
    def wait_exit(timeout: float) -> bool:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    return wait_exit


def gone_or_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start ``python -c CODE`` in its own session, wait for "ready"; kill leftovers after."""
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            bufsize=0,
        )
        started.append(proc)
        assert read_line(proc).startswith("ready")
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(DEADLINE_S)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("use_waiter", [True, False], ids=["popen-wait", "no-reap"])
def test_graceful_exit_on_sigterm(spawn: Spawn, use_waiter: bool) -> None:
    proc = spawn(GRACEFUL)
    identity = ProcessIdentity.of(proc.pid)
    result = terminate(
        identity, grace_s=DEADLINE_S, wait_exit=popen_waiter(proc) if use_waiter else None
    )
    assert (result.signalled, result.killed, result.exited) == (True, False, True)
    assert result.detail.startswith(f"SIGTERM sent to process group {proc.pid}, exited after")
    assert result.elapsed_s < DEADLINE_S
    assert proc.wait(DEADLINE_S) == 0


@pytest.mark.slow  # waits out a real grace period: the timing is the point
@pytest.mark.parametrize("use_waiter", [True, False], ids=["popen-wait", "no-reap"])
def test_sigterm_ignored_gets_sigkill_after_grace(spawn: Spawn, use_waiter: bool) -> None:
    proc = spawn(STUBBORN)
    grace_s = 0.5
    started = time.monotonic()
    result = terminate(
        ProcessIdentity.of(proc.pid),
        grace_s=grace_s,
        wait_exit=popen_waiter(proc) if use_waiter else None,
    )
    took_s = time.monotonic() - started
    assert (result.signalled, result.killed, result.exited) == (True, True, True)
    assert f"still running after {grace_s:g} s, SIGKILL sent to process group" in result.detail
    # SIGKILL came after the grace, never before it (a load can only make it later); and
    # the job was gone within the wait for the kill, not left running.
    assert grace_s <= result.elapsed_s <= took_s < grace_s + KILL_WAIT_S
    assert proc.wait(DEADLINE_S) == -signal.SIGKILL


@pytest.mark.slow  # waits out a real grace period
def test_sigkill_path_without_pidfd(spawn: Spawn, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = spawn(STUBBORN)
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    result = terminate(ProcessIdentity.of(proc.pid), grace_s=0.3)
    assert (result.signalled, result.killed, result.exited) == (True, True, True)
    assert 0.3 <= result.elapsed_s < 0.3 + KILL_WAIT_S
    assert proc.wait(DEADLINE_S) == -signal.SIGKILL


def test_grandchild_gets_sigterm_through_the_group(spawn: Spawn, tmp_path: Path) -> None:
    marker = tmp_path / "grandchild-got"
    proc = spawn(PARENT, str(marker))
    identity = ProcessIdentity.of(proc.pid)
    result = terminate(identity, grace_s=DEADLINE_S, wait_exit=popen_waiter(proc))
    assert (result.signalled, result.killed, result.exited) == (True, False, True)
    assert wait_until(lambda: marker.exists() and marker.read_text() == "SIGTERM")


def test_process_group_false_signals_the_pid_alone(spawn: Spawn, tmp_path: Path) -> None:
    marker = tmp_path / "grandchild-got"
    proc = spawn(GRANDCHILD, str(marker))
    result = terminate(
        ProcessIdentity.of(proc.pid),
        grace_s=DEADLINE_S,
        process_group=False,
        wait_exit=popen_waiter(proc),
    )
    assert result.detail.startswith(f"SIGTERM sent to pid {proc.pid}")
    assert result.exited
    assert marker.read_text() == "SIGTERM"


def test_not_a_group_leader_signals_the_pid_alone() -> None:
    # Started without a new session: its pgid is ours, which must never be signalled.
    proc = subprocess.Popen(
        [sys.executable, "-c", GRACEFUL], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert read_line(proc) == "ready"
        result = terminate(
            ProcessIdentity.of(proc.pid), grace_s=DEADLINE_S, wait_exit=popen_waiter(proc)
        )
        assert result.detail.startswith(f"SIGTERM sent to pid {proc.pid}")
        assert result.exited
    finally:
        proc.kill()
        proc.wait(DEADLINE_S)
        assert proc.stdout is not None
        proc.stdout.close()


def test_reused_pid_is_not_signalled(spawn: Spawn) -> None:
    proc = spawn(ECHO)
    real = ProcessIdentity.of(proc.pid)
    impostor = ProcessIdentity(proc.pid, real.create_time - 1000.0)
    assert real.matches()
    assert not impostor.matches()

    result = terminate(impostor, grace_s=0.5, wait_exit=popen_waiter(proc))
    assert (result.signalled, result.killed) == (False, False)
    assert result.detail == f"pid {proc.pid} is no longer the job (pid reused); not signalled"
    assert not send_sigterm(impostor)
    assert_alive(proc)


def test_dry_run_sends_nothing(spawn: Spawn, caplog: pytest.LogCaptureFixture) -> None:
    proc = spawn(ECHO)
    identity = ProcessIdentity.of(proc.pid)
    with caplog.at_level("WARNING", logger="sentinel.actions.terminate"):
        result = terminate(identity, grace_s=30.0, dry_run=True)
        assert not send_sigterm(identity, dry_run=True)
    assert (result.signalled, result.killed, result.exited) == (False, False, False)
    assert result.detail == (
        f"dry run: would SIGTERM process group {proc.pid}, then SIGKILL if still running after 30 s"
    )
    # It waited for nothing: far under the 30 s grace however loaded the machine is.
    assert result.elapsed_s < 15.0
    assert sum("dry run" in r.getMessage() for r in caplog.records) == 2
    assert_alive(proc)


def test_already_gone_is_not_signalled(spawn: Spawn) -> None:
    proc = spawn(ECHO)
    identity = ProcessIdentity.of(proc.pid)
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(DEADLINE_S) == 0
    assert not identity.matches()

    for waiter in (None, popen_waiter(proc)):
        result = terminate(identity, grace_s=0.5, wait_exit=waiter)
        assert (result.signalled, result.killed, result.exited) == (False, False, True)
        assert "not signalled" in result.detail
    assert terminate(identity, grace_s=0.5, dry_run=True).exited
    assert not send_sigterm(identity)


def test_send_sigterm_alone(spawn: Spawn) -> None:
    proc = spawn(GRACEFUL)
    assert send_sigterm(ProcessIdentity.of(proc.pid))
    assert proc.wait(DEADLINE_S) == 0


def test_identity_of_missing_pid_raises(spawn: Spawn) -> None:
    proc = spawn(ECHO)
    pid = proc.pid
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(DEADLINE_S)
    assert wait_until(lambda: gone_or_zombie(pid))
    if psutil.pid_exists(pid):
        pytest.skip("pid was reused before the check")  # pragma: no cover
    with pytest.raises(ProcessLookupError):
        ProcessIdentity.of(pid)
