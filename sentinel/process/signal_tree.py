"""Stop a job's whole process tree: the stop signal, a grace period, SIGKILL to survivors.

The tree is the root and every descendant, including those that called ``setsid()``
(a process-group signal misses them). It is collected before the first signal, because
a parent that dies on it hands its children to init and the walk from the root no
longer finds them, and looked at again during the grace for processes started since.
Every process is pinned through a pidfd checked against its identity (``sources.pidfd``),
so a pid the kernel hands to someone else is never signalled. Ancestors of the root (a
wrapper waiting for the verdict, the container's shell) are never part of the tree, and
neither is sentinel itself when it runs below the job (``sentinel watch --pid $$ & exec``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

from sentinel.process.identity import ProcessIdentity
from sentinel.process.pidfd import PinnedProcess, pin
from sentinel.process.proctree import PROC_CHILDREN, descendant_pids

log = logging.getLogger(__name__)

#: How long to wait for the kernel to tear a process down after SIGKILL.
KILL_WAIT_S = 5.0

#: How often the grace looks for processes the tree started since the last look.
RESCAN_S = 0.25
#: Without pidfds, how often exits are looked for.
_FALLBACK_POLL_S = 0.05
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)


@dataclass(frozen=True)
class TreeStop:
    """What ``stop_tree`` did: who got which signal, who was gone, who outlived SIGKILL."""

    #: Every process of the job that was found, the root first, late arrivals last.
    tree: tuple[ProcessIdentity, ...]
    #: Each signal delivered, in order.
    sent: tuple[tuple[ProcessIdentity, signal.Signals], ...]
    #: Processes that had exited before a signal reached them.
    gone: tuple[ProcessIdentity, ...]
    #: Processes not signalled, and why (pid reused, create time unreadable, not permitted).
    refused: tuple[tuple[ProcessIdentity, str], ...]
    #: Processes still running after SIGKILL and ``kill_wait_s`` (stuck in disk sleep).
    survivors: tuple[ProcessIdentity, ...]
    #: Found during the grace: started after the first signal went out.
    late: tuple[ProcessIdentity, ...]
    elapsed_s: float
    detail: str

    @property
    def signalled(self) -> bool:
        """Whether any signal was delivered."""
        return bool(self.sent)

    @property
    def killed(self) -> tuple[ProcessIdentity, ...]:
        """The processes that got SIGKILL."""
        return tuple(who for who, sig in self.sent if sig == signal.SIGKILL)

    def got(self, identity: ProcessIdentity) -> list[signal.Signals]:
        """The signals delivered to ``identity``, in order."""
        return [sig for who, sig in self.sent if who == identity]


def stop_tree(
    root: ProcessIdentity,
    *,
    grace_s: float,
    stop_signal: signal.Signals = signal.SIGTERM,
    kill_wait_s: float = KILL_WAIT_S,
    members: Iterable[ProcessIdentity] | Callable[[], Iterable[ProcessIdentity]] = (),
    dry_run: bool = False,
    use_pidfd: bool | None = None,
    already_sent: bool = False,
) -> TreeStop:
    """Send ``stop_signal`` to the job's tree, wait up to ``grace_s``, then SIGKILL the rest.

    ``members``: processes known to be the job's besides those below the root (the tree
    as last read, whose root may be gone; a systemd unit's cgroup), or a function that
    finds them: it is called after the tree has the signal, since finding a process
    group's members means looking at every process (tens of milliseconds on a busy
    host), where the walk down from the root takes a few. ``use_pidfd`` False forces the
    check-before-each-signal fallback. ``already_sent``: the tree had ``stop_signal`` from a
    sentinel that died in its grace; this one waits out what is left of it (``grace_s``) and
    SIGKILLs, without signalling twice (a second SIGTERM may cut a job's last save short).
    """
    begun = begin_stop(
        root, stop_signal=stop_signal, dry_run=dry_run, use_pidfd=use_pidfd,
        already_sent=already_sent,
    )  # fmt: skip
    return begun.finish(grace_s=grace_s, kill_wait_s=kill_wait_s, members=members)


def begin_stop(
    root: ProcessIdentity,
    *,
    stop_signal: signal.Signals = signal.SIGTERM,
    dry_run: bool = False,
    use_pidfd: bool | None = None,
    already_sent: bool = False,
) -> StopBegun:
    """The first part of ``stop_tree``, its arguments alike: the tree below ``root`` pinned,
    each process checked against its identity, and ``stop_signal`` sent to it (none with
    ``dry_run`` or ``already_sent``). It takes a few reads of /proc a process, so a caller
    may make it on its own thread and leave ``StopBegun.finish`` (the job's other members,
    the grace, SIGKILL) to another."""
    run = _Run(root, use_pidfd)
    try:
        run.collect(())
        if not (dry_run or already_sent):
            run.signal_live(stop_signal)
    except BaseException:
        run.close()
        raise
    return StopBegun(run, stop_signal, dry_run=dry_run, already_sent=already_sent)


class StopBegun:
    """A stop whose tree below the root has its first signal (``begin_stop``); ``finish``
    carries out the rest, once."""

    def __init__(
        self, run: _Run, stop_signal: signal.Signals, *, dry_run: bool, already_sent: bool
    ) -> None:
        self._run = run
        self.stop_signal = stop_signal
        self._dry_run = dry_run
        self._first = None if dry_run or already_sent else stop_signal

    @property
    def sent(self) -> tuple[tuple[ProcessIdentity, signal.Signals], ...]:
        """Each signal delivered so far, in order."""
        return tuple(self._run.sent)

    def finish(
        self,
        *,
        grace_s: float,
        kill_wait_s: float = KILL_WAIT_S,
        members: Iterable[ProcessIdentity] | Callable[[], Iterable[ProcessIdentity]] = (),
    ) -> TreeStop:
        """The job's ``members`` outside the root's tree, found now and signalled; the
        grace; SIGKILL to what still runs (``stop_tree``)."""
        run, stop_signal, first = self._run, self.stop_signal, self._first
        try:
            if self._dry_run:
                run.exclude_ancestors()
                run.collect(members() if callable(members) else members)
                return run.result(_dry_run_words(run, stop_signal, grace_s))
            run.exclude_ancestors()
            run.collect(members() if callable(members) else members)
            if first is not None:
                run.signal_live(first)  # the members not in the tree
            if stop_signal != signal.SIGKILL:
                run.wait_all(grace_s, stop_signal)
                if run.live():
                    run.rescan(signal.SIGKILL)
                    run.signal_live(signal.SIGKILL)
            run.wait_all(kill_wait_s, signal.SIGKILL)
            return run.result(_words(run, stop_signal, grace_s))
        finally:
            run.close()


def _descendants(process: psutil.Process) -> list[psutil.Process]:
    """Every process below ``process``: read down from it through /proc where the kernel
    lists children, which costs the tree's size; psutil's walk reads every process."""
    if not PROC_CHILDREN:
        return process.children(recursive=True)
    found = []
    for pid in descendant_pids(process.pid):
        with contextlib.suppress(*_GONE):
            found.append(psutil.Process(pid))
    return found


@dataclass
class _Member:
    pinned: PinnedProcess
    process: psutil.Process | None
    signalled: set[signal.Signals] = field(default_factory=set)


class _Run:
    """One stop: the members pinned so far and what happened to each."""

    def __init__(self, root: ProcessIdentity, use_pidfd: bool | None) -> None:
        self.root = root
        self.use_pidfd = use_pidfd
        self.started = time.monotonic()
        self.members: dict[ProcessIdentity, _Member] = {}
        self.tree: list[ProcessIdentity] = []
        self.sent: list[tuple[ProcessIdentity, signal.Signals]] = []
        self.gone: list[ProcessIdentity] = []
        self.refused: list[tuple[ProcessIdentity, str]] = []
        self.late: list[ProcessIdentity] = []
        #: Never signalled: sentinel (with its own children) and the root's ancestors.
        self.excluded: set[psutil.Process] = set()
        #: Sentinel, where it runs below the root: its children are looked up at every walk.
        self._me_inside: psutil.Process | None = None
        #: The root's parent when the tree was collected (``exclude_ancestors``).
        self._root_parent: int | None = None

    def collect(self, members: Iterable[ProcessIdentity]) -> None:
        """Pin the root and everything below it (and ``members``) before any signal to them."""
        process = self._add(self.root, late=False)
        if process is not None:
            with contextlib.suppress(*_GONE):
                self._root_parent = process.ppid()
            self._exclude_self(process)
            self._add_children(process, late=False)
        for identity in members:
            self._add(identity, late=False)

    def exclude_ancestors(self) -> None:
        """Leave the root's ancestors (a wrapper waiting for the verdict) out of later walks.

        A walk down from the root cannot meet them, so they are looked up (a read of every
        ancestor, about a millisecond, far more on a busy host) after the first signal, for
        the walks below other members and the rescans.
        """
        if self._root_parent is None:
            return
        with contextlib.suppress(*_GONE):
            parent = psutil.Process(self._root_parent)
            self.excluded.add(parent)
            self.excluded.update(parent.parents())

    def _exclude_self(self, root: psutil.Process) -> None:
        """Leave sentinel and its own children out where it runs inside the job's tree."""
        try:
            me = psutil.Process()
            if PROC_CHILDREN:
                below_root = me.pid in descendant_pids(root.pid)
            else:
                below_root = root in me.parents()
        except _GONE:
            return
        if below_root:
            self.excluded.add(me)
            self._me_inside = me

    def rescan(self, sig: signal.Signals | None) -> None:
        """Pin processes started below live members since the last look; send them ``sig``."""
        for member in list(self.members.values()):
            if member.process is None or member.pinned.has_exited():
                continue
            found = len(self.tree)
            self._add_children(member.process, late=True)
            if sig is not None:
                for identity in self.tree[found:]:
                    self._signal(identity, sig)

    def _add_children(self, process: psutil.Process, *, late: bool) -> None:
        try:
            children = _descendants(process)
            if self._me_inside is not None:
                # Listed after the tree, so a child sentinel started meanwhile is among them.
                self.excluded.update(_descendants(self._me_inside))
        except psutil.Error:
            return
        for child in children:
            if child in self.excluded:
                continue
            try:
                identity = ProcessIdentity(child.pid, child.create_time())
            except psutil.Error:
                continue
            if identity not in self.members:
                self._add(identity, late=late, process=child)

    def _add(
        self, identity: ProcessIdentity, *, late: bool, process: psutil.Process | None = None
    ) -> psutil.Process | None:
        """Pin ``identity``; the psutil handle of it, or None if it cannot be pinned."""
        if identity in self.members or identity in self.gone:
            return None
        if any(who == identity for who, _ in self.refused):
            return None
        if identity.pid == os.getpid():
            self.refused.append((identity, "sentinel itself"))
            return None
        pinned = pin(identity, use_pidfd=self.use_pidfd)
        if isinstance(pinned, str):
            if pinned == "gone":
                self.gone.append(identity)
            else:
                words = "pid reused" if pinned == "reused" else "cannot read its create time"
                log.warning("pid %d is not signalled: %s", identity.pid, words)
                self.refused.append((identity, words))
            return None
        if process is None:
            try:
                process = psutil.Process(identity.pid)
            except _GONE:
                process = None
        self.members[identity] = _Member(pinned, process)
        self.tree.append(identity)
        if late:
            self.late.append(identity)
        return process

    def signal_live(self, sig: signal.Signals) -> None:
        for identity in list(self.members):
            self._signal(identity, sig)

    def _signal(self, identity: ProcessIdentity, sig: signal.Signals) -> None:
        member = self.members.get(identity)
        if member is None or sig in member.signalled:
            return
        member.signalled.add(sig)
        delivery = member.pinned.send(sig)
        if delivery == "sent":
            self.sent.append((identity, sig))
            log.info("%s sent to pid %d", sig.name, identity.pid)
        elif delivery == "gone":
            if not any(who == identity for who, _ in self.sent) and identity not in self.gone:
                self.gone.append(identity)
        else:
            words = "not permitted" if delivery == "denied" else "pid reused"
            log.error("%s not sent to pid %d: %s", sig.name, identity.pid, words)
            self.refused.append((identity, f"{sig.name} {words}"))
            # Not ours to stop: neither waited for nor signalled again.
            del self.members[identity]
            member.pinned.close()

    def live(self) -> list[ProcessIdentity]:
        return [who for who, member in self.members.items() if not member.pinned.has_exited()]

    def wait_all(self, timeout_s: float, sig: signal.Signals) -> None:
        """Wait up to ``timeout_s`` for every member to exit, pinning (and sending ``sig``
        to) processes the tree starts meanwhile."""
        deadline = time.monotonic() + timeout_s
        next_scan = time.monotonic() + RESCAN_S
        while self.live():
            now = time.monotonic()
            if now >= deadline:
                return
            if now >= next_scan:
                self.rescan(sig)
                next_scan = now + RESCAN_S
                continue
            self._wait_any(min(deadline, next_scan) - now)

    def _wait_any(self, timeout_s: float) -> None:
        fds = [m.pinned.fd for m in self.members.values() if m.pinned.fd is not None]
        live_fds = [fd for fd in fds if not _readable_now(fd)]
        if len(live_fds) < len(self.live()) or not live_fds:
            time.sleep(min(timeout_s, _FALLBACK_POLL_S))
            return
        poller = select.poll()
        for fd in live_fds:
            poller.register(fd, select.POLLIN)
        poller.poll(max(0.0, timeout_s) * 1000)

    def result(self, detail: str) -> TreeStop:
        survivors = tuple(self.live()) if self.sent else ()
        return TreeStop(
            tree=tuple(self.tree),
            sent=tuple(self.sent),
            gone=tuple(self.gone),
            refused=tuple(self.refused),
            survivors=survivors,
            late=tuple(self.late),
            elapsed_s=time.monotonic() - self.started,
            detail=detail,
        )

    def close(self) -> None:
        for member in self.members.values():
            member.pinned.close()


def _readable_now(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _pids(identities: Iterable[ProcessIdentity]) -> str:
    return ", ".join(str(who.pid) for who in identities) or "none"


def _dry_run_words(run: _Run, stop_signal: signal.Signals, grace_s: float) -> str:
    words = (
        f"dry run: would send {stop_signal.name} to pid {_pids(run.tree)}, "
        f"then SIGKILL to those still running after {grace_s:g} s"
    )
    log.warning("%s", words)
    return words


def _words(run: _Run, stop_signal: signal.Signals, grace_s: float) -> str:
    """One line on what happened, for the incident and the log."""
    if not run.tree:
        gone = run.root in run.gone
        words = f"pid {run.root.pid} " + ("had already exited" if gone else "is not the job")
        return words + "; nothing signalled"
    termed = [who for who, sig in run.sent if sig == stop_signal]
    # None here: a stop taken up after a dead sentinel's signal (the rest of its grace).
    sent = f"sent to pid {_pids(termed)}" if termed else "sent before (the stop taken up)"
    parts = [f"{stop_signal.name} {sent}"]
    late = run.late
    if late:
        parts.append(f"started during the grace: pid {_pids(late)}")
    killed = [who for who, sig in run.sent if sig == signal.SIGKILL]
    if killed and stop_signal != signal.SIGKILL:
        parts.append(f"still running after {grace_s:g} s, SIGKILL to pid {_pids(killed)}")
    survivors = run.live()
    if survivors:
        parts.append(f"still running after SIGKILL: pid {_pids(survivors)}")
        log.error("%s", "; ".join(parts))
    else:
        parts.append(f"all gone after {time.monotonic() - run.started:.1f} s")
        log.info("%s", "; ".join(parts))
    if run.refused:
        parts.append("not signalled: " + ", ".join(f"pid {w.pid} ({r})" for w, r in run.refused))
    return "; ".join(parts)
