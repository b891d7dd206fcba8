"""A process pinned by a pidfd and checked against its identity, so a reused pid is never hit.

A pidfd refers to one process, not to a pid: once that process is gone, signals sent
through it fail with ESRCH instead of reaching whoever holds the pid next. The fd is
opened first and the identity (pid + create time) checked after, while the fd already
pins the process: if the pinned process is still running after the check, the create
time that was read was its own. Without pidfds (Linux before 5.3) the identity is
checked right before each signal, which narrows the window without closing it.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import select
import signal
from typing import Literal

import psutil

from sentinel.process.identity import ProcessIdentity

log = logging.getLogger(__name__)

#: What a signal through a pinned process came to.
Delivery = Literal["sent", "gone", "reused", "denied"]
#: Why a process could not be pinned: it has exited, its pid is another process's now,
#: or its create time cannot be read (another user's process under hidepid).
PinRefusal = Literal["gone", "reused", "unknown"]


@functools.cache
def pidfds_work() -> bool:
    """Whether this Python and kernel can open and signal pidfds (Linux 5.3 and later)."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return False
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:
        return False
    os.close(fd)
    return True


class PinnedProcess:
    """One process, held through a pidfd (``fd``), or by identity where pidfds do not work."""

    def __init__(self, identity: ProcessIdentity, fd: int | None) -> None:
        self.identity = identity
        #: The pidfd; polls readable once the process has exited. None without pidfds.
        self.fd = fd

    def send(self, sig: signal.Signals) -> Delivery:
        """Send ``sig`` to this process and no other."""
        if self.fd is None:
            return self._send_checked(sig)
        if self.has_exited():
            return "gone"
        try:
            signal.pidfd_send_signal(self.fd, sig)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            return "denied"
        except OSError as exc:
            if exc.errno == errno.EBADF:  # closed meanwhile: treated as no longer ours
                return "gone"
            raise
        return "sent"

    def may_signal(self) -> bool:
        """Whether sentinel is allowed to signal this process (signal 0: nothing is sent).

        False means another user's process without CAP_KILL: say so at start, not at the
        first incident."""
        try:
            if self.fd is None:
                os.kill(self.identity.pid, 0)
            else:
                signal.pidfd_send_signal(self.fd, 0)
        except PermissionError:
            return False
        except (ProcessLookupError, OSError):
            return True  # gone: nothing is refused
        return True

    def has_exited(self) -> bool:
        """Whether the process has exited (a zombie counts: it runs no more code)."""
        if self.fd is None:
            return self.identity.liveness() in ("gone", "reused") or _is_zombie(self.identity.pid)
        try:
            return _readable(self.fd, 0.0)
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        """Release the pidfd; safe to call twice."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def _send_checked(self, sig: signal.Signals) -> Delivery:
        liveness = self.identity.liveness()
        if liveness == "gone" or _is_zombie(self.identity.pid):
            return "gone"
        if liveness != "same":
            log.warning(
                "pid %d is not the process it was (%s); not sending %s",
                self.identity.pid,
                liveness,
                sig.name,
            )
            return "reused"
        try:
            os.kill(self.identity.pid, sig)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            return "denied"
        return "sent"

    def __repr__(self) -> str:
        held = "pidfd" if self.fd is not None else "identity"
        return f"PinnedProcess(pid={self.identity.pid}, {held})"


def pin(identity: ProcessIdentity, *, use_pidfd: bool | None = None) -> PinnedProcess | PinRefusal:
    """Pin the process ``identity`` names, or say why not.

    ``use_pidfd`` False forces the fallback (identity checked before each signal); the
    default uses pidfds wherever they work.
    """
    if use_pidfd is None:
        use_pidfd = pidfds_work()
    if not use_pidfd:
        liveness = identity.liveness()
        if liveness == "same" and _is_zombie(identity.pid):
            return "gone"
        return PinnedProcess(identity, None) if liveness == "same" else liveness
    try:
        fd = os.pidfd_open(identity.pid)
    except ProcessLookupError:
        return "gone"
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.EINVAL):
            return "gone"
        raise
    # The fd pins whichever process held the pid when it was opened: check it is ours.
    liveness = identity.liveness()
    if liveness != "same":
        os.close(fd)
        return liveness
    if _readable(fd, 0.0):
        # Exited since: the create time read may have been of a later holder of the pid.
        os.close(fd)
        return "gone"
    return PinnedProcess(identity, fd)


def _readable(fd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
