"""What a message says about its notices, before any markup: the story of each incident
(its lead, timeline, latest diagnosis, every action once), the title, one line per event.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sentinel.model.records import Severity
from sentinel.notify.notices import Envelope, Notice, NoticeKind, hms, rank


@dataclass(frozen=True)
class Story:
    """The notices of one incident in a message, merged into what to say about it."""

    lead: Notice
    #: In the order they were made.
    notices: tuple[Notice, ...]
    diagnosis: tuple[str, ...]
    sparkline: str
    actions: tuple[str, ...]
    report: str
    #: The incident's evidence and chart files (the latest notice's).
    attachments: tuple[str, ...] = ()


def incident_stories(envelope: Envelope) -> list[Story]:
    """One story per incident, the lead's first; the latest notice knows the most."""
    by_incident: dict[str, list[Notice]] = {}
    for notice in envelope.notices:
        by_incident.setdefault(notice.incident_id, []).append(notice)
    stories = []
    for notices in by_incident.values():
        ordered = sorted(notices, key=lambda notice: notice.time)
        latest = ordered[::-1]
        stories.append(
            Story(
                lead=max(notices, key=rank),
                notices=tuple(ordered),
                diagnosis=next((n.diagnosis for n in latest if n.diagnosis), ()),
                sparkline=next((n.sparkline for n in latest if n.sparkline), ""),
                # Each notice carries the actions so far: keep every line once, in order.
                actions=tuple(dict.fromkeys(line for n in ordered for line in n.actions)),
                report=next((n.report for n in latest if n.report), ""),
                attachments=next((n.attachments for n in latest if n.attachments), ()),
            )
        )
    return sorted(stories, key=lambda story: rank(story.lead), reverse=True)


def label(notice: Notice) -> str:
    if notice.kind is NoticeKind.RESOLVED:
        return "RESOLVED"
    if notice.kind is NoticeKind.TEST:
        return "TEST"
    return notice.severity.upper()


_SUFFIX = {
    NoticeKind.REPEAT: " (still open)",
    NoticeKind.FLAPPING: " (flapping)",
    NoticeKind.ACTIONS: " (sentinel acted)",
}
_EMOJI = {Severity.CRITICAL: "🔴", Severity.WARNING: "🟠", Severity.INFO: "🔵"}


def title(envelope: Envelope, stories: Sequence[Story], *, sortable: bool) -> str:
    """``[sentinel] CRITICAL nan_inf job=llama-ft step=1342`` for mailboxes, else for people."""
    job = envelope.job.name
    if not stories:
        return f"[sentinel] INFO held back job={job}" if sortable else f"🔵 held back · {job}"
    lead = stories[0].lead
    step = lead.alert.get("step")
    suffix = _SUFFIX.get(lead.kind, "")
    if len(stories) > 1:
        suffix += f" (+{len(stories) - 1} more)"
    if sortable:
        where = "" if step is None else f" step={step}"
        return f"[sentinel] {label(lead)} {lead.rule} job={job}{where}{suffix}"
    emoji = {NoticeKind.RESOLVED: "✅", NoticeKind.TEST: "🔔"}.get(lead.kind)
    parts = [f"{emoji or _EMOJI[lead.severity]} {label(lead)} {lead.rule}", job]
    if step is not None:
        parts.append(f"step {step}")
    return " · ".join(parts) + suffix


def duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes = whole // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours < 48 else f"{hours // 24} d {hours % 24} h"


def value_text(alert: Mapping[str, Any]) -> str | None:
    value = alert.get("value")
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    text = f"{value:.6g}" if number else str(value)
    return f"{alert['metric']} = {text}" if alert.get("metric") else text


def status(notice: Notice) -> str:
    """What this notice is, in one line, for the top of a body."""
    at = hms(notice.time)
    since = notice.opened_at
    kind = notice.kind
    if kind is NoticeKind.OPENED:
        return f"New incident {notice.incident_id}, opened {at} UTC"
    if kind is NoticeKind.ESCALATED:
        return f"Incident {notice.incident_id} escalated to {notice.severity} at {at} UTC"
    if kind is NoticeKind.REPEAT:
        if since is None:
            return f"Incident {notice.incident_id} is still open ({at} UTC)"
        open_for = duration(notice.time - since)
        return f"Incident {notice.incident_id} still open since {hms(since)} UTC ({open_for})"
    if kind is NoticeKind.ACTIONS:
        return f"What sentinel did about incident {notice.incident_id}"
    if kind is NoticeKind.RESOLVED:
        after = "" if since is None else f" after {duration(notice.time - since)}"
        return f"Incident {notice.incident_id} resolved at {at} UTC{after}"
    if kind is NoticeKind.FLAPPING:
        return notice.note or (
            f"{notice.rule} keeps opening and resolving; its notices are held until it settles"
        )
    return "Test message from sentinel: if you can read this, this target works"


_WORDS = {NoticeKind.REPEAT: "still open", NoticeKind.ACTIONS: "update", NoticeKind.TEST: "test"}


def event(notice: Notice) -> str:
    """A notice as one timeline line."""
    step = notice.alert.get("step")
    where = "" if step is None else f" at step {step}"
    # An ACTIONS notice's alert message repeats its actions, which are listed on their own.
    message = "" if notice.kind is NoticeKind.ACTIONS else notice.alert.get("message") or ""
    word = _WORDS.get(notice.kind, notice.kind)
    text = f"{hms(notice.time)} {label(notice)} {notice.rule} {word}{where}"
    return f"{text}: {message}" if message else text


def folded_line(folded: Mapping[str, int]) -> str:
    """``and 37 more alerts (nan_inf 30, stall 7) held back by the rate limit; ...``."""
    counts = sorted(((r, n) for r, n in folded.items() if n > 0), key=lambda c: (-c[1], c[0]))
    total = sum(count for _, count in counts)
    if not total:
        return ""
    parts = ", ".join(f"{rule} {count}" for rule, count in counts)
    noun = "alert" if total == 1 else "alerts"
    return f"and {total} more {noun} ({parts}) held back by the rate limit; all are in alerts.jsonl"
