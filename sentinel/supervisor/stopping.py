"""The stop: the stop signal to the job's whole tree, SIGKILL to what outlives the grace.

A ``Stop`` is a stop sentinel decided on: for which incident, whether a rollback and a
restart follow, or which other node's verdict it carries out. ``stop_in_background``
collects the tree and signals it at once, on the loop's thread
(``process.signal_tree.begin_stop``), and runs the rest of the sequence (the grace,
SIGKILL) on a thread of its own, which hands the outcome back to the loop as a
``StopDone`` event. Before the first signal, ``mark_deciding``
tells whatever waits on the job that its exit is sentinel's doing.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable

from sentinel.config import JobConfig, Settings
from sentinel.evidence import capture as evidence
from sentinel.model.incidents import Incident
from sentinel.process.identity import ProcessIdentity
from sentinel.process.signal_tree import TreeStop, begin_stop
from sentinel.rules import DETECTORS
from sentinel.store import verdict
from sentinel.supervisor.events import EvidenceTaken, Put, Stop, StopDone

log = logging.getLogger(__name__)


def dry_run_note(job: JobConfig, pid: int, policy: str, *, relaunches: bool = True) -> str:
    """What ``--dry-run`` says instead of stopping the job (``watch`` relaunches nothing: it
    rolls back and asks whoever relaunches the job, verdict 91)."""
    if policy != "restart":
        then = "and not restart it"
    elif relaunches:
        then = "roll back and restart it"
    else:
        then = "roll back and write verdict 91 (restart me) for whoever relaunches it"
    return f"dry run: would send {job.stop_signal} to the job's tree (pid {pid}), {then}"


def mark_deciding(settings: Settings, rule: str | None, step: int | None, attempt: int) -> None:
    """Before the first signal: the verdict's "deciding" mark (best effort, never delays)."""
    verdict.mark_deciding(
        settings.state_dir, rule=rule, step=step, attempt=attempt, time=time.time()
    )


def stop_words(job: JobConfig, pid: int) -> str:
    """The incident's record of the stop, as it is sent."""
    return (
        f"{job.stop_signal} to the job's process tree (pid {pid}),"
        f" SIGKILL after {job.grace_period_s:g} s to what still runs"
    )


def stop_in_background(
    identity: ProcessIdentity,
    stop: Stop | None,
    job: JobConfig,
    *,
    members: Callable[[], Iterable[ProcessIdentity]],
    put: Put,
    first: Callable[[], None] | None = None,
    resumed_grace_s: float | None = None,
) -> None:
    """Stop the tree under ``identity``: the first signal to the tree below it on the
    calling thread, the rest (``members``, the grace, SIGKILL) on a thread of its own.
    ``members`` finds the job's processes outside that tree (looked for after the tree has
    the signal); ``first`` runs on that thread before the first signal (``evidence_first``),
    which then goes from there too. ``resumed_grace_s``: the signal was sent by a sentinel
    that died; what is left of its grace, then SIGKILL.

    The first signal goes from the caller's thread because it is the loop's, which has
    nothing more urgent to do: handed to a new thread, it waited for the interpreter's lock
    while the loop went on to the incident's report (2-3 ms on a 2-core VM; the tree's
    reads of /proc take about 1 ms).
    """
    stop_signal = signal.Signals[job.stop_signal]
    grace_s = job.grace_period_s if resumed_grace_s is None else resumed_grace_s
    begun = None
    if first is None and resumed_grace_s is None:
        try:
            begun = begin_stop(identity, stop_signal=stop_signal)
        except Exception:
            log.exception("the stop signal to pid %d failed; trying again", identity.pid)

    def run_stop() -> None:
        if first is not None:
            first()
        started = begun or begin_stop(
            identity, stop_signal=stop_signal, already_sent=resumed_grace_s is not None
        )
        result = started.finish(grace_s=grace_s, members=members)
        put(StopDone(stop, result))

    threading.Thread(target=run_stop, name="stop-tree", daemon=True).start()


def evidence_first(
    settings: Settings,
    stop: Stop | None,
    identity: ProcessIdentity,
    *,
    members: Callable[[], Iterable[ProcessIdentity]],
    put: Put,
) -> Callable[[], None] | None:
    """What the stop's thread takes from the live job before its first signal, handing it to
    the loop as an ``EvidenceTaken`` event (ahead of the exit the signal
    brings); None when the stop's rule needs none (a NaN) or ``[evidence]`` is off."""
    incident = stop.incident if stop is not None else None
    if incident is None or not settings.evidence.enabled:
        return None
    rule = DETECTORS.get(incident.rule)
    if rule is None or not rule.evidence_before_stop:
        return None
    folder = evidence.incident_dir(settings.state_dir, incident.id)

    def take() -> None:
        pids, leaves = evidence.job_processes(identity.pid, (m.pid for m in members()))
        if not pids:
            return  # the job ended by itself (a crash): nothing alive to look at
        taken = evidence.take(
            pids,
            folder,
            budget_s=settings.evidence.budget_s,
            output_files=evidence.output_files(settings.state_dir, pids, settings.logs),
            leaves=leaves,
        )
        put(EvidenceTaken(stop, taken))

    return take


def record_evidence(stop: Stop | None, taken: evidence.Evidence) -> Incident | None:
    """The evidence's lines in the stop's incident; the incident, to report again."""
    if stop is None or stop.incident is None:
        return None
    for note in taken.notes():
        stop.incident.record(time.time(), note)
    return stop.incident


def outcome_note(stop: Stop | None, result: TreeStop) -> str | None:
    """What the incident records of how the stop went; None when nothing is worth saying."""
    if stop is not None and stop.incident is not None and (result.killed or result.survivors):
        return result.detail
    return None
