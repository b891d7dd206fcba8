"""The job's life as one machine, built around the stop plan.

The phases, and the moves between them (every one of them is in ``LEGAL``)::

    NEW ──► WAITING ──► STARTING ──min_uptime_s──► RUNNING
     │      (watch)        │                          │
     │                     └──── a critical that ─────┤
     │                           stops the job        ▼
     │                                            STOPPING ──the job exited──► SETTLING
     │                                                                          │
     ├── take-up, the job gone ─────────────────────────────────────────────► SETTLING
     ├── take-up, the job still runs: adopted (STARTING), then ─────► STOPPING
     └── take-up, only the restart left ──► BACKOFF ◄── a restart (run) ──── SETTLING
                                               │       WAITING ◄── (watch) ─┤
                              STARTING ◄── due ┘       EXITED | FATAL ◄─────┘
    a job that ends by itself: EXITED | FATAL (watch: WAITING for the next attempt)
    SIGTERM, SIGINT: EXITED (run: a second forces); DETACHED (watch: the job runs on)
    another node's verdict with nothing here to stop: SETTLING, from any live phase

The machine is the only place the phase changes (``_enter``, which refuses a move that
``LEGAL`` does not list); each event has its method: ``begin`` (fresh, or ``take_up`` a
plan a dead sentinel left), ``look_for_job``, ``tick``, ``alerts``, ``run_decided``,
``job_exited``, ``restart_due`` and ``shutdown``. The stop plan (``stop_journal``, kept in
``verdict.json`` by ``store.stop_intent``) follows the phases: entering STOPPING writes
the best-effort "stopping" record before the first signal; SETTLING writes the plan
durably before the first move (``Restarts``), each move in the manifest, and the final
verdict that closes it ("restarting" while a restart is left); a stop no verdict follows
(``on_critical = "stop"``, a shutdown) ends it. A sentinel that starts on an unfinished
plan enters where the plan says (``take_up``), and is ready only once it is done.

The other modules do what the machine decides: ``attempts`` starts or finds each attempt,
``stops`` sends the signals, ``aftermath`` rolls back and writes the verdict and returns
what follows (an ``Outcome``), which the machine carries out.
"""

from __future__ import annotations

import logging
import signal
import time
from enum import StrEnum

from sentinel.config import Settings
from sentinel.model.incidents import Incident
from sentinel.model.records import Alert
from sentinel.process.identity import ProcessIdentity
from sentinel.process.launched import exit_status
from sentinel.process.signal_tree import stop_tree
from sentinel.rules.job_crash import describe_exit
from sentinel.service.health import Service
from sentinel.service.watch import Watch
from sentinel.store import run_verdict, stop_intent, verdict
from sentinel.store.stop_intent import MAX_TRIES, StopIntent
from sentinel.supervisor import stopping
from sentinel.supervisor.aftermath import Aftermath, Outcome, escalation
from sentinel.supervisor.attempts import JobAttempts
from sentinel.supervisor.events import Stop
from sentinel.supervisor.holders import Holder
from sentinel.supervisor.job_state import JobState
from sentinel.supervisor.restarts import Restarts
from sentinel.supervisor.stop_journal import StopJournal
from sentinel.supervisor.stops import JobStops

log = logging.getLogger(__name__)


class Phase(StrEnum):
    """Where the job is in its life, as the machine sees it (see the module's docstring)."""

    #: Nothing started yet: a fresh start, or a plan to take up.
    NEW = "new"
    #: ``watch``: looking for the job (or its next attempt) to appear.
    WAITING = "waiting"
    #: Launched or found, younger than ``min_uptime_s``.
    STARTING = "starting"
    RUNNING = "running"
    #: A stop decided and signalled: the grace, then SIGKILL; the plan says "stopping".
    STOPPING = "stopping"
    #: The stopped job is gone: the rollback planned durably and carried out, the pointers
    #: written, the verdict final; what follows decided. It passes within one event.
    SETTLING = "settling"
    #: ``run``: waiting to relaunch the job from the planned checkpoint.
    BACKOFF = "backoff"
    #: The end: the job finished, or was stopped for good (a shutdown).
    EXITED = "exited"
    #: The end: the job failed, or sentinel gave up on it.
    FATAL = "fatal"
    #: The end of ``watch``: sentinel was asked to stop; the job runs on.
    DETACHED = "detached"


#: The end of the job's life: no phase follows.
FINAL = frozenset({Phase.EXITED, Phase.FATAL, Phase.DETACHED})
#: A shutdown may end every phase that is not final (``run``: EXITED, ``watch``: DETACHED).
_LIVE_ENDS = frozenset({Phase.EXITED, Phase.DETACHED})

#: Every move the machine may make, from each phase.
LEGAL: dict[Phase, frozenset[Phase]] = {
    # A fresh start, or a take-up: where the plan a dead sentinel left says.
    Phase.NEW: frozenset(
        {Phase.STARTING, Phase.WAITING, Phase.FATAL, Phase.SETTLING, Phase.BACKOFF}
    ),
    # Found; or not within ``wait_s`` (FATAL); or another node's verdict ends the attempt.
    Phase.WAITING: frozenset({Phase.STARTING, Phase.FATAL, Phase.SETTLING}) | _LIVE_ENDS,
    # Up for ``min_uptime_s``; stopped; ended by itself (EXITED, FATAL; ``watch``: WAITING for
    # the next); another node's verdict with nothing here to stop (SETTLING).
    Phase.STARTING: frozenset(
        {Phase.RUNNING, Phase.STOPPING, Phase.SETTLING, Phase.FATAL, Phase.WAITING}
    )
    | _LIVE_ENDS,
    Phase.RUNNING: frozenset({Phase.STOPPING, Phase.SETTLING, Phase.FATAL, Phase.WAITING})
    | _LIVE_ENDS,
    # The stopped job exited (SETTLING), or a second signal forced the end.
    Phase.STOPPING: frozenset({Phase.SETTLING}) | _LIVE_ENDS,
    # What follows the stop: a restart (BACKOFF; ``watch``: WAITING), or the end.
    Phase.SETTLING: frozenset({Phase.BACKOFF, Phase.WAITING, Phase.EXITED, Phase.FATAL}),
    # Relaunched; could not be (FATAL); another node's verdict ends the run (SETTLING).
    Phase.BACKOFF: frozenset({Phase.STARTING, Phase.FATAL, Phase.SETTLING}) | _LIVE_ENDS,
    Phase.EXITED: frozenset(),
    Phase.FATAL: frozenset(),
    Phase.DETACHED: frozenset(),
}

#: What ``sentinel status`` and the log say of each phase (Supervisor's process states);
#: None: what they said before stays (SETTLING passes within one event; DETACHED leaves
#: the job as it was).
REPORTED: dict[Phase, JobState | None] = {
    Phase.NEW: JobState.STARTING,
    Phase.WAITING: JobState.WAITING,
    Phase.STARTING: JobState.STARTING,
    Phase.RUNNING: JobState.RUNNING,
    Phase.STOPPING: JobState.STOPPING,
    Phase.SETTLING: None,
    Phase.BACKOFF: JobState.BACKOFF,
    Phase.EXITED: JobState.EXITED,
    Phase.FATAL: JobState.FATAL,
    Phase.DETACHED: None,
}


def entry(intent: StopIntent) -> Phase:
    """Where a sentinel that starts on ``intent``, left unfinished, enters the job's life:
    BACKOFF when only the restart is left (the plan says "restarting"); STOPPING while the
    stopped job still runs (the same pid and start time): the rest of its grace; SETTLING
    once it is gone, to finish the rollback, and to give up after ``MAX_TRIES`` sentinels."""
    if intent.tries >= MAX_TRIES:
        return Phase.SETTLING
    if intent.phase == stop_intent.RESTARTING:
        return Phase.BACKOFF
    stopped = stopped_job(intent)
    if stopped is not None and stopped.running():
        return Phase.STOPPING
    return Phase.SETTLING


def stopped_job(intent: StopIntent) -> ProcessIdentity | None:
    """The job ``intent`` stopped (its pid and start time), where it was known."""
    return None if intent.job is None else ProcessIdentity(*intent.job)


class IllegalTransition(RuntimeError):
    """A move ``LEGAL`` does not list: a bug in the machine, never the job's doing."""


class JobMachine:
    """The job's phase, and the one place it changes (see the module's docstring)."""

    def __init__(
        self,
        settings: Settings,
        holder: Holder,
        *,
        attempts: JobAttempts,
        stops: JobStops,
        after: Aftermath,
        restarts: Restarts,
        journal: StopJournal,
        watch: Watch,
        service: Service,
    ) -> None:
        #: The settings in force (a SIGHUP may replace them).
        self.settings = settings
        self.holder = holder
        self.attempts = attempts
        self.stops = stops
        self.after = after
        self.restarts = restarts
        self.journal = journal
        self.watch = watch
        self.service = service
        self.phase = Phase.NEW
        #: What ``sentinel status`` says of the job (``REPORTED``).
        self.state = JobState.STARTING
        #: What sentinel exits with once the run is over (``finished``).
        self.exit_code = 0
        #: When the next attempt is due (monotonic), in BACKOFF.
        self.restart_at: float | None = None
        #: The stop under way, until the stopped job's exit is handled.
        self.stop: Stop | None = None
        #: SIGTERM and SIGINT received so far (the second forces), and the first of them:
        #: ``run`` then exits as a program killed by it would (130 for Ctrl-C, 143).
        self.shutdown_signals = 0
        self.shutdown_signum: int | None = None
        self._waiting_since: float | None = None
        #: An attempt was found (``watch``): a target that cannot follow a relaunch ends here.
        self._found = False
        #: The job was looked for at least once (a stop taken up comes before the first look).
        self._looked = False
        self._is_ready = False

    # -- the moves ------------------------------------------------------------

    def _enter(self, phase: Phase, *, say: bool = True) -> None:
        """Move to ``phase`` (or stay), refusing a move ``LEGAL`` does not list; ``say``:
        tell ``sentinel status`` (and the log, when what it says changes)."""
        if phase is not self.phase and phase not in LEGAL[self.phase]:
            raise IllegalTransition(f"the job's life cannot go from {self.phase} to {phase}")
        log.debug("phase %s -> %s", self.phase, phase)
        self.phase = phase
        if not say:
            return
        state = REPORTED[phase] or self.state
        if state is not self.state:
            log.info("job state %s -> %s", self.state, state)
            self.state = state
        self.attempts.publish(self.state)

    @property
    def finished(self) -> bool:
        """The run is over (a final phase): sentinel exits with ``exit_code``."""
        return self.phase in FINAL

    def _ready(self) -> None:
        """Ready (sd_notify, ``/readyz``): once no stop of an earlier sentinel is left undone."""
        if not self._is_ready:
            self._is_ready = True
            self.service.ready()

    # -- events ---------------------------------------------------------------

    def begin(self, unfinished: StopIntent | None) -> None:
        """The first move: the first attempt, or the stop a dead sentinel left unfinished."""
        if unfinished is None:
            self._ready()
            self._start()
            return
        self.take_up(unfinished)

    def take_up(self, intent: StopIntent) -> None:
        """Finish the stop the last sentinel on this state dir decided and died during,
        entering where its plan says (``entry``): STOPPING while the stopped job still runs
        (adopted or found first: the rest of its grace, then SIGKILL), SETTLING once it is
        gone (roll back as planned, restart from the planned checkpoint; never from scratch
        while the plan names one), BACKOFF when only the restart is left. Ready once the job
        is stopped and the rollback done; after ``MAX_TRIES`` sentinels, it gives up (90)."""
        incident = intent.the_incident()
        self.watch.taken_up(incident, intent.job)
        if intent.job is not None:
            # The stop's first move, which the dead sentinel made (its record keeps no action).
            incident.record(
                intent.signalled_at,
                f"{intent.signal} to the job's process tree (pid {intent.job[0]}), by the"
                " sentinel that died during the stop",
            )
        first = incident.first.step if incident.alerts else None
        where = entry(intent)
        if intent.tries >= MAX_TRIES:
            self._enter(where, say=False)
            self._carry_out(
                self.after.give_up(
                    incident,
                    f"{intent.tries} sentinels started on the unfinished stop for {incident.rule}"
                    f" (step {first}) and none finished it: giving up; what is where is in"
                    f" {self.settings.state_dir / 'verdict.json'} and the checkpoint dir's"
                    " quarantine",
                    self.attempts.attempt,
                ),
                incident,
            )
            self._ready()
            return
        intent = self.journal.take_up(intent)
        log.warning(
            "the last sentinel died while it stopped the job for %s (step %s, %s): finishing"
            " what it decided (try %d of %d)",
            incident.rule, first, intent.phase, intent.tries, MAX_TRIES,
        )  # fmt: skip
        incident.record(
            time.time(),
            f"the sentinel that decided the stop died during it; another took it up (try"
            f" {intent.tries} of {MAX_TRIES})",
        )
        self.restarts.from_state(intent.restarts)
        attempts = self.attempts
        if where is Phase.BACKOFF:
            # Rolled back, verdict written: only the restart is left.
            self.journal.closing(intent.restarts)
            attempts.attempt = intent.attempt
            self.holder.forget_orphan()
            self._ready()
            self._back_off(0.0)
            return
        stopped = stopped_job(intent)
        if where is Phase.STOPPING and stopped is not None and not self.holder.adopts(stopped):
            # run has no record to adopt it by: started again, the command would run from
            # scratch beside it. Stopped here, by its identity, then the plan as planned.
            self._stop_unheld(intent, stopped)
        elif where is Phase.STOPPING and stopped is not None:
            self._start()  # adopts it (run) or finds it (watch)
            if self.finished:
                return  # it could not be started: the run is over (127)
            if self._resume_stop(incident, intent, stopped):
                return  # the rollback follows its exit (``job_exited``), then ready
            log.warning("the job found is not the one stopped: stopping it by its identity")
        attempts.attempt = max(attempts.attempt, intent.attempt)
        self.holder.forget_orphan()
        status = self.holder.exit_status_of(intent.attempt)
        self._enter(Phase.SETTLING, say=False)
        if not intent.restart:
            self.journal.ended()
            self._ready()
            self._finish(143 if status is None else status, Phase.FATAL, incident)
            return
        self._carry_out(
            self.after.after_stop(incident, 143 if status is None else status, attempts.attempt),
            incident,
        )
        self._ready()

    def look_for_job(self) -> None:
        """``watch``, WAITING: look again (on a tick, or output that says it is back)."""
        if self.phase is Phase.WAITING and not self.finished:
            self._start()

    def restart_due(self) -> None:
        """BACKOFF is over: the next attempt."""
        if self.phase is Phase.BACKOFF:
            self._start()

    def tick(self, now: float) -> None:
        """STARTING becomes RUNNING once the attempt is ``min_uptime_s`` old."""
        if (
            self.phase is Phase.STARTING
            and self.attempts.uptime_s(now) >= self.settings.job.min_uptime_s
        ):
            self._enter(Phase.RUNNING)

    @property
    def judging(self) -> bool:
        """Whether the rules' verdicts on the job count (STARTING, RUNNING): a stop may follow."""
        return self.phase in (Phase.STARTING, Phase.RUNNING)

    def alerts(self, alerts: list[Alert]) -> None:
        """Alerts raised (the rules', sentinel's own): into incidents; a critical one whose
        rule says so stops the job (STOPPING), first: the report and messages can wait."""
        decided_at = time.time()
        for alert in alerts:  # its ``time`` is when its evidence was read
            alert.details.setdefault("decided_at", decided_at)
        self.service.alerted(alerts)
        for incident in self.watch.handle(alerts):
            self._critical(incident)
            self.watch.update(incident)

    def _critical(self, incident: Incident) -> None:
        """A critical incident opened or escalated: stop the job if its rule says so."""
        policy = self.watch.policy(incident)
        if policy == "notify" or self.stop is not None:
            return
        job = self.attempts.job
        if job is None or not self.judging:
            return
        settings = self.settings
        if settings.dry_run:
            text = stopping.dry_run_note(
                settings.job, job.pid, policy, relaunches=self.holder.relaunches
            )
            log.warning("%s", text)
            now = time.time()
            incident.record(now, text)
            self.journal.dry_run(incident, now)
            self.watch.update(incident)
            return
        self.stop = Stop(incident, restart=policy == "restart")
        # Before the first signal, so that whatever waits on the job knows the exit is ours,
        # and a sentinel started after this one dies finishes what it decided.
        self.journal.stopping(
            incident, restart=self.stop.restart, attempt=self.attempts.attempt,
            job=job.identity, signal=settings.job.stop_signal,
            grace_s=settings.job.grace_period_s, restarts=self.restarts.to_state(),
        )  # fmt: skip
        incident.record(time.time(), stopping.stop_words(settings.job, job.pid))
        self.service.metrics.action("stop")
        self._signal()

    def run_decided(self) -> None:
        """Another node decided the run: stop this node's job with its verdict, quietly; with
        nothing here to stop, its verdict is this node's too (SETTLING)."""
        if self.finished or self.stop is not None:
            return
        record = self.after.decided_elsewhere()
        if record is None:
            return
        job = self.attempts.job
        if job is None or job.identity is None or self.settings.dry_run:
            self._join(record)
            return
        log.warning(
            "node %s decided the run (verdict %d: %s at step %s): stopping this node's job",
            record.node, record.code, record.rule, record.step,
        )  # fmt: skip
        self.stop = Stop(None, restart=False, joined=record)
        stopping.mark_deciding(self.settings, record.rule, record.step, self.attempts.attempt)
        self._signal()

    def shutdown(self, signum: int) -> None:
        """SIGTERM or SIGINT: ``run`` stops its job (a second forces), ``watch`` only itself."""
        self.shutdown_signals += 1
        if self.shutdown_signum is None:
            self.shutdown_signum = signum
        name = signal.Signals(signum).name
        if not self.holder.relaunches:
            # A watchdog being stopped never stops the job it watches.
            log.warning("%s received: stopping sentinel, leaving the job alone", name)
            self._finish(0, Phase.DETACHED)
            return
        job = self.attempts.job
        if self.shutdown_signals >= 2 or job is None or job.identity is None:
            log.warning("%s again: stopping now", name)
            self.stops.kill_now(job)
            self._finish(exit_status(-signum), Phase.EXITED)
            return
        log.warning("%s received: stopping the job (again to force)", name)
        if self.stop is None:
            self.stop = Stop(None, restart=False)
            self._signal()

    def job_exited(self, attempt: int, returncode: int | None) -> None:
        """An attempt ended; ``returncode`` None when not knowable (a job started elsewhere).
        One sentinel did not stop ends (or, ``watch``, waits for the next); one it stopped
        is settled (SETTLING)."""
        attempts = self.attempts
        if attempt != attempts.attempt:
            return
        now = time.time()
        stop = self.stop
        held = attempts.job
        relay_failed = held is not None and held.relay_failed
        said = "ended (exit status unknown)" if returncode is None else describe_exit(returncode)
        log.info("job (attempt %d) %s", attempt, said)
        self.alerts(self.watch.engine.job_exited(returncode, now, expected=stop is not None))
        stop = self.stop  # a job_crash incident may have decided on a restart just now
        attempts.ended()
        status = 0 if returncode is None else exit_status(returncode)
        if relay_failed:
            status = 1  # its status is unknown: the relay failed, sentinel's doing (logged)
        if stop is None:
            self._attempt_over(status, Phase.EXITED if status == 0 else Phase.FATAL)
            return
        self.stop = None
        self._enter(Phase.SETTLING, say=False)
        if stop.joined is not None:
            self._carry_out(self.after.joined(stop.joined, attempts.attempt), None)
            return
        incident = stop.incident
        if incident is not None:
            incident.record(now, f"job stopped: {said} after {now - stop.started_at:.1f} s")
        if self.shutdown_signum is not None:
            # Asked to stop (Ctrl-C, SIGTERM): exit as a program that signal ended, whatever
            # the job made of its own stop signal.
            self.journal.ended()
            self._attempt_over(exit_status(-self.shutdown_signum), Phase.EXITED, incident)
            return
        if not stop.restart:
            self.journal.ended()
            self._ready()
            self._attempt_over(status, Phase.EXITED if status == 0 else Phase.FATAL, incident)
            return
        assert incident is not None
        self._carry_out(self.after.after_stop(incident, status, attempts.attempt), incident)
        self._ready()

    # -- what the events lead to ---------------------------------------------------

    def _start(self) -> None:
        """Launch the next attempt (``run``), or look for it (``watch``)."""
        attempts = self.attempts
        self._looked = True
        try:
            job = attempts.begin()
        except OSError as error:
            log.error("cannot start the job %s: %s", self.holder.describe(), error)
            self._finish(127, Phase.FATAL)
            return
        if job is None:
            self._wait()
            return
        self._found = True
        self._waiting_since = None
        self._enter(Phase.STARTING)
        attempts.announce(job)

    def _signal(self) -> None:
        """STOPPING: the stop signal to the job's tree, SIGKILL after the grace (``stops``).
        A job already gone gets none, and STOPPING goes unsaid: its exit is on its way.
        Said after the signal (the status is a write to the state store and a log line)."""
        job = self.attempts.job
        assert job is not None and self.stop is not None
        identity = job.identity
        self._enter(Phase.STOPPING, say=False)
        if identity is not None:
            self.stops.signal(identity, self.stop, self.settings)
            self._enter(Phase.STOPPING)

    def _resume_stop(
        self, incident: Incident, intent: StopIntent, stopped: ProcessIdentity
    ) -> bool:
        """STOPPING again, for a stop a sentinel that died signalled: what is left of its
        grace, then SIGKILL to what still runs (only a process whose pid and start time
        match). False when the job held now is not the one stopped."""
        job = self.attempts.job
        if job is None or job.identity is None or job.identity != stopped:
            return False
        self.stop = Stop(incident, restart=intent.restart, started_at=intent.signalled_at)
        left_s = max(0.0, intent.grace_s - (time.time() - intent.signalled_at))
        log.warning(
            "the job (pid %d) had %s from the sentinel before; the rest of its grace (%.1f s),"
            " then SIGKILL to what still runs",
            stopped.pid, intent.signal, left_s,
        )  # fmt: skip
        incident.record(time.time(), f"stop taken up by a restarted sentinel: {left_s:.1f} s left")
        self._enter(Phase.STOPPING)
        self.stops.resume(stopped, self.stop, self.settings, left_s)
        return True

    def _stop_unheld(self, intent: StopIntent, stopped: ProcessIdentity) -> None:
        """A job a dead sentinel stopped that this one cannot hold: the rest of its grace,
        then SIGKILL to what still runs (pid and start time matched), waited for here."""
        left_s = max(0.0, intent.grace_s - (time.time() - intent.signalled_at))
        log.warning(
            "the job the last sentinel stopped (pid %d) still runs and there is no record to"
            " adopt it by: not starting the command beside it; the rest of its grace (%.1f"
            " s), then SIGKILL",
            stopped.pid, left_s,
        )  # fmt: skip
        result = stop_tree(
            stopped, grace_s=left_s, members=self.holder.members, already_sent=True,
            dry_run=self.settings.dry_run,
        )  # fmt: skip
        log.warning(
            "the job the last sentinel stopped: %s after %.1f s%s",
            "killed" if result.killed else "gone", result.elapsed_s,
            f" ({len(result.survivors)} still running after SIGKILL)" if result.survivors else "",
        )  # fmt: skip

    def _join(self, record: run_verdict.RunRecord) -> None:
        """Nothing here to stop: another node's verdict is this node's too."""
        self._enter(Phase.SETTLING, say=False)
        self._carry_out(self.after.joined(record, self.attempts.attempt), None)

    def _carry_out(self, outcome: Outcome, incident: Incident | None) -> None:
        """SETTLING's end: what the aftermath decided. Escalate what sentinel could not do;
        then a restart (``run``: BACKOFF; ``watch``: WAITING for whoever starts it), or the
        attempt's end."""
        if outcome.escalation is not None and incident is not None:
            self._escalate(incident, outcome.escalation)
        if outcome.gave_up:
            self.exit_code = verdict.EXIT_GIVE_UP
        if outcome.restart_in_s is None:
            self._attempt_over(outcome.status, Phase.FATAL, incident)
        elif self.holder.relaunches:
            self._back_off(outcome.restart_in_s)
        else:
            self._wait()

    def _escalate(self, incident: Incident, text: str) -> None:
        """A critical that says what sentinel could not do, to every target its route picks."""
        log.error("%s", text)
        incident.record(time.time(), text)
        self.alerts([escalation(incident, text)])
        self.watch.update(incident, final=True, force_notify=True)

    def _back_off(self, delay_s: float) -> None:
        """``run``: BACKOFF, relaunching the job in ``delay_s`` seconds."""
        self._enter(Phase.BACKOFF)
        self.restart_at = time.monotonic() + delay_s

    def _wait(self) -> None:
        """``watch``: WAITING, looking for the job on every tick until it appears, or
        ``wait_s`` runs out (FATAL)."""
        if not self.holder.follows_restarts:
            if self._found:
                self._cannot_follow()
            elif not self._looked:
                # A stop a dead sentinel left, finished before the first look: the process
                # named may well run (it was said to be none, and sentinel ended, exit 1).
                if self.phase is not Phase.WAITING:
                    self._enter(Phase.WAITING)
                self._start()
            else:
                # Nothing can bring it later: a process that takes the pid is someone else.
                log.error("%s names no running process: nothing to watch", self.holder.describe())
                self._finish(1, Phase.FATAL)
            return
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
            log.info("waiting for %s", self.holder.describe())
            self._enter(Phase.WAITING)
            return
        if self.phase is not Phase.WAITING:
            self._enter(Phase.WAITING)
        wait_s = self.settings.watch.wait_s
        if wait_s is not None and now - self._waiting_since > wait_s:
            log.error("%s did not appear within %g s", self.holder.describe(), wait_s)
            self._finish(1, Phase.FATAL)

    def _cannot_follow(self) -> None:
        """``watch --pid``: the one process it names is gone, and a relaunch is another
        process. Waiting for it would never end, and a relaunch would go unwatched in
        silence (a second NaN resumed from, its poisoned saves kept): it ends, saying so."""
        # The wrapper may have taken the 91 already (``verdict --wait`` sets it aside).
        state_dir = self.settings.state_dir
        record = verdict.read(state_dir) or verdict.consumed(state_dir)
        relaunch = (
            "a relaunch is a new process, which a bare --pid cannot follow: watch it with"
            " `sentinel watch --pid NEW`, or start sentinel with --pidfile, --match or"
            " --systemd-unit, which find each relaunch"
        )
        code = record.code if record is not None and record.final else None
        status = self.exit_code
        if record is not None and code == verdict.EXIT_ROLLED_BACK:
            log.warning(
                "%s has ended, rolled back: whoever started it relaunches it (it resumes from"
                " %s); %s. sentinel stops watching",
                self.holder.describe(), record.resume_from or "the clean checkpoint", relaunch,
            )  # fmt: skip
        elif code in (verdict.EXIT_GIVE_UP, verdict.EXIT_NODE_FAULT):
            # The verdict's code is the watch's: a give-up with no restart left to refuse
            # (``max_restarts`` 0) exited 0 beside a verdict of 90.
            status = status or code
            log.info(
                "%s has ended; the verdict is %d: nothing should relaunch it here. sentinel"
                " stops watching",
                self.holder.describe(), code,
            )  # fmt: skip
        else:
            log.info("%s has ended; %s. sentinel stops watching", self.holder.describe(), relaunch)
        self._finish(status, Phase.FATAL if status else Phase.EXITED)

    def _attempt_over(self, status: int, end: Phase, incident: Incident | None = None) -> None:
        """``run`` ends with its job (``end``); ``watch`` waits for the next attempt."""
        if self.holder.relaunches:
            self._finish(status, end, incident)
            return
        if incident is not None:
            self.watch.update(incident, final=True)
        self.attempts.next_is_fresh()
        self._wait()

    def _finish(self, status: int, end: Phase, incident: Incident | None = None) -> None:
        """The run is over (``end``): sentinel exits with ``status``."""
        if incident is not None:
            self.watch.update(incident, final=True)
        self.exit_code = status
        self._enter(end)
