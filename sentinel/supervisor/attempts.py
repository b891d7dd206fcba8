"""The job's attempts: start or find each one, and say so.

``run`` launches each attempt itself; ``watch`` finds the one someone else started
(``sentinel.supervisor.holders``). ``JobAttempts`` counts them, holds the current one's
job, and does what a new attempt takes (the rules told, the status and metrics set, the
log line); which attempt comes when, and what the job's phase is, is the machine's
(``machine``).
"""

from __future__ import annotations

import logging
import time

from sentinel.config import Settings
from sentinel.process.system import SystemSources
from sentinel.service.health import Service
from sentinel.service.watch import Watch
from sentinel.store import verdict
from sentinel.store.state import StateStore
from sentinel.supervisor.events import Put
from sentinel.supervisor.holders import Handle, Holder
from sentinel.supervisor.job_state import JobState
from sentinel.supervisor.job_status import JobStatus
from sentinel.supervisor.restarts import Restarts

log = logging.getLogger(__name__)


class JobAttempts:
    """The current attempt and its job (see the module's docstring)."""

    def __init__(
        self,
        settings: Settings,
        holder: Holder,
        restarts: Restarts,
        *,
        watch: Watch,
        status: JobStatus,
        system: SystemSources,
        service: Service,
        store: StateStore,
        put: Put,
    ) -> None:
        #: The settings in force (a SIGHUP may replace them).
        self.settings = settings
        self.holder = holder
        self._restarts = restarts
        self.watch = watch
        self._status = status
        self._system = system
        self.service = service
        self._store = store
        self._put = put
        #: The current attempt's number (1 for the first; ``watch`` counts on from the
        #: last sentinel's), and its job: None between attempts.
        self.attempt = 0 if holder.relaunches else int(store.get("watch.attempt") or 0)
        #: ``watch``: when the last sentinel's attempt began (its process's start time), until
        #: this one finds its first job: only that one can be the same process.
        started = (
            None if holder.relaunches or not self.attempt else store.get("watch.attempt_started_at")
        )
        self._last_started_at = None if started is None else float(started)
        self.job: Handle | None = None
        #: ``watch``: the last attempt ended and the rules were started afresh for the next.
        self._waiting_for_next = False
        #: Where each restart resumed from, in order (for the summary at the end).
        self.resumed_from: list[str] = []

    @property
    def restarts(self) -> int:
        """Restarts made so far."""
        return self._restarts.count

    def begin(self) -> Handle | None:
        """Launch the next attempt (``run``), or look for it (``watch``): its job, now the
        current one; None when it is not there (yet). ``OSError``: it could not be started."""
        same = self._last_sentinels_job()
        attempt = self.attempt if same else self.attempt + 1
        job = self.holder.begin(attempt, self._restarts, self._put)
        if job is None:
            return None
        self.attempt = attempt
        self._last_started_at = None  # the first job found: no later one is the last's
        self._status.attempt_started(job.started_at)
        self.job = job
        self._restarts.attempt_began(
            job.started_at, found_anew=not self.holder.relaunches and not same
        )
        if not self.holder.relaunches and not same:
            self.watch.safely(
                "the attempt",
                self._store.put_many,
                {"watch.attempt": str(attempt), "watch.attempt_started_at": repr(job.started_at)},
            )
            verdict.clear(self.settings.state_dir)  # the next attempt is under way
        self._system.set_job(job.identity)
        self.service.metrics.attempt_started(attempt)
        self.service.metrics.target_up(True)
        if not self._waiting_for_next:  # else the rules were started fresh at the last end
            resumed_at = self._restarts.resume.step if self.restarts else None
            who = job.identity
            identity = None if who is None else (who.pid, who.create_time)
            resumed = self._restarts.resumed(attempt)
            self.watch.job_started(job.started_at, resumed_at or 0, identity, resumed)
        self._waiting_for_next = False
        return job

    def _last_sentinels_job(self) -> bool:
        """``watch`` restarted beside the very process the last sentinel watched (its start
        time): the same attempt, not the next one. It was numbered one more, and the
        record of the stop under way was set aside as though a new attempt had begun."""
        started = self._last_started_at
        return started is not None and self.holder.found_started_at() == started

    def announce(self, job: Handle) -> None:
        """The log line of an attempt begun: started or found, and whence it resumed."""
        whence = self._resumed_from()
        if self._restarts.relaunched_early:
            self.resumed_from.append("a save it found (relaunched before the rollback was done)")
        elif whence:
            self.resumed_from.append(whence.removeprefix(", resumed from ").removeprefix(", "))
        log.info(
            "job %s (attempt %d, pid %d)%s: %s",
            "started" if self.holder.relaunches else "found",
            self.attempt,
            job.pid,
            whence,
            self.holder.describe(),
        )

    def _resumed_from(self) -> str:
        """ ", resumed from <checkpoint> (step N)" for an attempt after a rollback."""
        if not self.restarts:
            return ""
        if self._restarts.relaunched_early:
            return (
                ", relaunched before the rollback was done: it resumed from what the"
                " checkpoint dir held then, perhaps a save since set aside"
            )
        where = self._restarts.resume
        if not where.checkpoint:
            return ", from scratch"
        step = f" (step {where.step})" if where.step is not None else ""
        return f", resumed from {where.checkpoint}{step}"

    def uptime_s(self, now: float) -> float:
        """How long the current attempt has run (0 between attempts)."""
        job = self.job
        return now - job.started_at if job is not None else 0.0

    def ended(self) -> None:
        """The attempt's job is gone."""
        self.job = None
        self._system.set_job(None)
        self.service.metrics.target_up(False)

    def next_is_fresh(self) -> None:
        """``watch``: what the job writes from now on is the next attempt's, even if it is
        read before the process is found: the rules start fresh now, not when it is found."""
        resumed = self._restarts.resumed(self.attempt + 1)
        self.watch.job_started(time.time(), self._restarts.resume.step or 0, resumed=resumed)
        self._waiting_for_next = True

    def publish(self, state: JobState) -> None:
        """The job's state, pid and restarts, for ``sentinel status``."""
        self._status.state(state, self.job, self.restarts)
