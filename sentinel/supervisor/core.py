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

The job's life follows Supervisor's states (``sentinel.supervisor.attempts``). ``run`` holds a
child it launches and relaunches; ``watch`` a process started elsewhere, whose next
attempt it waits for (sentinel.supervisor.holders). Both take the same decisions and write the
same verdicts.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from sentinel.config import Settings
from sentinel.config.reload import reloaded
from sentinel.model.records import Alert, Sample
from sentinel.parsing import Garbled
from sentinel.parsing.hf_trainer import trainer_state_info
from sentinel.process.identity import ProcessIdentity
from sentinel.process.launched import exit_status
from sentinel.process.signal_tree import TreeStop
from sentinel.process.system import SystemSources
from sentinel.rules.job_crash import describe_exit
from sentinel.service import summary
from sentinel.service.health import Service
from sentinel.service.status import CHECKPOINTS_DIR_KEY
from sentinel.service.watch import Watch
from sentinel.store import run_verdict, stop_intent
from sentinel.store.state import StateStore
from sentinel.store.stop_intent import MAX_TRIES, StopIntent
from sentinel.supervisor.aftermath import Aftermath
from sentinel.supervisor.attempts import JobAttempts
from sentinel.supervisor.event_loop import EventLoop
from sentinel.supervisor.events import Event, Readings, SignalReceived, Stop
from sentinel.supervisor.holders import Child, Holder, job_name
from sentinel.supervisor.inbox import Inbox
from sentinel.supervisor.job_state import JobState
from sentinel.supervisor.job_status import JobStatus
from sentinel.supervisor.restarts import Restarts
from sentinel.supervisor.shedding import Shedder
from sentinel.supervisor.signals import SignalForwarder
from sentinel.supervisor.stop_journal import StopJournal
from sentinel.supervisor.stops import JobStops
from sentinel.supervisor.workers import Workers

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
        summary: bool = True,
    ) -> None:
        """``command`` for ``run`` (a child), or ``holder`` for another way to hold the job;
        ``reload`` reads the config again on SIGHUP; ``summary``: end with the morning-after
        block on stderr (``service.summary``)."""
        self._summary = summary
        self.settings = settings
        #: The job's output comes through terminals of sentinel's making (``run``, --pty).
        through_pty = holder is None and settings.job.pty
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
        #: Sheds output the loop cannot keep up with; bounds the inbox's output too.
        self._shedder = Shedder(through_pty=through_pty)
        self._events: Inbox[Event] = Inbox(self._shedder)
        self._loop = EventLoop(self._events, self, settings.tick_interval_s)
        self._journal = StopJournal(settings.state_dir)
        self._restarts = Restarts(
            settings.job,
            settings.checkpoints,
            settings.keep,
            relaunches=holder.relaunches,
            state_dir=settings.state_dir,
            verdict_file=settings.verdict_file,
            journal=self._journal,
        )
        self._workers: Workers | None = None
        self._signals = SignalForwarder(lambda signum: self._events.put(SignalReceived(signum)))
        self.service = Service(
            settings,
            job_name=job_name(settings, self.holder),
            mode=holder.mode,
            live_checks={"sources": self._sources_alive},
        )
        self._is_ready = False
        #: When the loop last turned (monotonic), for the heartbeat's health check.
        self._loop_turned_at = time.monotonic()
        self._system = SystemSources(
            settings.gpu, settings.process, self._put_system, on_reading=self._put_reading
        )

    # -- the loop -------------------------------------------------------------

    def run(self) -> int:
        """Run to the end; the exit status of the job's last attempt (0 if it finished)."""
        settings = self.settings
        started = time.time()
        store = StateStore(settings.state_dir)
        if settings.checkpoints is not None:  # for `sentinel status`: the disk it takes
            store.put(CHECKPOINTS_DIR_KEY, os.path.abspath(settings.checkpoints))
        if not self.holder.relaunches:
            # The restart budget and the same-failure memory outlive sentinel (and its pod).
            keys = self._restarts.to_state()
            self._restarts.from_state({key: store.get(key) for key in keys})
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
        self._status = JobStatus(self.service, self.watch, store, self._shedder)
        attempts = self._attempts = JobAttempts(
            settings, self.holder, self._restarts, watch=self.watch, status=self._status,
            system=self._system, service=self.service, store=store, put=self._events.put,
            handle=self._handle,
        )  # fmt: skip
        self._after = Aftermath(
            attempts, self._restarts,
            run_verdict.for_run(settings.checkpoints, settings.run_id, os.environ),
            watch=self.watch, service=self.service, relaunches=self.holder.relaunches,
        )  # fmt: skip
        self._after.store = store
        self._stops = JobStops(
            attempts, self.holder, watch=self.watch, service=self.service, after=self._after,
            put=self._events.put, journal=self._journal,
        )  # fmt: skip
        self._system.start()
        self._signals.install()
        workers.start()
        unfinished = stop_intent.pending(
            settings.state_dir,
            last_attempt=self.holder.last_attempt(),
            relaunches=self.holder.relaunches,
        )
        try:
            if unfinished is None:
                self._ready()
                attempts.start()
            else:
                self._take_up(unfinished)
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
        if self._summary:
            sys.stderr.write(
                summary.summary(
                    self.watch.incidents(),
                    status=attempts.exit_code,
                    restarts=self._restarts.count,
                    elapsed_s=time.time() - started,
                    relaunches=self.holder.relaunches,
                    resumed_from=attempts.resumed_from,
                    state_dir=settings.state_dir,
                )
            )
            sys.stderr.flush()
        return attempts.exit_code

    def _ready(self) -> None:
        """Ready (sd_notify, ``/readyz``): once no stop of an earlier sentinel is left undone."""
        if not self._is_ready:
            self._is_ready = True
            self.service.ready()

    def _take_up(self, intent: StopIntent) -> None:
        """Finish the stop the last sentinel on this state dir decided and died during: stop
        the job if it still runs, roll back as planned, restart from the planned checkpoint;
        never from scratch while the plan names one. Ready once the job is stopped and the
        rollback done."""
        attempts, after = self._attempts, self._after
        incident = intent.the_incident()
        first = incident.first.step if incident.alerts else None
        if intent.tries >= MAX_TRIES:
            after.give_up(
                incident,
                f"{intent.tries} sentinels started on the unfinished stop for {incident.rule}"
                f" (step {first}) and none finished it: giving up; what is where is in"
                f" {self.settings.state_dir / 'verdict.json'} and the checkpoint dir's quarantine",
            )
            self._ready()
            return
        intent = self._journal.take_up(intent)
        log.warning(
            "the last sentinel died while it stopped the job for %s (step %s, %s): finishing"
            " what it decided (try %d of %d)",
            incident.rule, first, intent.phase, intent.tries, MAX_TRIES,
        )  # fmt: skip
        self._restarts.from_state(intent.restarts)
        if intent.phase == stop_intent.RESTARTING:
            # Rolled back, verdict written: only the restart is left.
            self._journal.closing(intent.restarts)
            attempts.attempt = intent.attempt
            self.holder.forget_orphan()
            self._ready()
            attempts.back_off(0.0)
            return
        stopped = None if intent.job is None else ProcessIdentity(*intent.job)
        if stopped is not None and stopped.running():
            attempts.start()  # adopts it (run) or finds it (watch)
            if self._stops.resume(incident, intent):
                return  # the rollback follows its exit (``on_exit``), then ready
            log.warning("the job found is not the one stopped: stopping it by its identity")
        attempts.attempt = max(attempts.attempt, intent.attempt)
        self.holder.forget_orphan()
        status = self.holder.exit_status_of(intent.attempt)
        if not intent.restart:
            self._journal.ended()
            self._ready()
            attempts.finish(143 if status is None else status, JobState.FATAL, incident)
            return
        after.plan_restart(incident, 143 if status is None else status)
        self._ready()

    @property
    def finished(self) -> bool:
        """The run is over: the loop ends after its current turn."""
        return self._attempts.finished

    @finished.setter
    def finished(self, finished: bool) -> None:
        self._attempts.finished = finished

    @property
    def restart_at(self) -> float | None:
        """When the next attempt is due (monotonic), or None."""
        return self._attempts.restart_at

    @restart_at.setter
    def restart_at(self, restart_at: float | None) -> None:
        self._attempts.restart_at = restart_at

    @property
    def restarts(self) -> int:
        """Restarts made so far."""
        return self._restarts.count

    def turned(self) -> None:
        self._loop_turned_at = time.monotonic()
        self.service.turned(time.time())

    # -- events ---------------------------------------------------------------

    def on_lines(self, source: str, lines: list[str], read_at: float) -> None:
        # The batch at once, then its alerts: a batch is at most a gathering window of
        # output, and the engine reads a batch of one schema far faster than line by line.
        self.service.lines(len(lines))
        attempts = self._attempts
        if attempts.state is JobState.WAITING:
            attempts.start()  # output again: the job is likely back; judge it as its own
        shedder = self._shedder
        if attempts.state is JobState.STOPPING:
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
        self._events.put(Readings({source: samples}, read_at))

    def _put_reading(self, readings: dict[str, list[Sample]], read_at: float) -> None:
        """From the GPU poll or process thread: a periodic reading (source -> samples), one
        event that waits for the loop's next turn (at the latest its next tick)."""
        self._events.put(Readings(readings, read_at), wake=False)

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
        attempts = self._attempts
        if attempts.state is JobState.WAITING:
            attempts.start()
        workers = self._workers
        self._status.tick(
            now,
            attempt=attempts.attempt,
            outbox_depth=workers.pending() if workers is not None else None,
        )
        attempts.tick(now)
        if attempts.state in (JobState.STARTING, JobState.RUNNING):
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
        attempts = self._attempts
        if attempt != attempts.attempt:
            return
        now = time.time()
        stops = self._stops
        stop = stops.current
        held = attempts.job
        relay_failed = held is not None and held.relay_failed
        said = "ended (exit status unknown)" if returncode is None else describe_exit(returncode)
        log.info("job (attempt %d) %s", attempt, said)
        if returncode is not None:
            self._handle(self.watch.engine.job_exited(returncode, now, expected=stop is not None))
        stop = stops.current  # a job_crash incident may have decided on a restart just now
        attempts.ended()
        status = 0 if returncode is None else exit_status(returncode)
        if relay_failed:
            status = 1  # its status is unknown: the relay failed, sentinel's doing (logged)
        if stop is None:
            attempts.attempt_over(status, JobState.EXITED if status == 0 else JobState.FATAL)
            return
        stops.current = None
        if stop.joined is not None:
            self._after.joined(stop.joined)
            return
        incident = stop.incident
        if incident is not None:
            incident.record(now, f"job stopped: {said} after {now - stop.started_at:.1f} s")
        if stops.shutdown_signum is not None:
            # Asked to stop (Ctrl-C, SIGTERM): exit as a program that signal ended, whatever
            # the job made of its own stop signal.
            self._journal.ended()
            attempts.attempt_over(exit_status(-stops.shutdown_signum), JobState.EXITED, incident)
            return
        if not stop.restart:
            self._journal.ended()
            self._ready()
            attempts.attempt_over(
                status, JobState.EXITED if status == 0 else JobState.FATAL, incident
            )
            return
        assert incident is not None
        self._after.plan_restart(incident, status)
        self._ready()

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
            self.settings = self._attempts.settings = settings
            self._restarts.job = settings.job
            self.watch.reload(settings)

    # -- attempts ---------------------------------------------------------------

    def restart_due(self) -> None:
        self._attempts.start()
