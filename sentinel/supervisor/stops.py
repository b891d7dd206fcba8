"""The stops of the job sentinel decides on, one at a time: for a critical incident
whose rule calls for one, for another node's verdict on the run, for SIGTERM or SIGINT.

Before its first signal a stop marks the job's exit as sentinel's doing
(``stopping.mark_deciding``); then the job is STOPPING and the stop sequence runs on
a thread of its own (``stopping``), whose outcome, and the evidence taken before the
first signal, come back through the inbox. What follows the job's exit is its
owner's, the supervisor's, which these stops ask through the ``Holding`` protocol.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any, Protocol

from sentinel.config import Settings
from sentinel.model.incidents import Incident
from sentinel.process.identity import ProcessIdentity
from sentinel.process.launched import exit_status
from sentinel.process.signal_tree import TreeStop
from sentinel.service.health import Service
from sentinel.service.watch import Watch
from sentinel.store.stop_intent import StopIntent
from sentinel.supervisor import stopping
from sentinel.supervisor.aftermath import Aftermath
from sentinel.supervisor.events import Put, Stop
from sentinel.supervisor.holders import Handle, Holder
from sentinel.supervisor.job_state import JobState
from sentinel.supervisor.stop_journal import StopJournal

log = logging.getLogger(__name__)


class Holding(Protocol):
    """What the stops ask of the owner of the job's attempts."""

    #: The settings in force (a SIGHUP may replace them).
    settings: Settings
    state: JobState

    @property
    def attempt(self) -> int:
        """The current attempt's number (1 for the first)."""
        ...

    @property
    def job(self) -> Handle | None:
        """The current attempt's job; None between attempts."""
        ...

    def set_state(self, state: JobState) -> None:
        """The job's state changed (said, and stored for ``sentinel status``)."""
        ...

    def finish(self, status: int, state: JobState) -> None:
        """The run is over here: sentinel exits with ``status``."""
        ...


class JobStops:
    """Decides on stops of the job and starts them (see the module's docstring)."""

    def __init__(
        self,
        owner: Holding,
        holder: Holder,
        *,
        watch: Watch,
        service: Service,
        after: Aftermath,
        put: Put,
        journal: StopJournal,
    ) -> None:
        self.owner = owner
        self.journal = journal
        self.holder = holder
        self.watch = watch
        self.service = service
        self.after = after
        self._put = put
        #: The stop under way, until the job's exit is handled; None when there is none.
        self.current: Stop | None = None
        #: SIGTERM and SIGINT received so far (the second forces), and the first of them:
        #: ``run`` then exits as a program killed by it would (130 for Ctrl-C, 143).
        self.shutdown_signals = 0
        self.shutdown_signum: int | None = None

    def act(self, incident: Incident) -> None:
        """A critical incident opened or escalated: stop the job if its rule says so."""
        policy = self.watch.policy(incident)
        if policy == "notify" or self.current is not None:
            return
        owner = self.owner
        job = owner.job
        if job is None or owner.state not in (JobState.STARTING, JobState.RUNNING):
            return
        settings = owner.settings
        if settings.dry_run:
            text = stopping.dry_run_note(settings.job, job.pid, policy)
            log.warning("%s", text)
            incident.record(time.time(), text)
            self.watch.update(incident)
            return
        self.current = Stop(incident, restart=policy == "restart")
        # Before the first signal, so that whatever waits on the job knows the exit is ours,
        # and a sentinel started after this one dies finishes what it decided.
        self.journal.stopping(
            incident, restart=self.current.restart, attempt=owner.attempt, job=job.identity,
            signal=settings.job.stop_signal, grace_s=settings.job.grace_period_s,
            restarts=self.after.restarts.to_state(),
        )  # fmt: skip
        incident.record(time.time(), stopping.stop_words(settings.job, job.pid))
        self.service.metrics.action("stop")
        self._terminate(job)

    def resume(self, incident: Incident, intent: StopIntent) -> bool:
        """Finish the stop a sentinel that died left under way: what is left of its grace,
        then SIGKILL to what still runs (only a process whose pid and start time match).
        False when the stopped job is not the one held now."""
        job = self.owner.job
        stopped = None if intent.job is None else ProcessIdentity(*intent.job)
        if job is None or job.identity is None or job.identity != stopped:
            return False
        self.current = Stop(incident, restart=intent.restart, started_at=intent.signalled_at)
        left_s = max(0.0, intent.grace_s - (time.time() - intent.signalled_at))
        log.warning(
            "the job (pid %d) had %s from the sentinel before; the rest of its grace (%.1f s),"
            " then SIGKILL to what still runs",
            stopped.pid, intent.signal, left_s,
        )  # fmt: skip
        incident.record(time.time(), f"stop taken up by a restarted sentinel: {left_s:.1f} s left")
        self.owner.set_state(JobState.STOPPING)
        stopping.stop_in_background(
            stopped, self.current, self.owner.settings.job,
            members=self.holder.members, put=self._put, resumed_grace_s=left_s,
        )  # fmt: skip
        return True

    def join_run(self) -> None:
        """Another node decided the run: stop this node's job with its verdict, quietly."""
        record = self.after.decided_elsewhere() if self.current is None else None
        if record is None:
            return
        owner = self.owner
        job = owner.job
        if job is None or job.identity is None or owner.settings.dry_run:
            self.after.joined(record)  # nothing here to stop: its verdict is this node's too
            return
        log.warning(
            "node %s decided the run (verdict %d: %s at step %s): stopping this node's job",
            record.node, record.code, record.rule, record.step,
        )  # fmt: skip
        self.current = Stop(None, restart=False, joined=record)
        stopping.mark_deciding(owner.settings, record.rule, record.step, owner.attempt)
        self._terminate(job)

    def shutdown(self, signum: int) -> None:
        """SIGTERM or SIGINT: ``run`` stops its job (a second forces), ``watch`` only itself."""
        self.shutdown_signals += 1
        if self.shutdown_signum is None:
            self.shutdown_signum = signum
        name = signal.Signals(signum).name
        owner = self.owner
        job = owner.job
        if not self.holder.relaunches:
            # A watchdog being stopped never stops the job it watches.
            log.warning("%s received: stopping sentinel, leaving the job alone", name)
            owner.finish(0, owner.state)
            return
        if self.shutdown_signals >= 2 or job is None or job.identity is None:
            log.warning("%s again: stopping now", name)
            if job is not None and job.identity is not None and job.identity.matches():
                os.killpg(job.identity.pid, signal.SIGKILL)
            owner.finish(exit_status(-signum), JobState.EXITED)
            return
        log.warning("%s received: stopping the job (again to force)", name)
        if self.current is None:
            self.current = Stop(None, restart=False)
            self._terminate(job)

    def terminated(self, stop: Stop | None, result: TreeStop) -> None:
        """The stop sequence's outcome (``stopping``), for the incident's record."""
        if not result.signalled:
            self.service.metrics.action("stop", ok=False)
        note = stopping.outcome_note(stop, result)
        if note is not None and stop is not None and stop.incident is not None:
            stop.incident.record(time.time(), note)
            self.watch.update(stop.incident)

    def evidence(self, stop: Stop | None, taken: Any) -> None:
        """What the job was doing, taken before the first signal (``stopping``)."""
        incident = stopping.record_evidence(stop, taken)
        if incident is not None:
            self.watch.update(incident)

    def _terminate(self, job: Handle) -> None:
        """The stop signal to the job's whole tree, on a thread of its own (``stopping``)."""
        identity = job.identity
        if identity is None:
            return  # it already exited; the waiter reports the exit
        self.owner.set_state(JobState.STOPPING)
        settings = self.owner.settings
        first = stopping.evidence_first(
            settings, self.current, identity, members=self.holder.members, put=self._put
        )
        stopping.stop_in_background(
            identity, self.current, settings.job,
            members=self.holder.members, put=self._put, first=first,
        )  # fmt: skip
