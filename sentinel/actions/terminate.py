"""Terminate a training job safely: SIGTERM, a grace period, then SIGKILL.

Every signal is preceded by an identity check (pid + create time), so a pid the
kernel has handed to another process is never signalled. Processes sentinel did
not start are never reaped: their exit is observed through a pidfd or by polling.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from sentinel.sources.identity import ProcessIdentity

log = logging.getLogger(__name__)

# How long to wait for the kernel to tear a process down after SIGKILL.
KILL_WAIT_S = 5.0
_POLL_FIRST_S = 0.005
_POLL_MAX_S = 0.1


@dataclass(frozen=True)
class TerminateResult:
    """What ``terminate`` did and how the process ended up."""

    signalled: bool
    killed: bool
    exited: bool
    elapsed_s: float
    detail: str


def send_sigterm(
    identity: ProcessIdentity, *, process_group: bool = True, dry_run: bool = False
) -> bool:
    """Send SIGTERM to the job (its process group by default); return whether it was sent."""
    sent, what = _signal_checked(identity, signal.SIGTERM, process_group, dry_run)
    if dry_run and what.startswith("dry run"):
        log.warning("%s", what)
    return sent


def terminate(
    identity: ProcessIdentity,
    *,
    grace_s: float,
    dry_run: bool = False,
    process_group: bool = True,
    wait_exit: Callable[[float], bool] | None = None,
) -> TerminateResult:
    """SIGTERM the job, wait up to ``grace_s`` for it to exit, then SIGKILL it.

    ``wait_exit(timeout) -> exited`` is passed by the parent that started the job
    (only it may reap); without it, exit is observed without reaping.
    """
    started = time.monotonic()

    def result(signalled: bool, killed: bool, exited: bool, detail: str) -> TerminateResult:
        return TerminateResult(signalled, killed, exited, time.monotonic() - started, detail)

    sent, what = _signal_checked(identity, signal.SIGTERM, process_group, dry_run)
    if dry_run and what.startswith("dry run"):
        what += f", then SIGKILL if still running after {grace_s:g} s"
        log.warning("%s", what)
        return result(False, False, False, what)
    if not sent:
        exited = identity.liveness() in ("gone", "reused") or _is_zombie(identity.pid)
        return result(False, False, exited, what)

    waiter = wait_exit or (lambda timeout: _wait_gone(identity, timeout))
    if _safe_wait(waiter, grace_s):
        elapsed = time.monotonic() - started
        log.info("%s; exited after %.1f s", what, elapsed)
        return result(True, False, True, f"{what}, exited after {elapsed:.1f} s")

    killed, kill_what = _signal_checked(identity, signal.SIGKILL, process_group, False)
    if not killed:
        # Gone (or reaped and reused) between the grace check and SIGKILL.
        exited = identity.liveness() in ("gone", "reused") or _is_zombie(identity.pid)
        return result(
            True, False, exited, f"{what}; still running after {grace_s:g} s; {kill_what}"
        )
    exited = _safe_wait(waiter, KILL_WAIT_S)
    detail = f"{what}; still running after {grace_s:g} s, {kill_what}"
    if exited:
        detail += f", exited after {time.monotonic() - started:.1f} s"
        log.warning("%s", detail)
    else:
        stuck = " (stuck in uninterruptible sleep, disk-sleep)" if _in_disk_sleep(identity) else ""
        detail += f", still not gone after {KILL_WAIT_S:g} s{stuck}"
        log.error("%s", detail)
    return result(True, True, exited, detail)


def _signal_checked(
    identity: ProcessIdentity, sig: signal.Signals, process_group: bool, dry_run: bool
) -> tuple[bool, str]:
    """Check identity, then send ``sig``; return (sent, what happened in words)."""
    pid = identity.pid
    liveness = identity.liveness()
    if liveness == "gone":
        return False, f"pid {pid} has already exited; not signalled"
    if liveness == "reused":
        log.warning("pid %d is no longer the job (pid reused); not signalling %s", pid, sig.name)
        return False, f"pid {pid} is no longer the job (pid reused); not signalled"
    if liveness == "unknown":
        log.warning("cannot verify that pid %d is the job; not signalling %s", pid, sig.name)
        return False, f"cannot verify that pid {pid} is the job (access denied); not signalled"
    use_group = process_group and _leads_own_group(pid)
    target = f"process group {pid}" if use_group else f"pid {pid}"
    if dry_run:
        return False, f"dry run: would {sig.name} {target}"
    try:
        if use_group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        return False, f"pid {pid} exited before {sig.name}; not signalled"
    except PermissionError:
        log.error("not permitted to send %s to %s", sig.name, target)
        return False, f"permission denied sending {sig.name} to {target}"
    log.info("%s sent to %s", sig.name, target)
    return True, f"{sig.name} sent to {target}"


def _leads_own_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except (ProcessLookupError, PermissionError):
        return False


def _safe_wait(waiter: Callable[[float], bool], timeout: float) -> bool:
    try:
        return waiter(timeout)
    except (ProcessLookupError, ChildProcessError):
        return True


def _wait_gone(identity: ProcessIdentity, timeout: float) -> bool:
    """Wait up to ``timeout`` for the process to exit, without reaping it."""
    deadline = time.monotonic() + timeout
    pidfd = _open_pidfd(identity)
    if pidfd is not None:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            # Readable once the process has exited (zombie or reaped).
            return bool(poller.poll(max(0.0, timeout) * 1000))
        finally:
            os.close(pidfd)
    delay = _POLL_FIRST_S
    while True:
        if identity.liveness() in ("gone", "reused") or _is_zombie(identity.pid):
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _POLL_MAX_S)


def _open_pidfd(identity: ProcessIdentity) -> int | None:
    """Open a pidfd for the job, or None where pidfds are unavailable or it is gone."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        pidfd: int = pidfd_open(identity.pid)
    except OSError:
        return None
    # The pidfd pins whichever process holds the pid now: make sure it is the job.
    if identity.liveness() != "same":
        os.close(pidfd)
        return None
    return pidfd


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _in_disk_sleep(identity: ProcessIdentity) -> bool:
    try:
        return identity.matches() and psutil.Process(identity.pid).status() == (
            psutil.STATUS_DISK_SLEEP
        )
    except psutil.Error:
        return False
