"""What a message says: how each target's kind renders an envelope of notices.

Slack gets its layout, email a subject that sorts and the report in the body,
a JSON webhook the alert schema. A message tells one story: it leads with its
worst notice, merges the notices of one incident (timeline, latest diagnosis,
every action once) and lists other incidents briefly. Every body ends with the
envelope's idempotency key, so a receiver can drop a message delivered twice.
Rendering is pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote, urlsplit

import apprise

from sentinel.actions.notices import Envelope, Notice, NoticeKind, hms, rank
from sentinel.records import Severity, json_number

logger = logging.getLogger(__name__)


#: How a target's kind wants its message: plain text, markdown, Slack mrkdwn, or the
#: alert schema as JSON.
Style = Literal["text", "markdown", "slack", "json"]


@dataclass(frozen=True)
class Rendered:
    """A message rendered for one target."""

    title: str
    body: str
    style: Style


_SLACK_HOSTS = ("hooks.slack.com", "hooks.slack-gov.com")


def style_for(url: str) -> Style:
    """The style a target's apprise URL gets, from its scheme (or Slack's native host)."""
    scheme = url.partition("://")[0].lower()
    if scheme in ("json", "jsons"):
        return "json"
    if scheme in ("slack", "mmost", "mmosts"):
        return "slack"
    if scheme in ("mailto", "mailtos"):
        return "text"
    if scheme == "https" and (urlsplit(url).hostname or "") in _SLACK_HOSTS:
        return "slack"
    return "markdown"


@dataclass(frozen=True)
class _Story:
    """The notices of one incident in a message, merged into what to say about it."""

    lead: Notice
    #: In the order they were made.
    notices: tuple[Notice, ...]
    diagnosis: tuple[str, ...]
    sparkline: str
    actions: tuple[str, ...]
    report: str


def _stories(envelope: Envelope) -> list[_Story]:
    """One story per incident, the lead's first; the latest notice knows the most."""
    by_incident: dict[str, list[Notice]] = {}
    for notice in envelope.notices:
        by_incident.setdefault(notice.incident_id, []).append(notice)
    stories = []
    for notices in by_incident.values():
        ordered = sorted(notices, key=lambda notice: notice.time)
        latest = ordered[::-1]
        stories.append(
            _Story(
                lead=max(notices, key=rank),
                notices=tuple(ordered),
                diagnosis=next((n.diagnosis for n in latest if n.diagnosis), ()),
                sparkline=next((n.sparkline for n in latest if n.sparkline), ""),
                # Each notice carries the actions so far: keep every line once, in order.
                actions=tuple(dict.fromkeys(line for n in ordered for line in n.actions)),
                report=next((n.report for n in latest if n.report), ""),
            )
        )
    return sorted(stories, key=lambda story: rank(story.lead), reverse=True)


def _label(notice: Notice) -> str:
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


def _title(envelope: Envelope, stories: Sequence[_Story], *, sortable: bool) -> str:
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
        return f"[sentinel] {_label(lead)} {lead.rule} job={job}{where}{suffix}"
    emoji = {NoticeKind.RESOLVED: "✅", NoticeKind.TEST: "🔔"}.get(lead.kind)
    parts = [f"{emoji or _EMOJI[lead.severity]} {_label(lead)} {lead.rule}", job]
    if step is not None:
        parts.append(f"step {step}")
    return " · ".join(parts) + suffix


def _duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes = whole // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours < 48 else f"{hours // 24} d {hours % 24} h"


def _value(alert: Mapping[str, Any]) -> str | None:
    value = alert.get("value")
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    text = f"{value:.6g}" if number else str(value)
    return f"{alert['metric']} = {text}" if alert.get("metric") else text


def _status(notice: Notice) -> str:
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
        open_for = _duration(notice.time - since)
        return f"Incident {notice.incident_id} still open since {hms(since)} UTC ({open_for})"
    if kind is NoticeKind.ACTIONS:
        return f"What sentinel did about incident {notice.incident_id}"
    if kind is NoticeKind.RESOLVED:
        after = "" if since is None else f" after {_duration(notice.time - since)}"
        return f"Incident {notice.incident_id} resolved at {at} UTC{after}"
    if kind is NoticeKind.FLAPPING:
        return notice.note or (
            f"{notice.rule} keeps opening and resolving; its notices are held until it settles"
        )
    return "Test message from sentinel: if you can read this, this target works"


_WORDS = {NoticeKind.REPEAT: "still open", NoticeKind.ACTIONS: "update", NoticeKind.TEST: "test"}


def _event(notice: Notice) -> str:
    """A notice as one timeline line."""
    step = notice.alert.get("step")
    where = "" if step is None else f" at step {step}"
    # An ACTIONS notice's alert message repeats its actions, which are listed on their own.
    message = "" if notice.kind is NoticeKind.ACTIONS else notice.alert.get("message") or ""
    word = _WORDS.get(notice.kind, notice.kind)
    text = f"{hms(notice.time)} {_label(notice)} {notice.rule} {word}{where}"
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


class _Plain:
    """How a body marks things up: plain text here, markdown in the subclasses."""

    bullet = "  "

    def bold(self, text: str) -> str:
        return text

    def code(self, text: str) -> str:
        return text

    def escape(self, text: str) -> str:
        return text

    def heading(self, text: str) -> str:
        return f"{text}:"

    def link(self, label: str, url: str) -> str:
        return f"{label}: {url}"

    def fields(self, rows: Sequence[Sequence[tuple[str, str]]]) -> list[str]:
        pairs = [pair for row in rows for pair in row]
        width = max(len(name) for name, _ in pairs) + 1
        return [f"{name + ':':<{width}} {value}" for name, value in pairs]


class _Markdown(_Plain):
    bullet = "- "

    def bold(self, text: str) -> str:
        return f"**{text}**"

    def code(self, text: str) -> str:
        return "`" + text.replace("`", "'") + "`"

    def escape(self, text: str) -> str:
        # Slack reads < and > as link syntax; apprise turns "\<" into "&lt;" for Slack.
        text = text.replace("<", "\\<").replace(">", "\\>")
        return "\\" + text if text.startswith("#") else text

    def heading(self, text: str) -> str:
        return self.bold(text)

    def link(self, label: str, url: str) -> str:
        return f"[{label}]({url})"

    def fields(self, rows: Sequence[Sequence[tuple[str, str]]]) -> list[str]:
        return [" · ".join(f"{self.bold(name)} {value}" for name, value in row) for row in rows]


class _Slack(_Markdown):
    # Neither Slack's mrkdwn nor its converter has lists; a bullet reads the same in Mattermost.
    bullet = "• "


_MAX_ACTIONS = 12
_MAX_OTHERS = 5
_MAX_LINE = 400
#: Slack rejects a section block over 3,000 characters; apprise escapes &, < and >.
SLACK_TEXT_MAX = 2900


def _summary(envelope: Envelope, stories: Sequence[_Story], up: _Plain) -> list[str]:
    """What happened, to whom, why, and what sentinel did: the top of every body."""
    job = envelope.job
    rows = [[("Job", job.name), ("Host", job.host), ("Run", job.run_id)]]
    if not stories:
        return up.fields(rows)
    story = stories[0]
    lead = story.lead
    alert = lead.alert
    lines = [up.bold(up.escape(_status(lead)))]
    quiet = (NoticeKind.TEST, NoticeKind.ACTIONS)  # an ACTIONS alert's message is its actions
    if alert.get("message") and lead.kind not in quiet:
        lines.append(up.escape(str(alert["message"])))
    if lead.kind is not NoticeKind.TEST:
        row = [("Rule", f"{lead.rule} ({lead.severity})"), ("Incident", lead.incident_id)]
        if alert.get("step") is not None:
            row.append(("Step", str(alert["step"])))
        value = _value(alert)
        if value is not None:
            row.append(("Value", up.escape(value)))
        rows.append(row)
    lines += ["", *up.fields(rows)]
    news = lead.kind not in (NoticeKind.RESOLVED, NoticeKind.TEST)
    if story.sparkline and news:
        lines += ["", f"{up.heading('Around onset')} {up.code(story.sparkline)}"]

    def section(title: str, items: Sequence[str]) -> None:
        if items:
            lines.extend(["", up.heading(title), *(up.bullet + item for item in items)])

    events = [notice for notice in story.notices if notice.kind is not NoticeKind.ACTIONS]
    section("Timeline (UTC)", [up.escape(_event(n)) for n in events] if len(events) > 1 else [])
    section("Diagnosis", [up.escape(line) for line in story.diagnosis] if news else [])
    actions = [up.escape(line) for line in story.actions]
    if len(actions) > _MAX_ACTIONS:
        skipped = len(actions) - _MAX_ACTIONS + 1
        actions = [f"... {skipped} earlier actions", *actions[-_MAX_ACTIONS + 1 :]]
    section("What sentinel did (UTC)", actions)
    others = []
    for other in stories[1 : 1 + _MAX_OTHERS]:
        others.append(up.escape(f"{_event(other.lead)} (incident {other.lead.incident_id})"))
        if other.diagnosis and other.lead.kind is not NoticeKind.RESOLVED:
            others[-1] += f"; {up.escape(other.diagnosis[0])}"
        if other.actions:
            others[-1] += f"; sentinel: {up.escape(other.actions[-1])}"
    if len(stories) > 1 + _MAX_OTHERS:
        others.append(f"... and {len(stories) - 1 - _MAX_OTHERS} more incidents")
    section("Also in this message", others)
    return [line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 3] + "..." for line in lines]


def _tail(envelope: Envelope, up: _Plain) -> list[str]:
    """The lines no body may lose: the dashboard, what was held back, the key."""
    lines = [""]
    if envelope.job.dashboard_url:
        lines.append(up.link("Dashboard", envelope.job.dashboard_url))
    if held := folded_line(envelope.folded):
        lines.append(up.escape(held))
    lines.append(f"sentinel · message key {up.code(envelope.key)}")
    return lines


def _slack_length(text: str) -> int:
    return len(text) + 4 * text.count("&") + 3 * (text.count("<") + text.count(">"))


def _fit(head: list[str], tail: list[str], limit: int) -> list[str]:
    """``head + tail`` within ``limit`` characters, cutting the end of ``head`` if needed."""
    note = ["", "... (cut to fit; the incident report has everything)"]
    while head and _slack_length("\n".join(head + tail)) > limit:
        head = head[:-1]
        tail = note + tail if tail[:2] != note else tail
    return head + tail


_SCHEMA_KEYS = ("rule", "severity", "step", "metric", "value", "message", "time", "source")


def _strict(value: Any) -> Any:
    """``value`` with NaN and infinities spelled as strings, as strict JSON wants."""
    if isinstance(value, float) and not math.isfinite(value):
        return json_number(value)
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(item) for item in value]
    return value


def _json_body(envelope: Envelope, stories: Sequence[_Story]) -> str:
    """The lead notice's alert in the public schema, plus what the message is about."""
    lead = stories[0].lead if stories else None
    alert = dict(lead.alert) if lead is not None else {"severity": str(envelope.severity)}
    body: dict[str, Any] = {key: alert.get(key) for key in _SCHEMA_KEYS}
    body.update({key: value for key, value in alert.items() if key not in body})
    body.update(
        key=envelope.key,
        incident=lead.incident_id if lead is not None else None,
        kind=str(lead.kind) if lead is not None else None,
        job=envelope.job.to_json(),
        diagnosis=list(stories[0].diagnosis) if stories else [],
        sparkline=stories[0].sparkline if stories else "",
        actions=list(stories[0].actions) if stories else [],
        notices=[
            {
                "kind": str(notice.kind),
                "incident": notice.incident_id,
                "rule": notice.rule,
                "severity": str(notice.severity),
                "alert": notice.alert,
            }
            for notice in envelope.notices
        ],
        folded={rule: count for rule, count in sorted(envelope.folded.items()) if count > 0},
    )
    return json.dumps(_strict(body), ensure_ascii=False)


def render(envelope: Envelope, style: Style) -> Rendered:
    """The title and body of ``envelope`` for a target of ``style``.

    The title sorts well in a mailbox: ``[sentinel] CRITICAL nan_inf job=llama-ft
    step=1342``, from the worst notice; Slack and markdown targets get a title for
    people (``🔴 CRITICAL nan_inf · llama-ft · step 1342``).
    """
    stories = _stories(envelope)
    if style == "json":
        return Rendered(
            _title(envelope, stories, sortable=True), _json_body(envelope, stories), style
        )
    if style == "text":
        *body, footer = _summary(envelope, stories, _Plain()) + _tail(envelope, _Plain())
        for report in (story.report.rstrip() for story in stories if story.report):
            body += ["", "-" * 72, "", report]
        body += ["", "-- ", footer]
        return Rendered(_title(envelope, stories, sortable=True), "\n".join(body), style)
    up = _Slack() if style == "slack" else _Markdown()
    lines = _summary(envelope, stories, up)
    tail = _tail(envelope, up)
    if style == "slack":
        lines = _fit(lines, tail, SLACK_TEXT_MAX)
        # Slack's header block takes at most 150 characters.
        return Rendered(_title(envelope, stories, sortable=False)[:140], "\n".join(lines), style)
    return Rendered(_title(envelope, stories, sortable=False), "\n".join(lines + tail), style)


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
# URL parameters a kind needs for its layout, unless the user's URL sets them: Slack's
# Block Kit mode (a header block, a mrkdwn section, the colour bar) without apprise's own
# footer; Mattermost renders markdown, but apprise's plugin would flatten it to text.
_URL_DEFAULTS = {
    "slack": {"blocks": "yes", "footer": "no"},
    "mmost": {"format": "markdown"},
    "mmosts": {"format": "markdown"},
}


def _with_defaults(url: str, defaults: Mapping[str, str]) -> str:
    # Not parse_qsl: it reads the "+" of apprise's "+Header=value" parameters as a space.
    given = {unquote(part.partition("=")[0]).lower() for part in url.partition("?")[2].split("&")}
    extra = "&".join(
        f"{name}={value}" for name, value in defaults.items() if name.lower() not in given
    )
    if not extra:
        return url
    return f"{url}{'&' if '?' in url else '?'}{extra}"


def apprise_call(target_url: str, envelope: Envelope) -> tuple[str, dict[str, Any]]:
    """The URL to instantiate for ``target_url`` and the keyword arguments of ``notify``."""
    style = style_for(target_url)
    rendered = render(envelope, style)
    notify_type = _NOTIFY_TYPES[envelope.severity]
    if envelope.notices and all(n.kind is NoticeKind.RESOLVED for n in envelope.notices):
        notify_type = apprise.NotifyType.SUCCESS
    scheme = target_url.partition("://")[0].lower()
    # Slack's native https://hooks.slack.com/... URLs have no scheme of their own.
    fallback = _URL_DEFAULTS["slack"] if style == "slack" else {}
    defaults = dict(_URL_DEFAULTS.get(scheme, fallback))
    if style == "json":
        # The key in a header too, where receivers that dedupe usually look for it.
        defaults["+Idempotency-Key"] = quote(envelope.key, safe="")
    url = _with_defaults(target_url, defaults)
    return url, {
        "title": rendered.title,
        "body": rendered.body,
        "body_format": _BODY_FORMATS[rendered.style],
        "notify_type": notify_type,
    }
