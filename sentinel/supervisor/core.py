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

The job's life is one machine (``sentinel.supervisor.machine``): the loop hands it the
events that move it, and it alone changes the job's phase. ``run`` holds a child it launches
and relaunches; ``watch`` a process started elsewhere, whose next attempt it waits for
(sentinel.supervisor.holders). Both take the same decisions and write the same verdicts.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from sentinel.config import Settings
from sentinel.config.reload import reloaded
from sentinel.model.records import Marks, Sample
from sentinel.parsing import Garbled
from sentinel.parsing.hf_trainer import trainer_state_info
from sentinel.process.signal_tree import TreeStop
from sentinel.process.system import SystemSources
from sentinel.service import summary
from sentinel.service.health import Service
from sentinel.service.status import CHECKPOINTS_DIR_KEY
from sentinel.service.watch import Watch
from sentinel.store import run_verdict, stop_intent
from sentinel.store.state import StateStore
from sentinel.supervisor.aftermath import Aftermath
from sentinel.supervisor.attempts import JobAttempts
from sentinel.supervisor.event_loop import EventLoop
from sentinel.supervisor.events import Event, JobExited, Readings, SignalReceived, Stop
from sentinel.supervisor.holders import Child, Holder, job_name
from sentinel.supervisor.inbox import Inbox
from sentinel.supervisor.job_state import JobState
from sentinel.supervisor.job_status import JobStatus
from sentinel.supervisor.machine import JobMachine
from sentinel.supervisor.restarts import Restarts
from sentinel.supervisor.shedding import Shedder
from sentinel.supervisor.signals import SignalForwarder
from sentinel.supervisor.stop_journal import StopJournal
from sentinel.supervisor.stops import JobStops
from sentinel.supervisor.workers import Workers

log = logging.getLogger(__name__)

#: How long ``watch`` waits before it judges the end of a job that ended by itself, for
#: its last lines: the followers hand on what they hold at once then (``hand_on_soon``),
#: and this leaves a write the job's end overtook a look and a turn, twice over.
EXIT_SETTLE_S = 0.6


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
            job_started_at=self.holder.found_started_at(),
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
        )  # fmt: skip
        self._stops = JobStops(
            self.holder, watch=self.watch, service=self.service, put=self._events.put
        )
        after = Aftermath(
            self._restarts,
            run_verdict.for_run(settings.checkpoints, settings.run_id, os.environ),
            watch=self.watch, service=self.service, relaunches=self.holder.relaunches,
            store=store,
        )  # fmt: skip
        machine = self._machine = JobMachine(
            settings, self.holder, attempts=attempts, stops=self._stops, after=after,
            restarts=self._restarts, journal=self._journal, watch=self.watch,
            service=self.service,
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
            machine.begin(unfinished)
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
                    status=machine.exit_code,
                    restarts=self._restarts.count,
                    elapsed_s=time.time() - started,
                    relaunches=self.holder.relaunches,
                    resumed_from=attempts.resumed_from,
                    state_dir=settings.state_dir,
                )
            )
            sys.stderr.flush()
        return machine.exit_code

    @property
    def finished(self) -> bool:
        """The run is over: the loop ends after its current turn."""
        return self._machine.finished

    @property
    def restart_at(self) -> float | None:
        """When the next attempt is due (monotonic), or None."""
        return self._machine.restart_at

    @restart_at.setter
    def restart_at(self, restart_at: float | None) -> None:
        self._machine.restart_at = restart_at

    @property
    def restarts(self) -> int:
        """Restarts made so far."""
        return self._restarts.count

    def turned(self) -> None:
        self._loop_turned_at = time.monotonic()
        self.service.turned(time.time())

    # -- events ---------------------------------------------------------------

    def on_lines(self, source: str, lines: list[str], read_at: float, marks: Marks = ()) -> None:
        # The batch at once, then its alerts: a batch is at most a gathering window of
        # output, and the engine reads a batch of one schema far faster than line by line.
        self.service.lines(len(lines))
        machine = self._machine
        machine.look_for_job()  # output again: the job is likely back; judge it as its own
        shedder = self._shedder
        if machine.state is JobState.STOPPING:
            lines = shedder.skim(lines)  # the stop is decided; its signals come first
        else:
            lines = shedder.keep(lines, time.time() - read_at)
        self._status.lines_shed()
        parse_started = time.perf_counter()
        # Lines the shedder left out move its marks' lines earlier: their bounds stay true.
        alerts = self.watch.engine.feed_texts(source, lines, read_at, marks)
        shedder.parsed(len(lines), time.perf_counter() - parse_started)
        if alerts:
            machine.alerts(alerts)

    def _put_system(self, source: str, samples: list[Sample], read_at: float) -> None:
        """From a GPU source's thread, an event (an XID): it joins the inbox and wakes the loop."""
        self._events.put(Readings({source: samples}, read_at))

    def _put_reading(self, readings: dict[str, list[Sample]], read_at: float) -> None:
        """From the GPU poll or process thread: a periodic reading (source -> samples), one
        event that waits for the loop's next turn (at the latest its next tick)."""
        self._events.put(Readings(readings, read_at), wake=False)

    def on_system(self, readings: dict[str, list[Sample]], read_at: float) -> None:
        for source, samples in readings.items():
            self._machine.alerts(self.watch.engine.feed_system(source, samples, read_at))

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
        self._restarts.look(now, self.watch.warned_since())
        machine = self._machine
        machine.run_decided()
        machine.look_for_job()
        workers = self._workers
        self._status.tick(
            now,
            attempt=self._attempts.attempt,
            outbox_depth=workers.pending() if workers is not None else None,
        )
        machine.tick(now)
        if machine.judging:
            machine.alerts(self.watch.engine.tick(now))

    def on_terminated(self, stop: Stop | None, result: TreeStop) -> None:
        self._stops.terminated(stop, result)

    def on_evidence(self, stop: Stop | None, taken: Any) -> None:
        self._stops.evidence(stop, taken)

    def on_exit(self, attempt: int, returncode: int | None, *, settled: bool = False) -> None:
        """An attempt ended; ``returncode`` None when not knowable (a job started elsewhere).

        In ``watch``, a job that ended by itself is judged once its logs had time to be read
        to their end (``EXIT_SETTLE_S``): a traceback written as it died reached the
        followers after its end was seen, and the crash went unsaid."""
        if (
            returncode is None
            and not settled
            and not self.holder.relaunches
            and self._machine.stop is None
        ):
            tailer = self._workers.tailer if self._workers is not None else None
            if tailer is not None:
                tailer.hand_on_soon()
            later = threading.Timer(
                EXIT_SETTLE_S, self._events.put, (JobExited(attempt, None, settled=True),)
            )
            later.daemon = True
            later.start()
            return
        self._machine.job_exited(attempt, returncode)

    def on_signal(self, signum: int) -> None:
        if signum == signal.SIGHUP:
            self._reload_config()
            return
        self._machine.shutdown(signum)

    def _reload_config(self) -> None:
        """SIGHUP: the new config's rules, notification routes and restart policy take over
        for what comes next; a bad one is refused and the old one kept."""
        settings = reloaded(self.settings, self._reload)
        if settings is not None:
            self.settings = self._attempts.settings = self._machine.settings = settings
            self._restarts.job = settings.job
            self.watch.reload(settings)

    # -- attempts ---------------------------------------------------------------

    def restart_due(self) -> None:
        self._machine.restart_due()
