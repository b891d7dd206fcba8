"""Incidents: alerts grouped into episodes that open once, escalate, and resolve.

A detector may repeat itself; people must not be woken twice for one
episode. The tracker turns the alert stream into a few events: an incident
opened, escalated to a worse severity, or resolved.

Rules that tell one story share an incident: a grad-norm run, then a loss
spike, then a NaN are one divergence with one timeline, not three pages. The
tracker is told each rule's story (``stories``: the rules say theirs, in
``sentinel.rules.STORIES``); an alert of a rule with a story joins the open
incident of another rule of that story; the incident's onset is the earliest
evidence of any of them (where a rollback must go back before), and it
resolves when every rule in it has resolved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sentinel.model.records import SENTINEL_SOURCE, Alert, Severity


class IncidentEvent(StrEnum):
    OPENED = "opened"
    ESCALATED = "escalated"
    RESOLVED = "resolved"


@dataclass
class Incident:
    """One episode (of one rule, or of rules of one group), with everything that happened in it.

    ``rule`` is the rule of its worst alert: the one whose ``on_critical`` decides
    what sentinel does.
    """

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
    #: Rules with an open episode in this incident.
    open_rules: set[str] = field(default_factory=set)
    #: What the evidence suggests (``sentinel.evidence.diagnosis.Diagnosis``), set by the owner.
    diagnosis: Any = None
    #: Taken back from a sentinel that restarted, and not raised again since: its rule's
    #: state did not survive, so it is not announced again until its rule speaks.
    restored: bool = False

    @property
    def first(self) -> Alert:
        return self.alerts[0]

    @property
    def rules(self) -> list[str]:
        """Every rule that raised an alert in this incident, in order of first alert."""
        return list(dict.fromkeys(alert.rule for alert in self.alerts))

    @property
    def worst(self) -> Alert:
        return max(self.alerts, key=lambda alert: alert.severity.rank)

    @property
    def rank(self) -> int | None:
        """The distributed rank whose series raised it (its first alert that names one);
        None when no alert does (a single-rank job, a job-wide rule)."""
        for alert in self.alerts:
            rank = alert.details.get("rank")
            if rank is not None:
                return int(rank)
        return None

    def record(self, time: float, text: str) -> None:
        self.actions.append((time, text))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rule": self.rule,
            "rules": self.rules,
            "severity": str(self.severity),
            "opened_at": self.opened_at,
            "resolved_at": self.resolved_at,
            "onset_step": self.onset_step,
            "onset_time": self.onset_time,
            "rank": self.rank,
            "alerts": [alert.to_json() for alert in self.alerts],
            "actions": [{"time": time, "text": text} for time, text in self.actions],
            "diagnosis": None if self.diagnosis is None else self.diagnosis.to_json(),
        }


#: Alerts an incident keeps in the state dir's memory: the first, then the newest.
MEMORY_ALERTS = 20


def alert_memory(alert: Alert) -> dict[str, Any]:
    """Every field of ``alert``, as JSON (the public schema leaves some out)."""
    return {
        "rule": alert.rule,
        "severity": str(alert.severity),
        "message": alert.message,
        "time": alert.time,
        "source": alert.source,
        "step": alert.step,
        "metric": alert.metric,
        "value": alert.value,
        "onset_step": alert.onset_step,
        "resolves": alert.resolves,
        "details": alert.details,
    }


def alert_from_memory(data: dict[str, Any]) -> Alert:
    return Alert(**{**data, "severity": Severity(data["severity"])})


def incident_memory(incident: Incident) -> dict[str, Any]:
    alerts = incident.alerts
    kept = alerts if len(alerts) <= MEMORY_ALERTS else alerts[:1] + alerts[1 - MEMORY_ALERTS :]
    return {
        "id": incident.id,
        "rule": incident.rule,
        "severity": str(incident.severity),
        "opened_at": incident.opened_at,
        "onset_step": incident.onset_step,
        "onset_time": incident.onset_time,
        "alerts": [alert_memory(alert) for alert in kept],
        "actions": incident.actions,
        "open_rules": sorted(incident.open_rules),
    }


def incident_from_memory(data: dict[str, Any]) -> Incident:
    return Incident(
        id=str(data["id"]),
        rule=str(data["rule"]),
        severity=Severity(data["severity"]),
        opened_at=float(data["opened_at"]),
        onset_step=data["onset_step"],
        onset_time=float(data["onset_time"]),
        alerts=[alert_from_memory(alert) for alert in data["alerts"]],
        actions=[(float(time), str(text)) for time, text in data["actions"]],
        open_rules=set(data["open_rules"]),
        restored=True,
    )


class IncidentTracker:
    """Groups alerts by rule into open incidents."""

    def __init__(self, id_prefix: str, stories: Mapping[str, str] | None = None) -> None:
        self.id_prefix = id_prefix
        #: Rule -> its story: the episodes of one story's rules share an incident.
        self.stories: Mapping[str, str] = stories or {}
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
            incident.open_rules.discard(alert.rule)
            del self.open[alert.rule]
            if incident.open_rules:
                return None  # another rule of the story is still going
            return IncidentEvent.RESOLVED, self._close(incident, alert.time)
        onset = alert.onset_step if alert.onset_step is not None else alert.step
        if incident is None:
            incident = self._peer(alert.rule)
            if incident is not None:
                self.open[alert.rule] = incident
                incident.open_rules.add(alert.rule)
                earlier = incident.onset_step is None or (onset or 0) < incident.onset_step
                if onset is not None and earlier:
                    incident.onset_step = onset
                incident.onset_time = min(
                    incident.onset_time, alert.details.get("onset_time", alert.time)
                )
        if incident is None:
            self._count += 1
            incident = Incident(
                id=f"{self.id_prefix}-{self._count}",
                rule=alert.rule,
                severity=alert.severity,
                opened_at=alert.time,
                onset_step=onset,
                # A rule that knows when its evidence began says so (stall: the last progress).
                onset_time=alert.details.get("onset_time", alert.time),
                alerts=[alert],
                open_rules={alert.rule},
            )
            self.open[alert.rule] = incident
            return IncidentEvent.OPENED, incident
        incident.alerts.append(alert)
        incident.restored = False
        if alert.severity > incident.severity:
            incident.severity = alert.severity
            incident.rule = alert.rule
            return IncidentEvent.ESCALATED, incident
        return None

    def memory(self) -> list[dict[str, Any]]:
        """The open incidents, as JSON, for the state dir (``remember`` takes them back)."""
        unique = {id(incident): incident for incident in self.open.values()}
        return [incident_memory(incident) for incident in unique.values()]

    def remember(self, memory: list[dict[str, Any]]) -> list[Incident]:
        """Reopen the incidents ``memory`` holds (the same job, under a restarted sentinel).
        One already open by its id (a stop taken up, ``adopt``) takes the remembered alerts
        and actions it lacks instead."""
        restored = []
        for data in memory:
            incident = incident_from_memory(data)
            held = self._open_by_id(incident.id)
            if held is not None:
                # By what each says and when (a NaN value is equal to nothing).
                have = {(a.rule, a.time, a.message) for a in held.alerts}
                held.alerts[:0] = [
                    a for a in incident.alerts if (a.rule, a.time, a.message) not in have
                ]
                held.actions = sorted({*held.actions, *incident.actions}, key=lambda a: a[0])
                incident = held
            for rule in incident.open_rules:
                self.open.setdefault(rule, incident)
            restored.append(incident)
        return restored

    def adopt(self, incident: Incident) -> None:
        """Hold ``incident`` (a stop a dead sentinel left, taken up) open under its rule."""
        if self._open_by_id(incident.id) is None:
            incident.open_rules |= {incident.rule}
            for rule in incident.open_rules:
                self.open.setdefault(rule, incident)

    def _open_by_id(self, incident_id: str) -> Incident | None:
        return next((i for i in self.open.values() if i.id == incident_id), None)

    def close_all(self, now: float, *, keep: frozenset[str] = frozenset()) -> list[Incident]:
        """End every open episode (the job attempt they belong to is over), but those whose
        id is in ``keep``."""
        incidents = {id(incident): incident for incident in self.open.values()}.values()
        return [self._close(incident, now) for incident in incidents if incident.id not in keep]

    def _peer(self, rule: str) -> Incident | None:
        """The open incident of another rule of ``rule``'s story, if any."""
        story = self.stories.get(rule)
        if story is None:
            return None
        for other, incident in self.open.items():
            if self.stories.get(other) == story:
                return incident
        return None

    def _close(self, incident: Incident, now: float) -> Incident:
        incident.resolved_at = now
        incident.open_rules.clear()
        for rule in [rule for rule, other in self.open.items() if other is incident]:
            del self.open[rule]
        self.closed.append(incident)
        return incident


#: Within this long of a rank's alert, another rank's alert of the same rule and severity
#: is its echo: one failure (a NaN, a slowdown) reaching every rank, told once.
ECHO_S = 60.0


def said_key(alert: Alert) -> tuple[str, str]:
    """What an alert is an echo of when another rank raises it soon after: its rule and
    severity (the ranks' numbers differ; their story is one)."""
    return alert.rule, str(alert.severity)


def alert_rank(alert: Alert) -> int:
    """The rank whose series raised ``alert`` (0: the first, which names none)."""
    rank = alert.details.get("rank", 0)
    return rank if isinstance(rank, int) else 0


def fold_ranks(alerts: Sequence[Alert]) -> list[tuple[Alert, list[int]]]:
    """``alerts`` in order, each with the other ranks whose alert of the same rule and
    severity came within ``ECHO_S`` of it (ascending), those alerts folded into it.

    sentinel's own alerts (what it could not do: "giving up ...") are neither folded nor
    folded into: the ranks' NaN that came after the give-up belong with the first rank's."""
    folded: list[tuple[Alert, list[int]]] = []
    first: dict[tuple[str, str], tuple[int, float, set[int]]] = {}
    for alert in alerts:
        if alert.source == SENTINEL_SOURCE:
            folded.append((alert, []))
            continue
        key, rank = said_key(alert), alert_rank(alert)
        known = first.get(key)
        if (
            not alert.resolves
            and known is not None
            and rank not in known[2]
            and alert.time - known[1] <= ECHO_S
        ):
            known[2].add(rank)
            folded[known[0]][1].append(rank)
            continue
        if not alert.resolves:
            first[key] = (len(folded), alert.time, {rank})
        folded.append((alert, []))
    return [(alert, sorted(others)) for alert, others in folded]


def ranks_text(ranks: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` as "ranks 1-3, 5"; one as "rank 1"."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def alert_lines(alerts: Sequence[Alert], *, upper: bool = True) -> list[tuple[float, str]]:
    """An incident's alerts as timeline events: "CRITICAL nan_inf: ..." (``upper``; else
    "critical"), one line for what several ranks raised at once (" (also on ranks 1-63)";
    ``alerts.jsonl`` has each rank's own)."""
    events = []
    for alert, others in fold_ranks(alerts):
        severity = alert.severity.upper() if upper else str(alert.severity)
        text = f"{severity} {alert.rule}: {alert.message}"
        if others:
            text += f" (also on {ranks_text(others)})"
        events.append((alert.time, text))
    return events
