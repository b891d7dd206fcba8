"""What follows a stop: the restart decision, the verdict, and giving up.

Once sentinel has stopped the job for a critical incident and the job is gone, the
``Aftermath`` decides what comes next: a node fault (92: retry elsewhere), a rollback
and restart (91), or giving up (90); and it writes the verdict, this node's, or the
run's when several nodes' sentinels share one (``run_verdict``: the first node to
decide wins; the others take its verdict, stop their ranks and say nothing more).

It owns the restart budget (``Restarts``) and the run's shared verdict. It changes no
phase of the job's life: it returns an ``Outcome`` (the attempt ends, or a restart follows;
what to escalate) that the machine (``machine``) carries out.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sentinel.model.incidents import Incident
from sentinel.model.records import SENTINEL_SOURCE, Alert, Severity
from sentinel.rules import DETECTORS
from sentinel.service.health import Service
from sentinel.service.watch import Watch
from sentinel.store import run_verdict, verdict
from sentinel.store.state import StateStore
from sentinel.supervisor.restarts import Restarts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What follows a stop, as the aftermath decided it; the machine carries it out."""

    #: The attempt's exit status as sentinel reports it (``run`` exits with it).
    status: int
    #: A restart follows: ``run`` relaunches the job after this long, ``watch`` waits for
    #: the attempt whoever started the job starts. None: the attempt ends for good (FATAL).
    restart_in_s: float | None = None
    #: What sentinel could not do, said as a critical to every target (``escalation``)
    #: before the attempt ends.
    escalation: str | None = None
    #: The run is over for good: sentinel exits 90 (unless the attempt's end says otherwise).
    gave_up: bool = False


class Aftermath:
    """Decides and announces what follows a stop (see the module's docstring)."""

    def __init__(
        self,
        restarts: Restarts,
        run: run_verdict.RunVerdict | None,
        *,
        watch: Watch,
        service: Service,
        relaunches: bool,
        store: StateStore,
    ) -> None:
        self.restarts = restarts
        #: The run's verdict shared with the other nodes' sentinels (None: this node alone).
        self.run = run
        self.watch = watch
        self.service = service
        self.relaunches = relaunches
        self.store = store

    def after_stop(self, incident: Incident, status: int, attempt: int) -> Outcome:
        """The job was stopped for ``incident`` and exited with ``status``: roll back, write
        the verdict, and say what follows."""
        rule = DETECTORS.get(incident.rule)
        if rule is not None and rule.node_fault:  # the node, not the run: retry elsewhere
            gave_up = self.verdict(verdict.EXIT_NODE_FAULT, incident, attempt)
            return Outcome(
                verdict.EXIT_NODE_FAULT,
                escalation="hardware fault: not restarting here (verdict 92)",
                gave_up=gave_up,
            )
        decided = self.decided_elsewhere()
        if decided is not None:  # another node rolled back and decided: no second rollback
            return self.joined(decided, attempt, incident)
        step = incident.first.step
        first_logged = step is not None and not self.watch.engine.logged_before(step)
        decision = self.restarts.decide(incident, first_logged=first_logged)
        self.save_restarts()
        for note in decision.notes:
            incident.record(time.time(), note)
        if decision.give_up is not None:
            return self.give_up(incident, decision.give_up, attempt)
        if decision.resume is None:
            # max_restarts 0: the run is over here, and whoever waits on the verdict must
            # not relaunch it (sentinel marked "deciding" before its signal).
            return Outcome(status, gave_up=self.verdict(verdict.EXIT_GIVE_UP, incident, attempt))
        self.service.metrics.restarted()
        gave_up = self.verdict(
            verdict.EXIT_ROLLED_BACK, incident, attempt, decision.resume.checkpoint or None
        )
        self.watch.update(incident, final=True)
        return Outcome(status, restart_in_s=decision.backoff_s, gave_up=gave_up)

    def give_up(self, incident: Incident, text: str, attempt: int) -> Outcome:
        """The final word on a failure: the verdict 90, and ``text`` said everywhere (``watch``:
        the verdict says 90, and it waits on for an attempt nobody should start)."""
        self.verdict(verdict.EXIT_GIVE_UP, incident, attempt)  # first: another node may have spoken
        return Outcome(verdict.EXIT_GIVE_UP, escalation=text, gave_up=True)

    def verdict(
        self, code: int, incident: Incident, attempt: int, resume_from: str | None = None
    ) -> bool:
        """The final verdict, once the job is gone and the rollback done or failed; with
        other nodes, the run's, if this node decided first (else theirs, and quiet). True
        when the run's verdict, another node's, gives up (90)."""
        if self.run is not None:
            try:
                record, won = self.run.claim(
                    code, rule=incident.rule, step=incident.first.step, resume_from=resume_from
                )
            except OSError as error:
                log.error("could not write the run's verdict (deciding alone): %s", error)
            else:
                if not won:
                    return self.joined(record, attempt, incident).gave_up
        if not self.restarts.write_verdict(code, incident, attempt, resume_from):
            self.service.metrics.action("verdict", ok=False)
        return False

    def decided_elsewhere(self) -> run_verdict.RunRecord | None:
        """Another node's verdict for the run, if one has decided it."""
        return self.run.peek() if self.run is not None else None

    def joined(
        self, record: run_verdict.RunRecord, attempt: int, incident: Incident | None = None
    ) -> Outcome:
        """Take the run's verdict as this node's (its code, its record); another node paged,
        so this one says nothing more of ``incident``. The attempt ends with its code."""
        assert self.run is not None
        if record.number == self.run.number:
            self.run.adopted()
        log.warning("verdict %d for the run, from node %s", record.code, record.node)
        if incident is not None:
            self.watch.quiet(incident)
            incident.record(time.time(), f"verdict {record.code} from node {record.node}")
        settings = self.watch.settings
        if not run_verdict.write_adopted(
            record,
            settings.state_dir,
            attempt=attempt,
            verdict_file=settings.verdict_file,
        ):
            self.service.metrics.action("verdict", ok=False)
        return Outcome(record.code, gave_up=record.code == verdict.EXIT_GIVE_UP)

    def save_restarts(self) -> None:
        """``watch``: the restart budget outlives sentinel (and its pod)."""
        if not self.relaunches:
            self.watch.safely("the restart budget", self.store.put_many, self.restarts.to_state())


def escalation(incident: Incident, text: str) -> Alert:
    """A critical that says what sentinel could not do, as sentinel's own alert."""
    return Alert(
        rule=incident.rule,
        severity=Severity.CRITICAL,
        message=text,
        time=time.time(),
        source=SENTINEL_SOURCE,
        step=incident.first.step,
        details={"escalation": True},
    )
