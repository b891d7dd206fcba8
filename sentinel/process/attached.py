"""A job sentinel did not start (``sentinel watch``), followed to its end through a pidfd.

Sentinel is not the job's parent, so it may not reap it and cannot learn its exit
status from the kernel (``waitid`` on a non-child is ECHILD): the end is seen as the
pidfd turning readable, and the status comes from whoever started the job (a systemd
unit's ``ExecMainStatus``) or is None, said honestly, when nobody can tell.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable

import psutil

from sentinel.process.identity import ProcessIdentity
from sentinel.process.pidfd import PinnedProcess, pin

log = logging.getLogger(__name__)

#: Called once, from the watching thread, with the job's exit status (None: not knowable).
OnExit = Callable[[int | None], None]
#: Asked once the job has ended: its exit status, where its starter reports one.
ExitStatus = Callable[[ProcessIdentity], int | None]

#: Without pidfds, how often the job is looked for.
POLL_S = 0.5


class AttachedJob:
    """One attempt of a job started elsewhere: its identity, its tree, its end."""

    def __init__(
        self,
        identity: ProcessIdentity,
        *,
        on_exit: OnExit,
        exit_status: ExitStatus | None = None,
        use_pidfd: bool | None = None,
        poll_s: float = POLL_S,
    ) -> None:
        """``exit_status``: where the status comes from (``Target.exit_status``); without it
        the status is None. ``use_pidfd`` False polls every ``poll_s`` instead."""
        self.identity = identity
        #: The exit status once the job has ended (None also when it is not knowable).
        self.status: int | None = None
        #: Whether sentinel is permitted to signal it (False: another user's, no CAP_KILL).
        self.may_signal = True
        self._on_exit = on_exit
        self._exit_status = exit_status
        self._use_pidfd = use_pidfd
        self._poll_s = poll_s
        self._pinned: PinnedProcess | None = None
        self._ended = threading.Event()
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None

    @property
    def exited(self) -> bool:
        """Whether the job has ended (and ``on_exit`` has been called)."""
        return self._ended.is_set()

    def start(self) -> None:
        """Pin the job and watch for its end on a daemon thread.

        A job already gone (or whose pid another process holds now) ends at once.
        PermissionError: its create time cannot be read, so it cannot be told apart.
        ``may_signal`` says whether sentinel could stop it (another user's process).
        """
        if self._thread is not None:
            return
        pinned = pin(self.identity, use_pidfd=self._use_pidfd)
        if pinned == "unknown":
            raise PermissionError(
                f"cannot read the create time of pid {self.identity.pid} (/proc hides it: "
                "hidepid, ProtectProc): run sentinel as the job's user"
            )
        if isinstance(pinned, PinnedProcess):
            self.may_signal = pinned.may_signal()
            if not self.may_signal:
                log.warning(
                    "not permitted to signal pid %d: sentinel could not stop it; run sentinel "
                    "as the job's user, or give it CAP_KILL",
                    self.identity.pid,
                )
            self._pinned = pinned
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._watch, name="attached-job", daemon=True)
        self._thread.start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once the job has ended (within ``timeout_s``)."""
        return self._ended.wait(timeout_s)

    def tree(self) -> list[ProcessIdentity]:
        """The job's root and all its descendants now; empty once it has ended."""
        pinned = self._pinned
        if pinned is None or self.exited:
            return []
        try:
            root = psutil.Process(self.identity.pid)
            # Checked after the handle was made, so it cannot be a later holder of the pid.
            if pinned.has_exited() or self.identity.liveness() != "same":
                return []
            children = root.children(recursive=True)
        except psutil.Error:
            return []
        found = [self.identity]
        for child in children:
            with contextlib.suppress(psutil.Error):
                found.append(ProcessIdentity(child.pid, child.create_time()))
        return found

    def stop(self) -> None:
        """Stop watching, without ``on_exit``; the job itself is left alone. Safe twice."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if thread is not threading.current_thread():
            thread.join()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._pinned is not None:
            self._pinned.close()

    def _watch(self) -> None:
        pinned = self._pinned
        if pinned is not None and pinned.fd is not None:
            poller = select.poll()
            poller.register(pinned.fd, select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            while not self._stopping.is_set():
                ready = {fd for fd, _ in poller.poll()}
                if pinned.fd in ready:
                    break
        elif pinned is not None:
            while not pinned.has_exited():
                if self._stopping.wait(self._poll_s):
                    break
        if self._stopping.is_set():
            return
        self._end()

    def _end(self) -> None:
        if self._exit_status is not None:
            try:
                self.status = self._exit_status(self.identity)
            except Exception:
                log.exception("reading the exit status of pid %d failed", self.identity.pid)
        log.info(
            "pid %d has ended (exit status %s)",
            self.identity.pid,
            "unknown" if self.status is None else self.status,
        )
        self._ended.set()
        try:
            self._on_exit(self.status)
        except Exception:
            log.exception("handling the end of pid %d failed", self.identity.pid)
