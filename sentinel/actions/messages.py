"""What a message says: notices about incidents, and how each target's kind renders them.

A ``Notice`` is one thing people should hear (an incident opened, escalated,
is still open, what sentinel did, resolved), as data. The outbox stores
notices, not text: one message (an ``Envelope``) may carry several notices
grouped within ``group_wait_s``, and it is rendered for its target only when
sent, so Slack gets its layout, email a subject that sorts and the report in
the body, and a JSON webhook the alert schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

import apprise

from sentinel.actions.report import clock, render_markdown
from sentinel.cost import IncidentCost
from sentinel.incidents import Incident
from sentinel.records import Alert, Sample, Severity


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
    #: Epoch seconds.
    time: float
    #: What the evidence suggests (``Diagnosis.lines()``), one line each.
    diagnosis: tuple[str, ...] = ()
    #: The metric around onset, e.g. ``grad_norm ▁▁▂▃▅▇█ nan``; empty when none.
    sparkline: str = ""
    #: What sentinel did, in order, each line starting with its UTC wall-clock time.
    actions: tuple[str, ...] = ()
    #: The incident's report (markdown), for bodies that have room for it (email).
    report: str = ""

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

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "host": self.host,
            "run_id": self.run_id,
            "dashboard_url": self.dashboard_url,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobInfo:
        return cls(data["name"], data["host"], data["run_id"], data.get("dashboard_url", ""))


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


#: How a target's kind wants its message: plain text, markdown, Slack mrkdwn, or the
#: alert schema as JSON.
Style = Literal["text", "markdown", "slack", "json"]


@dataclass(frozen=True)
class Rendered:
    """A message rendered for one target."""

    title: str
    body: str
    style: Style


def style_for(url: str) -> Style:
    """The style a target's apprise URL gets, from its scheme."""
    scheme = url.partition("://")[0].lower()
    if scheme in ("json", "jsons"):
        return "json"
    if scheme in ("slack", "mmost", "mmosts"):
        return "slack"
    if scheme in ("mailto", "mailtos"):
        return "text"
    return "markdown"


def render(envelope: Envelope, style: Style) -> Rendered:
    """The title and body of ``envelope`` for a target of ``style``.

    The title sorts well in a mailbox: ``[sentinel] CRITICAL nan_inf job=llama-ft
    step=1342``, from the worst notice.
    """
    lead = max(envelope.notices, key=lambda notice: notice.severity.rank)
    step = lead.alert.get("step")
    label = "RESOLVED" if lead.kind is NoticeKind.RESOLVED else lead.severity.upper()
    title = f"[sentinel] {label} {lead.rule} job={envelope.job.name}"
    if step is not None:
        title += f" step={step}"
    lines: list[str] = []
    for notice in envelope.notices:
        lines.append(f"{notice.kind}: {notice.alert.get('message', '')}")
        lines += list(notice.diagnosis)
        if notice.sparkline:
            lines.append(notice.sparkline)
        lines += list(notice.actions)
    for rule, count in sorted(envelope.folded.items()):
        lines.append(f"and {count} more {rule} notice(s), held back by the rate limit")
    job = envelope.job
    lines += ["", f"job: {job.name} on {job.host}, run {job.run_id}"]
    if job.dashboard_url:
        lines.append(f"dashboard: {job.dashboard_url}")
    lines.append(f"message: {envelope.key}")
    return Rendered(title=title, body="\n".join(lines), style=style)


def incident_notice(
    kind: NoticeKind,
    incident: Incident,
    alert: Alert,
    *,
    recent: Mapping[str, Sequence[Sample]],
    cost: IncidentCost | None = None,
) -> Notice:
    """A notice about ``incident`` now, with its diagnosis, actions so far and report."""
    diagnosis = incident.diagnosis
    return Notice(
        kind=kind,
        incident_id=incident.id,
        rule=incident.rule,
        severity=incident.severity,
        alert=alert.to_json(),
        time=alert.time,
        diagnosis=tuple(line for line in diagnosis.lines() if line != diagnosis.sparkline)
        if diagnosis is not None
        else (),
        sparkline=diagnosis.sparkline if diagnosis is not None else "",
        actions=tuple(f"{clock(at)} {text}" for at, text in incident.actions),
        report=render_markdown(incident, recent, cost=cost),
    )


_NOTIFY_TYPES = {
    Severity.CRITICAL: apprise.NotifyType.FAILURE,
    Severity.WARNING: apprise.NotifyType.WARNING,
    Severity.INFO: apprise.NotifyType.INFO,
}
_BODY_FORMATS = {
    "text": apprise.NotifyFormat.TEXT,
    "markdown": apprise.NotifyFormat.MARKDOWN,
    "slack": apprise.NotifyFormat.MARKDOWN,
    "json": apprise.NotifyFormat.TEXT,
}


def apprise_call(target_url: str, envelope: Envelope) -> tuple[str, dict[str, Any]]:
    """The URL to instantiate for ``target_url`` and the keyword arguments of ``notify``."""
    rendered = render(envelope, style_for(target_url))
    notify_type = _NOTIFY_TYPES[envelope.severity]
    if all(notice.kind is NoticeKind.RESOLVED for notice in envelope.notices):
        notify_type = apprise.NotifyType.SUCCESS
    return target_url, {
        "title": rendered.title,
        "body": rendered.body,
        "body_format": _BODY_FORMATS[rendered.style],
        "notify_type": notify_type,
    }
