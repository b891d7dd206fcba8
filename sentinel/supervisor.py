"""``sentinel run``: launch the job, watch it, act, restart it from a clean checkpoint.

One thread owns every decision: it takes events (output lines, the job's
exit, clock ticks, signals) from one inbox, runs them through the engine,
and acts. Slow effects stay off it: notification goes through the outbox
worker, the SIGTERM-grace-SIGKILL sequence runs on its own thread and
reports back through the inbox. Events that arrive while it is busy are
taken together, so a chatty job costs a wake-up per batch, not per line.
The loop wakes for nothing else it can put off: the GPU and process readings
(once a second or less often) wait for its next turn, and a clock tick due
soon rides on a turn it takes anyway.

The job's life follows Supervisor's states: STARTING (launched, younger than
``min_uptime_s``), RUNNING, STOPPING (sentinel asked it to stop), BACKOFF
(waiting to restart), and the final EXITED or FATAL.
"""

from __future__ import annotations

import logging
import os
import queue
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from sentinel.actions.heartbeat import Heartbeat
from sentinel.actions.notify import Notifier, Outbox
from sentinel.actions.terminate import TerminateResult, send_sigterm, terminate
from sentinel.config import Settings
from sentinel.detectors import DETECTORS
from sentinel.detectors.job_crash import describe_exit
from sentinel.incidents import Incident
from sentinel.records import Alert, Sample, Severity
from sentinel.restarts import EXIT_GIVE_UP, Restarts
from sentinel.sources.inbox import Inbox
from sentinel.sources.process import JobProcess, exit_status
from sentinel.sources.system import SystemSources
from sentinel.state import StateStore
from sentinel.status import CHECKPOINTS_DIR_KEY
from sentinel.watch import Watch

if TYPE_CHECKING:
    from sentinel.sources.tailer import LogTailer

log = logging.getLogger(__name__)

#: A clock tick due within this fraction of ``tick_interval_s`` runs on the loop's turn
#: now rather than on a wake-up of its own (a quarter: at most 250 ms early at 1 s).
TICK_EARLY_FRACTION = 0.25


class JobState(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    BACKOFF = "BACKOFF"
    EXITED = "EXITED"
    FATAL = "FATAL"


@dataclass
class _Stop:
    """A stop sentinel decided on: why, and whether a restart follows."""

    incident: Incident | None
    restart: bool
    started_at: float = field(default_factory=time.time)


class Supervisor:
    """Runs the job under watch until it finishes, or restarts run out."""

    def __init__(
        self,
        settings: Settings,
        command: list[str],
        *,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
    ) -> None:
        self.settings = settings
        self.command = command
        self.stdout = stdout if stdout is not None else sys.stdout.buffer
        self.stderr = stderr if stderr is not None else sys.stderr.buffer
        self.state = JobState.STARTING
        self.exit_code = 0
        self._events: Inbox[tuple[str, Any]] = Inbox()
        self._job: JobProcess | None = None
        self._attempt = 0
        self._stop: _Stop | None = None
        self._restart_at: float | None = None
        self._restarts = Restarts(settings.job, settings.checkpoints, settings.keep)
        self._shutdown_signals = 0
        self._finished = False
        self._store: StateStore | None = None
        self._log_tailer: LogTailer | None = None
        self._signals: queue.SimpleQueue[int | None] | None = None
        #: When the loop last turned (monotonic), for the heartbeat's health check.
        self._loop_turned_at = time.monotonic()
        self._system = SystemSources(settings, self._put_system, on_reading=self._put_reading)

    # -- the loop -------------------------------------------------------------

    def run(self) -> int:
        """Run to the end; the exit status of the job's last attempt (0 if it finished)."""
        settings = self.settings
        store = self._store = StateStore(settings.state_dir)
        if settings.checkpoints is not None:  # for `sentinel status`: the disk it takes
            store.put(CHECKPOINTS_DIR_KEY, os.path.abspath(settings.checkpoints))
        notifier = Notifier(
            Outbox(store, [url.get_secret_value() for url in settings.notify.urls]),
            timeout_s=settings.notify.timeout_s,
            retry_max_s=settings.notify.retry_max_s,
        )
        self.watch = Watch(settings, store=store, notifier=notifier, job_name=self._job_name())
        tailer = self._log_tailer = self._tailer(store)
        self._system.start()
        previous_handlers = self._install_signal_handlers()
        notifier.start()
        if tailer is not None:
            tailer.start()
        heartbeat = None
        if settings.notify.heartbeat_url is not None:
            heartbeat = Heartbeat(
                settings.notify.heartbeat_url.get_secret_value(),
                settings.notify.heartbeat_interval_s,
                self._healthy,
                store=store,
                timeout_s=settings.notify.timeout_s,
            )
            heartbeat.start()
        try:
            self._start_attempt()
            self._loop()
        finally:
            if heartbeat is not None:
                heartbeat.stop()
            if tailer is not None:
                tailer.stop()
            self._system.stop()
            self._restarts.close()
            self._drain()
            notifier.stop(drain_s=settings.notify.timeout_s)
            self.watch.close()
            store.close()
            self._restore_signal_handlers(previous_handlers)
        return self.exit_code

    def _tailer(self, store: StateStore) -> LogTailer | None:
        """The tailer of the ``--log`` files; None without any.

        Without, neither its thread nor watchdog's wakes every second for nothing, and
        watchdog is not even imported (a few MiB of RSS).
        """
        settings = self.settings
        if not settings.logs:
            return None
        from sentinel.sources.tailer import LogTailer

        return LogTailer(
            settings.logs,
            lambda path, lines: self._events.put(("lines", (path, lines, time.time()))),
            offsets=store,
            poll=settings.tail.poll,
            poll_interval_s=settings.tail.poll_interval_s,
            max_line_bytes=settings.tail.max_line_bytes,
            batch_s=settings.tail.batch_s,
        )

    def _loop(self) -> None:
        tick_s = self.settings.tick_interval_s
        # A tick due this soon is run on a turn the loop takes anyway (a batch of output):
        # a wake-up of its own costs more than the tick (see the module).
        early_s = tick_s * TICK_EARLY_FRACTION
        next_tick = time.monotonic() + tick_s
        while not self._finished:
            self._loop_turned_at = time.monotonic()
            deadline = next_tick if self._restart_at is None else min(next_tick, self._restart_at)
            events = self._events.take(max(0.0, deadline - time.monotonic()))
            now_mono = time.monotonic()
            self._dispatch(events)
            if now_mono >= next_tick - early_s:
                # On the beat, so that early ticks do not add up to more ticks; after a
                # long turn, a full interval from now.
                next_tick = max(next_tick + tick_s, now_mono + tick_s - early_s)
                self._on_tick()
            if self._restart_at is not None and now_mono >= self._restart_at:
                self._restart_at = None
                self._start_attempt()

    def _dispatch(self, events: list[tuple[str, Any]], *, late: bool = False) -> None:
        """Handle events in arrival order; after the end (``late``) only output and outcomes."""
        for kind, payload in events:
            if kind == "lines":
                self._on_lines(*payload)
            elif kind == "terminated":
                self._on_terminated(*payload)
            elif late or self._finished:
                continue
            elif kind == "system":
                self._on_system(*payload)
            elif kind == "exit":
                self._on_exit(*payload)
            elif kind == "signal":
                self._on_signal(payload)

    def _drain(self) -> None:
        """Take in what arrived after the end: late output, a SIGKILL's outcome for the report."""
        while events := self._events.take(0):
            self._dispatch(events, late=True)

    # -- events ---------------------------------------------------------------

    def _on_lines(self, source: str, lines: list[str], read_at: float) -> None:
        # The batch at once, then its alerts: a batch is at most a gathering window of
        # output, and the engine reads a batch of one schema far faster than line by line.
        alerts = self.watch.engine.feed_texts(source, lines, read_at)
        if alerts:
            self._handle(alerts)

    def _put_system(self, source: str, samples: list[Sample], read_at: float) -> None:
        """From a GPU source's thread, an event (an XID): it joins the inbox and wakes the loop."""
        self._events.put(("system", ({source: samples}, read_at)))

    def _put_reading(self, readings: dict[str, list[Sample]], read_at: float) -> None:
        """From the GPU poll or process thread: a periodic reading (source -> samples), one
        event that waits for the loop's next turn (at the latest its next tick)."""
        self._events.put(("system", (readings, read_at)), wake=False)

    def _on_system(self, readings: dict[str, list[Sample]], read_at: float) -> None:
        for source, samples in readings.items():
            self._handle(self.watch.engine.feed_system(source, samples, read_at))

    def _healthy(self) -> bool:
        """For the heartbeat: the loop turned lately and no source's thread has died."""
        idle_s = time.monotonic() - self._loop_turned_at
        fresh = idle_s < 3 * self.settings.tick_interval_s + 5.0
        tailer = self._log_tailer
        return fresh and (tailer is None or tailer.running) and self._system.alive()

    def _on_tick(self) -> None:
        now = time.time()
        self.watch.tick(now)  # repeats of open critical incidents
        self._restarts.look(now)
        job = self._job
        uptime_s = now - job.started_at if job is not None else 0.0
        if self.state is JobState.STARTING and uptime_s >= self.settings.job.min_uptime_s:
            self._set_state(JobState.RUNNING)
        if self.state in (JobState.STARTING, JobState.RUNNING):
            self._handle(self.watch.engine.tick(now))

    def _handle(self, alerts: list[Alert]) -> None:
        for incident in self.watch.handle(alerts):
            self._act(incident)  # first: the report and messages can wait a millisecond
            self.watch.update(incident)

    def _act(self, incident: Incident) -> None:
        """A critical incident opened or escalated: stop the job if its rule says so."""
        known = incident.rule in DETECTORS
        policy = self.settings.rule(incident.rule).on_critical if known else "notify"
        # A rule may ask for more than its usual policy (cost_overrun's kill_fraction: stop).
        for alert in reversed(incident.alerts):
            requested = alert.details.get("on_critical")
            if requested in ("notify", "stop", "restart"):
                policy = requested
                break
        if policy == "notify" or self._stop is not None:
            return
        job = self._job
        if job is None or self.state not in (JobState.STARTING, JobState.RUNNING):
            return
        if self.settings.dry_run:
            text = f"dry run: would SIGTERM the job (pid {job.pid}), " + (
                "roll back and restart it" if policy == "restart" else "and not restart it"
            )
            log.warning("%s", text)
            incident.record(time.time(), text)
            self.watch.update(incident)
            return
        self._stop = _Stop(incident, restart=policy == "restart")
        incident.record(
            time.time(),
            f"SIGTERM to the job's process group (pid {job.pid}),"
            f" SIGKILL after {self.settings.job.grace_period_s:g} s if still running",
        )
        self._terminate(job)

    def _terminate(self, job: JobProcess) -> None:
        identity = job.identity
        if identity is None:
            return  # it already exited; the waiter reports the exit
        stop = self._stop
        # SIGTERM right here, on the deciding thread: every millisecond is a step of training.
        if not send_sigterm(identity):
            return  # gone, or no longer our process: the waiter reports the exit
        self._set_state(JobState.STOPPING)
        grace_s = self.settings.job.grace_period_s

        def run_terminate() -> None:
            if job.wait(grace_s):
                return
            # Still running after the grace period: the full sequence again, ending in SIGKILL.
            result = terminate(identity, grace_s=0.0, wait_exit=job.wait)
            self._events.put(("terminated", (stop, result)))

        threading.Thread(target=run_terminate, name="terminate", daemon=True).start()

    def _on_terminated(self, stop: _Stop | None, result: TerminateResult) -> None:
        if stop is not None and stop.incident is not None and (result.killed or not result.exited):
            stop.incident.record(time.time(), result.detail)
            self.watch.update(stop.incident)

    def _on_exit(self, attempt: int, returncode: int) -> None:
        if attempt != self._attempt:
            return
        now = time.time()
        status = exit_status(returncode)
        stop = self._stop
        log.info("job (attempt %d) %s", attempt, describe_exit(returncode))
        self._handle(self.watch.engine.job_exited(returncode, now, expected=stop is not None))
        stop = self._stop  # a job_crash incident may have decided on a restart just now
        self._job = None
        self._system.set_job(None)
        if stop is None:
            self._finish(status, JobState.EXITED if status == 0 else JobState.FATAL)
            return
        self._stop = None
        incident = stop.incident
        if incident is not None:
            took = now - stop.started_at
            incident.record(now, f"job stopped: {describe_exit(returncode)} after {took:.1f} s")
        if not stop.restart or self._shutdown_signals:
            self._finish(status, JobState.EXITED if status == 0 else JobState.FATAL, incident)
            return
        assert incident is not None
        self._plan_restart(incident, status)

    @property
    def restarts(self) -> int:
        """Restarts made so far."""
        return self._restarts.count

    def _plan_restart(self, incident: Incident, status: int) -> None:
        decision = self._restarts.decide(incident)
        for note in decision.notes:
            incident.record(time.time(), note)
        if decision.give_up is not None:
            self._give_up(incident, decision.give_up)
            return
        if decision.resume is None:
            self._finish(status, JobState.FATAL, incident)
            return
        self.watch.update(incident, final=True)
        self._set_state(JobState.BACKOFF)
        self._restart_at = time.monotonic() + decision.backoff_s

    def _give_up(self, incident: Incident, text: str) -> None:
        """The final word on a failure: say why, everywhere, and exit 90."""
        self._escalate(incident, text)
        self._finish(EXIT_GIVE_UP, JobState.FATAL, incident)

    def _escalate(self, incident: Incident, text: str) -> None:
        log.error("%s", text)
        incident.record(time.time(), text)
        self._handle(
            [
                Alert(
                    rule=incident.rule,
                    severity=Severity.CRITICAL,
                    message=text,
                    time=time.time(),
                    source="sentinel",
                    step=incident.first.step,
                    details={"escalation": True},
                )
            ]
        )
        self.watch.update(incident, final=True, force_notify=True)

    def _finish(self, status: int, state: JobState, incident: Incident | None = None) -> None:
        if incident is not None:
            self.watch.update(incident, final=True)
        self.exit_code = status
        self._set_state(state)
        self._finished = True

    def _on_signal(self, signum: int) -> None:
        self._shutdown_signals += 1
        name = signal.Signals(signum).name
        job = self._job
        if self._shutdown_signals >= 2 or job is None or job.identity is None:
            log.warning("%s again: stopping now", name)
            if job is not None and job.identity is not None and job.identity.matches():
                os.killpg(job.identity.pid, signal.SIGKILL)
            self._finish(exit_status(-signum), JobState.EXITED)
            return
        log.warning("%s received: stopping the job (again to force)", name)
        if self._stop is None:
            self._stop = _Stop(None, restart=False)
            self._terminate(job)

    # -- attempts ---------------------------------------------------------------

    def _start_attempt(self) -> None:
        self._attempt += 1
        attempt = self._attempt
        env = dict(os.environ)
        if self.settings.job.unbuffered:
            env.setdefault("PYTHONUNBUFFERED", "1")
        argv, restart_env = self._restarts.argv_and_env(self.command)
        env.update(restart_env)
        job = JobProcess(
            argv,
            env=env,
            on_lines=lambda source, lines, at: self._events.put(("lines", (source, lines, at))),
            on_exit=lambda code: self._events.put(("exit", (attempt, code))),
            stdout=self.stdout,
            stderr=self.stderr,
            max_line_bytes=self.settings.tail.max_line_bytes,
            batch_s=self.settings.tail.batch_s,
        )
        try:
            job.start()
        except OSError as error:
            log.error("cannot start the job %s: %s", shlex.join(argv), error)
            self._finish(127, JobState.FATAL)
            return
        self._job = job
        self._system.set_job(job.identity)
        resumed_at = self._restarts.resume.step if self.restarts else None
        self.watch.job_started(job.started_at, resumed_at or 0)
        self._set_state(JobState.STARTING)
        log.info("job started (attempt %d, pid %d): %s", attempt, job.pid, shlex.join(argv))

    def _set_state(self, state: JobState) -> None:
        if state is not self.state:
            log.info("job state %s -> %s", self.state, state)
            self.state = state
        store, job = self._store, self._job
        if store is not None:  # for `sentinel status`
            store.put_many(
                {
                    "job.state": str(self.state),
                    "job.pid": str(job.pid) if job is not None else "",
                    "job.restarts": str(self.restarts),
                    "job.updated_at": repr(time.time()),
                }
            )

    def _job_name(self) -> str:
        if self.settings.job.name:
            return self.settings.job.name
        for arg in self.command:
            base = Path(arg).name
            if not base.startswith("python") and not base.startswith("-"):
                return base
        return Path(self.command[0]).name

    # -- signals -----------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        """SIGINT and SIGTERM reach the loop through a reentrant queue and one forwarder.

        The handler runs on the main thread between two bytecodes, possibly inside the
        inbox's lock: it may only use ``SimpleQueue.put``, documented safe there. The
        forwarder thread, started once, hands each signal on to the inbox.
        """
        if threading.current_thread() is not threading.main_thread():
            return {}
        signals: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._signals = signals

        def forward() -> None:
            while (signum := signals.get()) is not None:
                self._events.put(("signal", signum))

        threading.Thread(target=forward, name="signals", daemon=True).start()

        def handler(signum: int, _frame: object) -> None:
            signals.put(signum)

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _restore_signal_handlers(self, previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if self._signals is not None:
            self._signals.put(None)  # ends the forwarder
