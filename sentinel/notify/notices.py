"""What people should hear about incidents, as data: notices, the job, the envelope.

A ``Notice`` is one thing people should hear (an incident opened, escalated,
is still open, what sentinel did, resolved). The outbox stores notices, not
text: one message (an ``Envelope``) may carry several notices grouped within
``group_wait_s``, and ``sentinel.notify.messages`` renders it for its target
only when it is sent.
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from sentinel.evidence.report import clock, render_markdown
from sentinel.model.cost import IncidentCost
from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Sample, Severity

logger = logging.getLogger(__name__)


class NoticeKind(StrEnum):
    OPENED = "opened"
    ESCALATED = "escalated"
    #: An incident still open and critical, announced again (``repeat_interval_s``).
    REPEAT = "repeat"
    #: What sentinel did about an incident (SIGTERM, rollback, restart).
    ACTIONS = "actions"
    RESOLVED = "resolved"
    #: A rule opening and resolving over and over: its notices are held until it settles.
    FLAPPING = "flapping"
    TEST = "test"


@dataclass(frozen=True)
class Notice:
    """One thing to tell people about one incident, as data (rendered at send time)."""

    kind: NoticeKind
    incident_id: str
    #: The rule of the incident's worst alert.
    rule: str
    #: The incident's severity when the notice was made.
    severity: Severity
    #: The alert this notice is about, in the public alert schema (``Alert.to_json``).
    alert: dict[str, Any]
    #: Epoch seconds: when the notice was made (a repeat's is the time of the repeat).
    time: float
    #: What the evidence suggests (``Diagnosis.lines()``), one line each.
    diagnosis: tuple[str, ...] = ()
    #: The metric around onset, e.g. ``grad_norm ▁▁▂▃▅▇█ nan``; empty when none.
    sparkline: str = ""
    #: What sentinel did, in order, each line starting with its UTC wall-clock time.
    actions: tuple[str, ...] = ()
    #: The incident's report (markdown), for bodies that have room for it (email).
    report: str = ""
    #: When the incident opened (epoch seconds), for "still open since" and durations.
    opened_at: float | None = None
    #: A line the notifying policy adds, e.g. how often a flapping rule flapped.
    note: str = ""
    #: Files of the incident's folder (its evidence, its chart): attached to email when they
    #: exist at send time, named in the other bodies.
    attachments: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "incident_id": self.incident_id,
            "rule": self.rule,
            "severity": str(self.severity),
            "alert": self.alert,
            "time": self.time,
            "diagnosis": list(self.diagnosis),
            "sparkline": self.sparkline,
            "actions": list(self.actions),
            "report": self.report,
            "opened_at": self.opened_at,
            "note": self.note,
            "attachments": list(self.attachments),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Notice:
        return cls(
            kind=NoticeKind(data["kind"]),
            incident_id=data["incident_id"],
            rule=data["rule"],
            severity=Severity(data["severity"]),
            alert=data["alert"],
            time=data["time"],
            diagnosis=tuple(data.get("diagnosis", ())),
            sparkline=data.get("sparkline", ""),
            actions=tuple(data.get("actions", ())),
            report=data.get("report", ""),
            opened_at=data.get("opened_at"),
            note=data.get("note", ""),
            attachments=tuple(data.get("attachments", ())),
        )


@dataclass(frozen=True)
class JobInfo:
    """Which job a message is about."""

    name: str
    host: str
    #: sentinel's run id (``Watch.run_id``).
    run_id: str
    #: The run's dashboard, already formatted from ``[job] dashboard_url``; "" for none.
    dashboard_url: str = ""
    #: The run's id shared by every node's sentinel (``--run-id``, SLURM_JOB_ID...); "" for none.
    shared_run_id: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "host": self.host,
            "run_id": self.run_id,
            "dashboard_url": self.dashboard_url,
            "shared_run_id": self.shared_run_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobInfo:
        return cls(
            data["name"],
            data["host"],
            data["run_id"],
            data.get("dashboard_url", ""),
            data.get("shared_run_id", ""),
        )


# Which notice leads at equal severity: news before reminders, updates and all-clears.
_KIND_RANK = {
    NoticeKind.ESCALATED: 6,
    NoticeKind.OPENED: 5,
    NoticeKind.REPEAT: 4,
    NoticeKind.FLAPPING: 3,
    NoticeKind.ACTIONS: 2,
    NoticeKind.RESOLVED: 1,
    NoticeKind.TEST: 0,
}


def rank(notice: Notice) -> tuple[int, int]:
    """How a notice ranks to lead a message: severity first (a resolution counts as info),
    then news before reminders and updates."""
    severity = Severity.INFO if notice.kind is NoticeKind.RESOLVED else notice.severity
    return severity.rank, _KIND_RANK[notice.kind]


@dataclass(frozen=True)
class Envelope:
    """One message to one target: its notices, and an idempotency key stable across retries."""

    key: str
    job: JobInfo
    notices: tuple[Notice, ...]
    #: Notices the rate limit folded away (counted here, kept in the journal), by rule.
    folded: dict[str, int] = field(default_factory=dict)

    @property
    def severity(self) -> Severity:
        """The message's severity: its worst notice's (a resolved notice counts as info)."""
        ranks = [
            Severity.INFO if notice.kind is NoticeKind.RESOLVED else notice.severity
            for notice in self.notices
        ]
        return max(ranks, key=lambda severity: severity.rank, default=Severity.INFO)

    @property
    def lead(self) -> Notice | None:
        """The notice the message leads with: the worst, news before updates; None if empty."""
        return max(self.notices, key=rank, default=None)


def hms(epoch_s: float) -> str:
    """An epoch time as UTC ``HH:MM:SS``."""
    return clock(epoch_s)[:8]


def incident_notice(
    kind: NoticeKind,
    incident: Incident,
    alert: Alert,
    *,
    recent: Mapping[str, Sequence[Sample]],
    cost: IncidentCost | None = None,
    now: float | None = None,
    note: str = "",
    attachments: Sequence[str] = (),
) -> Notice:
    """A notice about ``incident`` now, with its diagnosis, actions so far and report.

    ``now`` is when the notice is made (a repeat's time); it defaults to the alert's.
    """
    diagnosis = incident.diagnosis
    return Notice(
        kind=kind,
        incident_id=incident.id,
        rule=incident.rule,
        severity=incident.severity,
        alert=alert.to_json(),
        time=alert.time if now is None else now,
        diagnosis=tuple(line for line in diagnosis.lines() if line != diagnosis.sparkline)
        if diagnosis is not None
        else (),
        sparkline=diagnosis.sparkline if diagnosis is not None else "",
        actions=tuple(f"{hms(at)} {text}" for at, text in incident.actions),
        report=render_markdown(incident, recent, cost=cost),
        opened_at=incident.opened_at,
        note=note,
        attachments=tuple(attachments),
    )


class _DashboardFields(string.Formatter):
    """``str.format`` that knows ``{job}``, ``{host}``, ``{run_id}`` and ``{env[NAME]}`` only.

    What it puts in is percent-encoded (``/``, ``?``, ``#`` and ``&`` too), so a run named
    ``team/llama #2`` stays one path segment or query value of a link that works; the
    template's own text is kept as written.
    """

    def __init__(self, values: Mapping[str, str], environ: Mapping[str, str]) -> None:
        self._values = values
        self._environ = environ

    def get_field(self, field_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        if field_name in self._values:
            return self._values[field_name], field_name
        match = re.fullmatch(r"env\[([^\]]+)\]", field_name)
        if match is None:
            raise LookupError(f"unknown field {{{field_name}}}")
        if match[1] not in self._environ:
            raise LookupError(f"environment variable {match[1]} is not set")
        return self._environ[match[1]], field_name

    def format_field(self, value: Any, format_spec: str) -> str:
        return quote(super().format_field(value, format_spec), safe="")


def format_dashboard_url(
    template: str, *, job: str, host: str, run_id: str, environ: Mapping[str, str]
) -> str:
    """``[job] dashboard_url`` with its fields filled in; "" (and a warning) if one cannot be."""
    if not template:
        return ""
    formatter = _DashboardFields({"job": job, "host": host, "run_id": run_id}, environ)
    try:
        return formatter.format(template)
    except (LookupError, ValueError, TypeError) as exc:
        logger.warning("[job] dashboard_url: %s; messages carry no dashboard link", exc)
        return ""
