"""What every live mode shares: engine, incidents, journal, reports, notifications.

``Watch`` turns alerts into incidents and their records and messages, and
tells its owner which incidents call for action. It decides nothing about
the job itself: that is the supervisor's part.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from dataclasses import replace
from pathlib import Path

from sentinel.actions.notify import Message, Notifier
from sentinel.actions.report import Journal, clock, write_report
from sentinel.config import Settings
from sentinel.cost import incident_cost
from sentinel.diagnosis import diagnose
from sentinel.engine import Engine, build_detectors
from sentinel.facts import RunFacts
from sentinel.incidents import Incident, IncidentEvent, IncidentTracker
from sentinel.parsers import LineParser
from sentinel.records import Alert, Sample, Severity
from sentinel.state import StateStore

log = logging.getLogger(__name__)


def new_run_id() -> str:
    """A sortable id, unique across restarts of sentinel (idempotency keys build on it)."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Watch:
    """Alerts in; journal lines, reports, messages and actionable incidents out."""

    def __init__(
        self, settings: Settings, *, store: StateStore, notifier: Notifier, job_name: str
    ) -> None:
        self.settings = settings
        self.notifier = notifier
        self.job_name = job_name
        self.host = socket.gethostname()
        self.run_id = new_run_id()
        store.put("last_run_id", self.run_id)
        self.engine = Engine(
            build_detectors(settings),
            LineParser(regexes=settings.parsers.regexes),
            logging_steps=settings.parsers.logging_steps,
        )
        self.engine.facts = RunFacts.from_config(settings.training, settings.cost)
        self.tracker = IncidentTracker(self.run_id)
        if settings.cost.price_per_gpu_hour is None:
            budget = getattr(settings.rule("cost_overrun"), "budget", None)
            if budget is not None:
                log.warning(
                    "[rules.cost_overrun] budget is %g but [cost] price_per_gpu_hour is unset:"
                    " no money is counted",
                    budget,
                )
        self.journal = Journal(settings.state_dir)
        self.state_dir: Path = settings.state_dir
        self._notified: set[str] = set()

    def handle(self, alerts: list[Alert]) -> list[Incident]:
        """Record and announce alerts; the critical incidents that just opened or escalated."""
        actionable = []
        for alert in alerts:
            change = self.tracker.observe(alert)
            if not alert.resolves and alert.rule in self.tracker.open:
                explain(self.tracker.open[alert.rule], alert, self.engine)
            self.journal.append(alert)
            log.log(
                _LEVELS[alert.severity],
                "%s %s step=%s: %s",
                alert.severity.upper(),
                alert.rule,
                alert.step,
                alert.message,
            )
            if change is None:
                # An alert may ask for an action of its own on an incident already critical
                # (cost_overrun's kill_at: stop the job).
                if alert.details.get("on_critical") and alert.rule in self.tracker.open:
                    actionable.append(self.tracker.open[alert.rule])
                continue
            event, incident = change
            self._announce(event, incident, alert)
            if event is not IncidentEvent.RESOLVED and incident.severity is Severity.CRITICAL:
                actionable.append(incident)  # the caller acts, then writes the report (update)
        return actionable

    def update(
        self, incident: Incident, *, final: bool = False, force_notify: bool = False
    ) -> None:
        """Rewrite the incident's report; when ``final``, tell people what sentinel did."""
        self._report(incident, time.time())
        if final and incident.actions and (incident.id in self._notified or force_notify):
            body = "\n".join(f"{clock(at)} {text}" for at, text in incident.actions)
            first = incident.first
            # The webhook's JSON says what was done, in the alert schema.
            summary = replace(
                first,
                message="; ".join(text for _, text in incident.actions),
                time=incident.actions[-1][0],
                source="sentinel",
            )
            self._send(incident, summary, "actions", "ACTIONS", body)

    def job_started(self, now: float, start_step: int = 0) -> None:
        """A new attempt (resuming at ``start_step``): the previous attempt's episodes are over."""
        for incident in self.tracker.close_all(now):
            if incident.severity is Severity.CRITICAL:
                self._report(incident, now)
        self.engine.job_started(now, start_step)

    def close(self) -> None:
        stats = self.engine.parser.stats
        log.info(
            "parsed %d lines: %d with metrics, %d garbled (skipped), %d plain text",
            stats.lines,
            stats.parsed,
            stats.garbled,
            stats.unparsed,
        )
        self.journal.close()

    def _report(self, incident: Incident, now: float) -> None:
        cost = incident_cost(incident, self.engine.facts, now)
        write_report(incident, self._recent(incident), self.state_dir, cost=cost)

    def _recent(self, incident: Incident) -> dict[str, list[Sample]]:
        return dict(self.engine.recent(incident.onset_step))

    def _announce(self, event: IncidentEvent, incident: Incident, alert: Alert) -> None:
        if event is IncidentEvent.RESOLVED:
            if incident.id in self._notified:
                self._send(incident, alert, "resolved", "RESOLVED", alert.message)
            return
        if incident.severity < self.settings.notify.min_severity:
            return
        self._notified.add(incident.id)
        body = alert.message
        if incident.diagnosis is not None:
            body += "\n" + incident.diagnosis.text()
        self._send(incident, alert, str(event), alert.severity.upper(), body)

    def _send(self, incident: Incident, alert: Alert, event: str, label: str, body: str) -> None:
        step = f" step={alert.step}" if alert.step is not None else ""
        title = f"[sentinel] {label} {incident.rule} job={self.job_name}{step}"
        text = f"{body}\n\njob: {self.job_name} on {self.host}\nincident: {incident.id}"
        severity = Severity.INFO if event == "resolved" else incident.severity
        self.notifier.notify(
            Message(
                title=title,
                body=text,
                severity=severity,
                alert=alert.to_json(),
                key=f"{incident.id}:{event}:{len(incident.alerts)}",
            )
        )


def explain(incident: Incident, alert: Alert, engine: Engine) -> None:
    """Diagnose an incident anew with the alert just folded in; the alert carries it."""
    incident.diagnosis = diagnose(
        incident, engine.recent(None), samples_per_step=engine.facts.samples_per_step
    )
    alert.details["diagnosis"] = incident.diagnosis.to_json()


_LEVELS = {
    Severity.INFO: logging.INFO,
    Severity.WARNING: logging.WARNING,
    Severity.CRITICAL: logging.ERROR,
}
