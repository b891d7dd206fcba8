"""Incidents: alerts grouped into episodes that open once, escalate, and resolve.

A detector may repeat itself; people must not be woken twice for one
episode. The tracker turns the alert stream into a few events: an incident
opened, escalated to a worse severity, or resolved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sentinel.records import Alert, Severity


class IncidentEvent(StrEnum):
    OPENED = "opened"
    ESCALATED = "escalated"
    RESOLVED = "resolved"


@dataclass
class Incident:
    """One episode of one rule, with everything that happened in it."""

    id: str
    rule: str
    severity: Severity
    opened_at: float
    onset_step: int | None
    onset_time: float
    alerts: list[Alert] = field(default_factory=list)
    #: What sentinel did, in order: (time, text).
    actions: list[tuple[float, str]] = field(default_factory=list)
    resolved_at: float | None = None

    @property
    def first(self) -> Alert:
        return self.alerts[0]

    @property
    def worst(self) -> Alert:
        return max(self.alerts, key=lambda alert: alert.severity.rank)

    def record(self, time: float, text: str) -> None:
        self.actions.append((time, text))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "severity": str(self.severity),
            "opened_at": self.opened_at,
            "resolved_at": self.resolved_at,
            "onset_step": self.onset_step,
            "onset_time": self.onset_time,
            "alerts": [alert.to_json() for alert in self.alerts],
            "actions": [{"time": time, "text": text} for time, text in self.actions],
        }


class IncidentTracker:
    """Groups alerts by rule into open incidents."""

    def __init__(self, id_prefix: str) -> None:
        self.id_prefix = id_prefix
        self.open: dict[str, Incident] = {}
        self.closed: list[Incident] = []
        self._count = 0

    def observe(self, alert: Alert) -> tuple[IncidentEvent, Incident] | None:
        """Fold one alert in; the event it causes, or None when it changes nothing."""
        incident = self.open.get(alert.rule)
        if alert.resolves:
            if incident is None:
                return None
            incident.alerts.append(alert)
            return IncidentEvent.RESOLVED, self._close(incident, alert.time)
        if incident is None:
            self._count += 1
            incident = Incident(
                id=f"{self.id_prefix}-{self._count}",
                rule=alert.rule,
                severity=alert.severity,
                opened_at=alert.time,
                onset_step=alert.onset_step if alert.onset_step is not None else alert.step,
                onset_time=alert.time,
                alerts=[alert],
            )
            self.open[alert.rule] = incident
            return IncidentEvent.OPENED, incident
        incident.alerts.append(alert)
        if alert.severity > incident.severity:
            incident.severity = alert.severity
            return IncidentEvent.ESCALATED, incident
        return None

    def close_all(self, now: float) -> list[Incident]:
        """End every open episode (the job attempt they belong to is over)."""
        return [self._close(incident, now) for incident in list(self.open.values())]

    def _close(self, incident: Incident, now: float) -> Incident:
        incident.resolved_at = now
        del self.open[incident.rule]
        self.closed.append(incident)
        return incident
