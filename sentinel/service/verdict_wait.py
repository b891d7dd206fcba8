"""``sentinel verdict``: read the final verdict, or wait for it while a sentinel decides.

A wrapper runs it after the job exits (``python train.py; status=$?; exec
sentinel verdict --wait --timeout 120 --job-status $status``), so that the
orchestrator never hears "restart me" before the pointers name the clean
checkpoint. The wait ends with the final record; or when no sentinel holds the
state dir any more (its lock is free) and none has come (a stop the dead one left
"deciding": when none took it up within ``TAKE_UP_GRACE_S``); or at the timeout. In
the last two cases the answer is the job's own status when the wrapper gave
it, else 1. A record that exists but cannot be read (another user's state dir, a
corrupt file) is never passed off as the job's status: it is 94, and one line
says what could not be read and why. A 91 that a wait hands on is set aside as
taken (the relaunch follows), so a later attempt's wrapper never gets it again.

The record's appearance wakes the wait through a file event (inotify, read on
the waiting thread); where there are none, it polls. The lock has no event, so
whether a sentinel still holds it is looked at every ``HOLDER_CHECK_S``.
"""

from __future__ import annotations

import logging
import select
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from sentinel.follow.inotify import IN_CREATE, IN_MOVED_TO, FileWatches
from sentinel.store.lock import holder
from sentinel.store.verdict import (
    CODES,
    EXIT_ROLLED_BACK,
    EXIT_UNREADABLE,
    Verdict,
    VerdictUnreadable,
    clear,
    consumed,
    read_strict,
)

log = logging.getLogger(__name__)

#: Without a verdict or the job's status, the wrapper exits 1: a failure, not a verdict.
EXIT_NO_VERDICT = 1
#: How often a wait looks whether a sentinel still holds the state dir.
HOLDER_CHECK_S = 0.5
#: How often it reads the record where there are no file events.
POLL_S = 0.1
#: How long a stop that a dead sentinel left "deciding" is given to be taken up by the
#: next one (systemd restarts ``sentinel@`` after 5 s, the kubelet a sidecar after 10 s)
#: before the wait ends with the job's status: a sentinel killed during a stop had the
#: wrapper relaunch the job at once, from the checkpoint the rollback was to set aside.
TAKE_UP_GRACE_S = 30.0


@dataclass(frozen=True)
class Outcome:
    """What ``sentinel verdict`` exits with: the final record's code, or a fallback and why."""

    code: int
    record: Verdict | None
    #: Why there is no final record ("" when there is one).
    reason: str = ""


def await_verdict(
    state_dir: Path,
    *,
    wait: bool,
    timeout_s: float | None = None,
    job_status: int | None = None,
) -> Outcome:
    """The final verdict in ``state_dir``; with ``wait``, blocks for it as long as one may come.

    ``timeout_s`` bounds the wait (None: as long as a sentinel holds the state dir).
    """
    try:
        return _await(state_dir, wait=wait, timeout_s=timeout_s, job_status=job_status)
    except VerdictUnreadable as error:
        return Outcome(
            EXIT_UNREADABLE,
            None,
            f"{error}; a verdict may be there (perhaps a 90), so not the job's status:"
            f" exit {EXIT_UNREADABLE}",
        )


def _await(
    state_dir: Path, *, wait: bool, timeout_s: float | None, job_status: int | None
) -> Outcome:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    record = read_strict(state_dir)
    if record is not None and record.final:
        return _final(state_dir, record, taken=wait)
    if record is None:
        # The deciding mark is written before the first signal: without one, sentinel did
        # not stop this job, and no verdict is coming.
        return _fallback(job_status, _no_verdict(state_dir))
    if not wait:
        return _fallback(job_status, f"no final verdict in {state_dir}: sentinel is still deciding")
    with _Changes(state_dir) as changes:
        next_holder_check = 0.0
        #: Since when no sentinel holds the state dir while the record says "deciding".
        orphaned_at: float | None = None
        while True:
            record = read_strict(state_dir)
            if record is not None and record.final:
                return _final(state_dir, record, taken=True)
            now = time.monotonic()
            if now >= next_holder_check:
                next_holder_check = now + HOLDER_CHECK_S
                if _holder(state_dir) is not None:
                    orphaned_at = None
                else:
                    record = read_strict(state_dir)  # written just before that sentinel exited
                    if record is not None and record.final:
                        return _final(state_dir, record, taken=True)
                    orphaned_at = now if orphaned_at is None else orphaned_at
                    if record is None or now - orphaned_at >= TAKE_UP_GRACE_S:
                        return _fallback(job_status, _gone(state_dir, record))
            if deadline is not None and now >= deadline:
                why = f"no final verdict in {state_dir} within {timeout_s:g} s"
                if orphaned_at is not None:
                    why = _gone(state_dir, record)
                return _fallback(job_status, why)
            until = next_holder_check if deadline is None else min(next_holder_check, deadline)
            changes.wait(max(0.0, until - now))


def _gone(state_dir: Path, record: Verdict | None) -> str:
    """Why the wait ends with no sentinel: none left, or none took up a stop left deciding."""
    if record is None:
        return f"no sentinel holds {state_dir} and no final verdict came"
    return (
        f"the sentinel deciding on {state_dir} is gone, and none took up its stop (the"
        " rollback may not be done)"
    )


def _holder(state_dir: Path) -> int | None:
    """Who holds ``state_dir`` (``holder``); VerdictUnreadable when that cannot be told."""
    try:
        return holder(state_dir)
    except OSError as error:
        raise VerdictUnreadable(
            f"cannot tell whether a sentinel holds {state_dir}: {error.strerror or error}"
        ) from None


def _no_verdict(state_dir: Path) -> str:
    """Why there is no verdict: none was ever made, or the last one was taken by the
    attempt that started after it (never "sentinel did not stop the job" about that one)."""
    last = consumed(state_dir)
    if last is None or not last.final:
        return f"no verdict in {state_dir}: sentinel did not stop the job{_unwatched(state_dir)}"
    name = CODES[last.code][0] if last.code in CODES else last.verdict
    about = f"{last.rule} at step {last.step}" if last.step is not None else f"{last.rule}"
    return (
        f"no verdict for this attempt in {state_dir}: sentinel's last one ({last.code} {name},"
        f" {about}, attempt {last.attempt}) was taken by the attempt that started after it,"
        f" and sentinel did not stop this one{_unwatched(state_dir)}"
    )


def _unwatched(state_dir: Path) -> str:
    """ " (no sentinel holds it: nobody watched this attempt)" where none holds the state
    dir now (``watch --pid`` ended with the attempt before): "did not stop it" read as a
    clean bill of health for an attempt that trained on NaN unwatched."""
    try:
        held = holder(state_dir) is not None
    except OSError:
        return ""
    return "" if held else f" (no sentinel holds {state_dir}: nobody may have watched it)"


def _final(state_dir: Path, record: Verdict, *, taken: bool) -> Outcome:
    """The record's code. A "rolled back" one that a wait hands on (``taken``: the
    wrapper's, whose relaunch follows) is set aside as the next attempt's, as sentinel
    does when it sees that attempt start: a sentinel that cannot see it (``watch --pid``,
    or none left) left it in place, and every later wait returned that stale 91, so the
    wrapper relaunched a job that had finished. A give-up or a node fault stays: nobody
    relaunches here, and ``sentinel checkpoints`` reads which saves it left poisoned."""
    assert record.code is not None  # a final record has its code (verdict.read)
    if taken and record.code == EXIT_ROLLED_BACK:
        clear(state_dir)
    return Outcome(record.code, record)


def _fallback(job_status: int | None, why: str) -> Outcome:
    if job_status is None:
        return Outcome(EXIT_NO_VERDICT, None, f"{why}; no job status given, exit {EXIT_NO_VERDICT}")
    return Outcome(job_status, None, f"{why}; exit with the job's status {job_status}")


class _Changes:
    """Wakes a wait when a file appears in the state dir (inotify); a short poll without it.

    The inotify descriptor is read on the waiting thread itself: no thread to start or stop.
    """

    def __init__(self, state_dir: Path) -> None:
        self._watches: FileWatches | None = None
        try:
            watches = FileWatches()
        except OSError as error:
            log.debug("no inotify (%s): polling", error)
            return
        if not watches.watch(str(state_dir), IN_CREATE | IN_MOVED_TO):
            watches.close()  # no such dir yet, or the watch quota spent: polling
            return
        self._watches = watches

    def wait(self, timeout_s: float) -> None:
        """Until a file appears in the state dir or ``timeout_s`` passed (``POLL_S`` without)."""
        watches = self._watches
        if watches is None:
            time.sleep(min(timeout_s, POLL_S))
            return
        readable, _, _ = select.select([watches], [], [], timeout_s)
        if readable:
            watches.drain()

    def __enter__(self) -> _Changes:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._watches is not None:
            self._watches.close()
            self._watches = None
