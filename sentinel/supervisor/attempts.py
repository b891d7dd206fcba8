"""The job's attempts, and its life through them after Supervisor's process states.

WAITING (``watch``: for the job to appear), STARTING (launched or found, younger than
``min_uptime_s``), RUNNING, STOPPING (sentinel asked it to stop), BACKOFF (waiting to
restart), and the final EXITED or FATAL. ``run`` holds a child it launches and
relaunches; ``watch`` a process started elsewhere, whose next attempt it waits for
(``sentinel.supervisor.holders``). ``JobAttempts`` starts or finds each attempt, waits between
them and ends the run; the aftermath and the stops ask it about the job
(``aftermath.Attempts``, ``stops.Holding``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sentinel.config import Settings
from sentinel.model.incidents import Incident
from sentinel.model.records import Alert
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
    """The current attempt, the job's state, and how the run ends (see the module)."""

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
        handle: Callable[[list[Alert]], None],
    ) -> None:
        """``handle``: the owner's, for the alerts sentinel raises itself."""
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
        self._handle = handle
        self.state = JobState.STARTING
        #: The current attempt's number (1 for the first; ``watch`` counts on from the
        #: last sentinel's), and its job: None between attempts.
        self.attempt = 0 if holder.relaunches else int(store.get("watch.attempt") or 0)
        self.job: Handle | None = None
        #: Set once the run is over: sentinel exits with ``exit_code``.
        self.finished = False
        self.exit_code = 0
        #: When the next attempt is due (monotonic), while in BACKOFF.
        self.restart_at: float | None = None
        self._waiting_since: float | None = None
        #: ``watch``: the last attempt ended and the rules were started afresh for the next.
        self._waiting_for_next = False
        #: Where each restart resumed from, in order (for the summary at the end).
        self.resumed_from: list[str] = []

    @property
    def restarts(self) -> int:
        """Restarts made so far."""
        return self._restarts.count

    def start(self) -> None:
        """Launch the next attempt (``run``), or look for it (``watch``)."""
        attempt = self.attempt + 1
        try:
            job = self.holder.begin(attempt, self._restarts, self._put)
        except OSError as error:
            log.error("cannot start the job %s: %s", self.holder.describe(), error)
            self.finish(127, JobState.FATAL)
            return
        if job is None:
            self.wait_for_next()
            return
        self.attempt = attempt
        self._waiting_since = None
        self._status.attempt_started(job.started_at)
        self.job = job
        if not self.holder.relaunches:
            self.watch.safely("the attempt", self._store.put, "watch.attempt", str(attempt))
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
        self.set_state(JobState.STARTING)
        whence = self._resumed_from()
        if whence:
            self.resumed_from.append(whence.removeprefix(", resumed from ").removeprefix(", "))
        log.info(
            "job %s (attempt %d, pid %d)%s: %s",
            "started" if self.holder.relaunches else "found",
            attempt,
            job.pid,
            whence,
            self.holder.describe(),
        )

    def _resumed_from(self) -> str:
        """ ", resumed from <checkpoint> (step N)" for an attempt after a rollback."""
        if not self.restarts:
            return ""
        where = self._restarts.resume
        if not where.checkpoint:
            return ", from scratch"
        step = f" (step {where.step})" if where.step is not None else ""
        return f", resumed from {where.checkpoint}{step}"

    def tick(self, now: float) -> None:
        """STARTING becomes RUNNING once the attempt is ``min_uptime_s`` old."""
        job = self.job
        uptime_s = now - job.started_at if job is not None else 0.0
        if self.state is JobState.STARTING and uptime_s >= self.settings.job.min_uptime_s:
            self.set_state(JobState.RUNNING)

    def ended(self) -> None:
        """The attempt's job is gone."""
        self.job = None
        self._system.set_job(None)
        self.service.metrics.target_up(False)

    def wait_for_next(self) -> None:
        """``watch``: look for the job on every tick until it appears, or ``wait_s`` runs out."""
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
            log.info("waiting for %s", self.holder.describe())
            self.set_state(JobState.WAITING)
            return
        wait_s = self.settings.watch.wait_s
        if wait_s is not None and now - self._waiting_since > wait_s:
            log.error("%s did not appear within %g s", self.holder.describe(), wait_s)
            self.finish(1, JobState.FATAL)

    def attempt_over(self, status: int, state: JobState, incident: Incident | None = None) -> None:
        """``run`` ends with its job; ``watch`` waits for the next attempt."""
        if self.holder.relaunches:
            self.finish(status, state, incident)
            return
        if incident is not None:
            self.watch.update(incident, final=True)
        # What the job writes from now on is the next attempt's, even if it is read before
        # the process is found: the rules start fresh now, not when it is found.
        resumed = self._restarts.resumed(self.attempt + 1)
        self.watch.job_started(time.time(), self._restarts.resume.step or 0, resumed=resumed)
        self._waiting_for_next = True
        self.wait_for_next()

    def back_off(self, delay_s: float) -> None:
        """``run``: relaunch the job in ``delay_s`` seconds."""
        self.set_state(JobState.BACKOFF)
        self.restart_at = time.monotonic() + delay_s

    def gave_up(self) -> None:
        self.exit_code = verdict.EXIT_GIVE_UP

    def handle(self, alerts: list[Alert]) -> None:
        self._handle(alerts)

    def finish(self, status: int, state: JobState, incident: Incident | None = None) -> None:
        """The run is over: sentinel exits with ``status``."""
        if incident is not None:
            self.watch.update(incident, final=True)
        self.exit_code = status
        self.set_state(state)
        self.finished = True

    def set_state(self, state: JobState) -> None:
        if state is not self.state:
            log.info("job state %s -> %s", self.state, state)
            self.state = state
        self._status.state(self.state, self.job, self.restarts)
