"""``sentinel run`` and ``sentinel watch``: hold the job, watch it, act, roll back, restart.

One thread owns every decision: it takes events (output lines, the job's
exit, clock ticks, signals) from one inbox, runs them through the engine,
and acts. Slow effects stay off it: notification goes through the outbox
worker, the SIGTERM-grace-SIGKILL sequence runs on its own thread and
reports back through the inbox. Events that arrive while it is busy are
taken together, so a chatty job costs a wake-up per batch, not per line.
The loop wakes for nothing else it can put off: the GPU and process readings
(once a second or less often) wait for its next turn, and a clock tick due
soon rides on a turn it takes anyway.

The job's life follows Supervisor's states: WAITING (``watch``: for the job to
appear), STARTING (launched or found, younger than ``min_uptime_s``), RUNNING,
STOPPING (sentinel asked it to stop), BACKOFF (waiting to restart), and the
final EXITED or FATAL. ``run`` holds a child it launches and relaunches;
``watch`` a process started elsewhere, whose next attempt it waits for
(sentinel.holders). Both take the same decisions and write the same verdicts.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from sentinel import run_verdict, verdict
from sentinel.actions.signal_tree import TreeStop
from sentinel.aftermath import Aftermath
from sentinel.config import Settings
from sentinel.detectors.job_crash import describe_exit
from sentinel.event_loop import EventLoop
from sentinel.holders import Child, Handle, Holder, job_name
from sentinel.incidents import Incident
from sentinel.job_state import JobState
from sentinel.job_status import JobStatus
from sentinel.job_stops import JobStops
from sentinel.parsers import Garbled
from sentinel.parsers.hf_trainer import trainer_state_info
from sentinel.records import Alert, Sample
from sentinel.reload import reloaded
from sentinel.restarts import Restarts
from sentinel.service import Service
from sentinel.shedding import Shedder
from sentinel.signals import SignalForwarder
from sentinel.sources.inbox import Inbox
from sentinel.sources.process import exit_status
from sentinel.sources.system import SystemSources
from sentinel.state import StateStore
from sentinel.status import CHECKPOINTS_DIR_KEY
from sentinel.stopping import Stop
from sentinel.watch import Watch
from sentinel.workers import Workers

log = logging.getLogger(__name__)


class Supervisor:
    """Runs the job under watch until it finishes, or restarts run out."""

    def __init__(
        self,
        settings: Settings,
        command: list[str] | None = None,
        *,
        holder: Holder | None = None,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
        reload: Callable[[], Settings] | None = None,
    ) -> None:
        """``command`` for ``run`` (a child), or ``holder`` for another way to hold the job;
        ``reload`` reads the config again on SIGHUP."""
        self.settings = settings
        if holder is None:
            assert command is not None, "a command or a holder"
            holder = Child(
                command,
                settings,
                stdout=stdout if stdout is not None else sys.stdout.buffer,
                stderr=stderr if stderr is not None else sys.stderr.buffer,
            )
        self.holder = holder
        self._reload = reload
        self.state = JobState.STARTING
        self.exit_code = 0
        #: Sheds output the loop cannot keep up with; bounds the inbox's output too.
        self._shedder = Shedder()
        self._events: Inbox[tuple[str, Any]] = Inbox(self._shedder)
        self._loop = EventLoop(self._events, self, settings.tick_interval_s)
        self._job: Handle | None = None
        self._attempt = 0
        self.restart_at: float | None = None
        self._restarts = Restarts(
            settings.job,
            settings.checkpoints,
            settings.keep,
            relaunches=holder.relaunches,
            state_dir=settings.state_dir,
            verdict_file=settings.verdict_file,
        )
        self._waiting_since: float | None = None
        #: ``watch``: the last attempt ended and the rules were started afresh for the next.
        self._waiting_for_next = False
        self.finished = False
        self._store: StateStore | None = None
        self._workers: Workers | None = None
        self._signals = SignalForwarder(lambda signum: self._events.put(("signal", signum)))
        self.service = Service(
            settings,
            job_name=job_name(settings, self.holder),
            mode=holder.mode,
            live_checks={"sources": self._sources_alive},
        )
        #: When the loop last turned (monotonic), for the heartbeat's health check.
        self._loop_turned_at = time.monotonic()
        self._system = SystemSources(
            settings.gpu, settings.process, self._put_system, on_reading=self._put_reading
        )

    # -- the loop -------------------------------------------------------------

    def run(self) -> int:
        """Run to the end; the exit status of the job's last attempt (0 if it finished)."""
        settings = self.settings
        store = self._store = StateStore(settings.state_dir)
        if settings.checkpoints is not None:  # for `sentinel status`: the disk it takes
            store.put(CHECKPOINTS_DIR_KEY, os.path.abspath(settings.checkpoints))
        if not self.holder.relaunches:
            # The restart budget and the same-failure memory outlive sentinel (and its pod).
            keys = self._restarts.to_state()
            self._restarts.from_state({key: store.get(key) for key in keys})
            self._attempt = int(store.get("watch.attempt") or 0)
        self.service.start()
        metrics = self.service.metrics
        workers = self._workers = Workers(
            settings, store, put=self._events.put, healthy=self._healthy,
            on_delivery=metrics.notified, mode=self.holder.mode,
        )  # fmt: skip
        name = job_name(settings, self.holder)
        self.watch = Watch(
            settings, store=store, notifier=workers.notifier, job_name=name,
            on_incident=metrics.incident_opened, remember=True,
            run_wide=not self.holder.relaunches,
        )  # fmt: skip
        self._after = Aftermath(
            self, self._restarts,
            run_verdict.for_run(settings.checkpoints, settings.run_id, os.environ),
            watch=self.watch, service=self.service, relaunches=self.holder.relaunches,
        )  # fmt: skip
        self._after.store = store
        self._status = JobStatus(self.service, self.watch, store, self._shedder)
        self._stops = JobStops(
            self, self.holder, watch=self.watch, service=self.service, after=self._after,
            put=self._events.put,
        )  # fmt: skip
        self._system.start()
        self._signals.install()
        workers.start()
        self.service.ready()
        try:
            self._start_attempt()
            self._loop.run()
        finally:
            self.service.stopping(settings.drain_timeout_s)
            workers.stop_reading()
            self._system.stop()
            self._restarts.close()
            self._loop.drain()
            workers.stop_notifying(settings.drain_timeout_s)
            self.watch.close()
            store.close()
            self.service.close()
            self._signals.restore()
        return self.exit_code

    def turned(self) -> None:
        self._loop_turned_at = time.monotonic()
        self.service.turned(time.time())

    # -- events ---------------------------------------------------------------

    def on_lines(self, source: str, lines: list[str], read_at: float) -> None:
        # The batch at once, then its alerts: a batch is at most a gathering window of
        # output, and the engine reads a batch of one schema far faster than line by line.
        self.service.lines(len(lines))
        if self.state is JobState.WAITING:
            self._start_attempt()  # output again: the job is likely back; judge it as its own
        shedder = self._shedder
        if self.state is JobState.STOPPING:
            lines = shedder.skim(lines)  # the stop is decided; its signals come first
        else:
            lines = shedder.keep(lines, time.time() - read_at)
        self._status.lines_shed()
        parse_started = time.perf_counter()
        alerts = self.watch.engine.feed_texts(source, lines, read_at)
        shedder.parsed(len(lines), time.perf_counter() - parse_started)
        if alerts:
            self._handle(alerts)

    def _put_system(self, source: str, samples: list[Sample], read_at: float) -> None:
        """From a GPU source's thread, an event (an XID): it joins the inbox and wakes the loop."""
        self._events.put(("system", ({source: samples}, read_at)))

    def _put_reading(self, readings: dict[str, list[Sample]], read_at: float) -> None:
        """From the GPU poll or process thread: a periodic reading (source -> samples), one
        event that waits for the loop's next turn (at the latest its next tick)."""
        self._events.put(("system", (readings, read_at)), wake=False)

    def on_system(self, readings: dict[str, list[Sample]], read_at: float) -> None:
        for source, samples in readings.items():
            self._handle(self.watch.engine.feed_system(source, samples, read_at))

    def on_trainer_state(self, source: str, text: str, read_at: float) -> None:
        """A ``trainer_state.json`` the job wrote (found under its folder): the run's shape
        (max steps, batch size) for the rules and reports, and the HF dicts' steps per epoch."""
        engine = self.watch.engine
        training = self.settings.training
        try:
            engine.facts.observe_trainer_state(
                trainer_state_info(text),
                accumulation_steps=training.gradient_accumulation_steps,
                world_size=training.world_size,
            )
        except Garbled as error:
            log.warning("%s: %s (skipped)", source, error)
            return
        engine.parser.learn_trainer_state(text)

    def _healthy(self) -> bool:
        """For the heartbeat: the loop turned lately and no source's thread has died."""
        idle_s = time.monotonic() - self._loop_turned_at
        return idle_s < 3 * self.settings.tick_interval_s + 5.0 and self._sources_alive()

    def _sources_alive(self) -> bool:
        workers = self._workers
        return (workers is None or workers.alive) and self._system.alive()

    def on_tick(self) -> None:
        now = time.time()
        self.watch.tick(now)  # repeats of open critical incidents
        self._restarts.look(now)
        self._stops.join_run()
        if self.state is JobState.WAITING:
            self._start_attempt()
        workers = self._workers
        self._status.tick(
            now,
            attempt=self._attempt,
            outbox_depth=workers.pending() if workers is not None else None,
        )
        job = self._job
        uptime_s = now - job.started_at if job is not None else 0.0
        if self.state is JobState.STARTING and uptime_s >= self.settings.job.min_uptime_s:
            self.set_state(JobState.RUNNING)
        if self.state in (JobState.STARTING, JobState.RUNNING):
            self._handle(self.watch.engine.tick(now))

    def _handle(self, alerts: list[Alert]) -> None:
        decided_at = time.time()
        for alert in alerts:  # its ``time`` is when its evidence was read
            alert.details.setdefault("decided_at", decided_at)
        self.service.alerted(alerts)
        for incident in self.watch.handle(alerts):
            self._stops.act(incident)  # first: the report and messages can wait a millisecond
            self.watch.update(incident)

    def on_terminated(self, stop: Stop | None, result: TreeStop) -> None:
        self._stops.terminated(stop, result)

    def on_evidence(self, stop: Stop | None, taken: Any) -> None:
        self._stops.evidence(stop, taken)

    def on_exit(self, attempt: int, returncode: int | None) -> None:
        """An attempt ended; ``returncode`` None when not knowable (a job started elsewhere)."""
        if attempt != self._attempt:
            return
        now = time.time()
        stops = self._stops
        stop = stops.current
        said = "ended (exit status unknown)" if returncode is None else describe_exit(returncode)
        log.info("job (attempt %d) %s", attempt, said)
        if returncode is not None:
            self._handle(self.watch.engine.job_exited(returncode, now, expected=stop is not None))
        stop = stops.current  # a job_crash incident may have decided on a restart just now
        self._job = None
        self._system.set_job(None)
        self.service.metrics.target_up(False)
        status = 0 if returncode is None else exit_status(returncode)
        if stop is None:
            self._attempt_over(status, JobState.EXITED if status == 0 else JobState.FATAL)
            return
        stops.current = None
        if stop.joined is not None:
            self._after.joined(stop.joined)
            return
        incident = stop.incident
        if incident is not None:
            incident.record(now, f"job stopped: {said} after {now - stop.started_at:.1f} s")
        if not stop.restart or stops.shutdown_signals:
            self._attempt_over(status, JobState.EXITED if status == 0 else JobState.FATAL, incident)
            return
        assert incident is not None
        self._after.plan_restart(incident, status)

    def _attempt_over(self, status: int, state: JobState, incident: Incident | None = None) -> None:
        """``run`` ends with its job; ``watch`` waits for the next attempt."""
        if self.holder.relaunches:
            self.finish(status, state, incident)
            return
        if incident is not None:
            self.watch.update(incident, final=True)
        # What the job writes from now on is the next attempt's, even if it is read before
        # the process is found: the rules start fresh now, not when it is found.
        self.watch.job_started(time.time(), self._restarts.resume.step or 0)
        self._waiting_for_next = True
        self._wait_for_next()

    @property
    def restarts(self) -> int:
        """Restarts made so far."""
        return self._restarts.count

    # -- what the aftermath asks (``aftermath.Attempts``) --------------------------

    @property
    def attempt(self) -> int:
        return self._attempt

    @property
    def job(self) -> Handle | None:
        """The current attempt's job; None between attempts."""
        return self._job

    def attempt_over(self, status: int, state: JobState, incident: Incident | None) -> None:
        self._attempt_over(status, state, incident)

    def back_off(self, delay_s: float) -> None:
        self.set_state(JobState.BACKOFF)
        self.restart_at = time.monotonic() + delay_s

    def wait_for_next(self) -> None:
        self._wait_for_next()

    def gave_up(self) -> None:
        self.exit_code = verdict.EXIT_GIVE_UP

    def handle(self, alerts: list[Alert]) -> None:
        self._handle(alerts)

    def finish(self, status: int, state: JobState, incident: Incident | None = None) -> None:
        if incident is not None:
            self.watch.update(incident, final=True)
        self.exit_code = status
        self.set_state(state)
        self.finished = True

    def on_signal(self, signum: int) -> None:
        if signum == signal.SIGHUP:
            self._reload_config()
            return
        self._stops.shutdown(signum)

    def _reload_config(self) -> None:
        """SIGHUP: the new config's rules, notification routes and restart policy take over
        for what comes next; a bad one is refused and the old one kept."""
        settings = reloaded(self.settings, self._reload)
        if settings is not None:
            self.settings = settings
            self._restarts.job = settings.job
            self.watch.reload(settings)

    # -- attempts ---------------------------------------------------------------

    def restart_due(self) -> None:
        self._start_attempt()

    def _start_attempt(self) -> None:
        """Launch the next attempt (``run``), or look for it (``watch``)."""
        attempt = self._attempt + 1
        try:
            job = self.holder.begin(attempt, self._restarts, self._events.put)
        except OSError as error:
            log.error("cannot start the job %s: %s", self.holder.describe(), error)
            self.finish(127, JobState.FATAL)
            return
        if job is None:
            self._wait_for_next()
            return
        self._attempt = attempt
        self._waiting_since = None
        self._status.attempt_started(job.started_at)
        self._job = job
        if not self.holder.relaunches and self._store is not None:
            self.watch.safely("the attempt", self._store.put, "watch.attempt", str(attempt))
            verdict.clear(self.settings.state_dir)  # the next attempt is under way
        self._system.set_job(job.identity)
        self.service.metrics.attempt_started(attempt)
        self.service.metrics.target_up(True)
        if not self._waiting_for_next:  # else the rules were started fresh at the last end
            resumed_at = self._restarts.resume.step if self.restarts else None
            who = job.identity
            identity = None if who is None else (who.pid, who.create_time)
            self.watch.job_started(job.started_at, resumed_at or 0, identity)
        self._waiting_for_next = False
        self.set_state(JobState.STARTING)
        log.info(
            "job %s (attempt %d, pid %d): %s",
            "started" if self.holder.relaunches else "found",
            attempt,
            job.pid,
            self.holder.describe(),
        )

    def _wait_for_next(self) -> None:
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

    def set_state(self, state: JobState) -> None:
        if state is not self.state:
            log.info("job state %s -> %s", self.state, state)
            self.state = state
        self._status.state(self.state, self._job, self.restarts)
