"""What follows a stop: the restart decision, the verdict, and giving up.

Once sentinel has stopped the job for a critical incident and the job is gone, the
``Aftermath`` decides what comes next: a node fault (92: retry elsewhere), a rollback
and restart (91), or giving up (90); and it writes the verdict, this node's, or the
run's when several nodes' sentinels share one (``run_verdict``: the first node to
decide wins; the others take its verdict, stop their ranks and say nothing more).

It owns the restart budget (``Restarts``) and the run's shared verdict; the attempt
itself (its state, when the next one starts) stays its owner's, the supervisor, which
it asks through the ``Attempts`` protocol.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Severity
from sentinel.rules import DETECTORS
from sentinel.service.health import Service
from sentinel.service.watch import Watch
from sentinel.store import run_verdict, verdict
from sentinel.store.state import StateStore
from sentinel.supervisor.job_state import JobState
from sentinel.supervisor.restarts import Restarts

log = logging.getLogger(__name__)


class Attempts(Protocol):
    """What the aftermath asks of the owner of the job's attempts."""

    @property
    def attempt(self) -> int:
        """The current attempt's number (1 for the first)."""
        ...

    def attempt_over(self, status: int, state: JobState, incident: Incident | None) -> None:
        """``run`` ends with its job; ``watch`` waits for the next attempt."""
        ...

    def back_off(self, delay_s: float) -> None:
        """``run``: relaunch the job in ``delay_s`` seconds."""
        ...

    def wait_for_next(self) -> None:
        """``watch``: look for the next attempt, which someone else starts."""
        ...

    def gave_up(self) -> None:
        """The run is over for good: sentinel exits 90."""
        ...

    def handle(self, alerts: list[Alert]) -> None:
        """Handle alerts sentinel raises itself, as any rule's."""
        ...


class Aftermath:
    """Decides and announces what follows a stop (see the module's docstring)."""

    def __init__(
        self,
        owner: Attempts,
        restarts: Restarts,
        run: run_verdict.RunVerdict | None,
        *,
        watch: Watch,
        service: Service,
        relaunches: bool,
    ) -> None:
        self.owner = owner
        self.restarts = restarts
        #: The run's verdict shared with the other nodes' sentinels (None: this node alone).
        self.run = run
        self.watch = watch
        self.service = service
        self.relaunches = relaunches
        self.store: StateStore | None = None

    def plan_restart(self, incident: Incident, status: int) -> None:
        """The job was stopped for ``incident`` and exited with ``status``: what now."""
        rule = DETECTORS.get(incident.rule)
        if rule is not None and rule.node_fault:  # the node, not the run: retry elsewhere
            self.verdict(verdict.EXIT_NODE_FAULT, incident)
            self.escalate(incident, "hardware fault: not restarting here (verdict 92)")
            self.owner.attempt_over(verdict.EXIT_NODE_FAULT, JobState.FATAL, incident)
            return
        decided = self.run.peek() if self.run is not None else None
        if decided is not None:  # another node rolled back and decided: no second rollback
            self.joined(decided, incident)
            return
        decision = self.restarts.decide(incident)
        self.save_restarts()
        for note in decision.notes:
            incident.record(time.time(), note)
        if decision.give_up is not None:
            self.give_up(incident, decision.give_up)
            return
        if decision.resume is None:
            # max_restarts 0: the run is over here, and whoever waits on the verdict must
            # not relaunch it (sentinel marked "deciding" before its signal).
            self.verdict(verdict.EXIT_GIVE_UP, incident)
            self.owner.attempt_over(status, JobState.FATAL, incident)
            return
        self.service.metrics.restarted()
        self.verdict(verdict.EXIT_ROLLED_BACK, incident, decision.resume.checkpoint or None)
        self.watch.update(incident, final=True)
        if not self.relaunches:
            self.owner.wait_for_next()
            return
        self.owner.back_off(decision.backoff_s)

    def give_up(self, incident: Incident, text: str) -> None:
        """The final word on a failure: say why, everywhere, and exit 90 (``watch``: the
        verdict says 90, and it waits on for an attempt nobody should start)."""
        self.verdict(verdict.EXIT_GIVE_UP, incident)  # first: another node may have spoken
        self.escalate(incident, text)
        self.owner.attempt_over(verdict.EXIT_GIVE_UP, JobState.FATAL, incident)
        self.owner.gave_up()

    def verdict(self, code: int, incident: Incident, resume_from: str | None = None) -> None:
        """The final verdict, once the job is gone and the rollback done or failed; with
        other nodes, the run's, if this node decided first (else theirs, and quiet)."""
        if self.run is not None:
            try:
                record, won = self.run.claim(
                    code, rule=incident.rule, step=incident.first.step, resume_from=resume_from
                )
            except OSError as error:
                log.error("could not write the run's verdict (deciding alone): %s", error)
            else:
                if not won:
                    self.joined(record, incident, over=False)
                    return
        if not self.restarts.write_verdict(code, incident, self.owner.attempt, resume_from):
            self.service.metrics.action("verdict", ok=False)

    def decided_elsewhere(self) -> run_verdict.RunRecord | None:
        """Another node's verdict for the run, if one has decided it."""
        return self.run.peek() if self.run is not None else None

    def joined(
        self, record: run_verdict.RunRecord, incident: Incident | None = None, *, over: bool = True
    ) -> None:
        """Take the run's verdict as this node's (its code, its record); another node paged,
        so this one says nothing more of ``incident``. ``over``: this attempt ends here."""
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
            attempt=self.owner.attempt,
            verdict_file=settings.verdict_file,
        ):
            self.service.metrics.action("verdict", ok=False)
        if record.code == verdict.EXIT_GIVE_UP:
            self.owner.gave_up()
        if over:
            self.owner.attempt_over(record.code, JobState.FATAL, incident)

    def save_restarts(self) -> None:
        """``watch``: the restart budget outlives sentinel (and its pod)."""
        if not self.relaunches and self.store is not None:
            self.watch.safely("the restart budget", self.store.put_many, self.restarts.to_state())

    def escalate(self, incident: Incident, text: str) -> None:
        """A critical that says what sentinel could not do, to every target its route picks."""
        log.error("%s", text)
        incident.record(time.time(), text)
        alert = Alert(
            rule=incident.rule,
            severity=Severity.CRITICAL,
            message=text,
            time=time.time(),
            source="sentinel",
            step=incident.first.step,
            details={"escalation": True},
        )
        self.owner.handle([alert])
        self.watch.update(incident, final=True, force_notify=True)
