"""How a body is laid out and marked up: plain text, markdown, Slack's mrkdwn.

``summary`` is the top of every body (what happened, to whom, why, what sentinel
did), ``tail`` the lines no body may lose; ``Plain``, ``Markdown`` and ``Slack``
say how each marks them up.

Every text that is not sentinel's own markup goes through ``escape`` (alert messages
quote the job, actions name checkpoint folders, the job's name may be its script's):
in every style its credential-shaped words are masked, its control characters shown as
escapes and its URLs shown unlinkable; in Markdown and Slack it cannot make a link, an
image or HTML either, nor mention anyone (``@channel``, ``<!here>``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sentinel.model.secrets import mask_tokens
from sentinel.model.untrusted import defang_urls, markdown_literal, no_mentions, printable
from sentinel.notify.message_story import Story, event, folded_line, status, value_text
from sentinel.notify.notices import Envelope, NoticeKind


class Plain:
    """How a body marks things up: plain text here, markdown in the subclasses."""

    bullet = "  "

    def bold(self, text: str) -> str:
        return text

    def code(self, text: str) -> str:
        return printable(text)

    def escape(self, text: str) -> str:
        """Text from outside sentinel (the job's words, a file's name), made safe to show."""
        return defang_urls(printable(mask_tokens(text)))

    def title(self, text: str) -> str:
        """A message's title (it names the job), made safe for where the style puts it."""
        return self.escape(text)

    def heading(self, text: str) -> str:
        return f"{text}:"

    def link(self, label: str, url: str) -> str:
        return f"{label}: {url}"

    def fields(self, rows: Sequence[Sequence[tuple[str, str]]]) -> list[str]:
        pairs = [pair for row in rows for pair in row]
        width = max(len(name) for name, _ in pairs) + 1
        return [f"{name + ':':<{width}} {value}" for name, value in pairs]


class Markdown(Plain):
    bullet = "- "

    def bold(self, text: str) -> str:
        return f"**{text}**"

    def code(self, text: str) -> str:
        return "`" + printable(text).replace("`", "'") + "`"

    def escape(self, text: str) -> str:
        # Slack reads < and > as link syntax; apprise turns "\<" into "&lt;" for Slack, and
        # "\[" into a plain "[" (mrkdwn has no [label](url) but apprise would make one).
        return no_mentions(markdown_literal(super().escape(text)))

    def heading(self, text: str) -> str:
        return self.bold(text)

    def link(self, label: str, url: str) -> str:
        return f"[{label}]({url})"

    def fields(self, rows: Sequence[Sequence[tuple[str, str]]]) -> list[str]:
        return [" · ".join(f"{self.bold(name)} {value}" for name, value in row) for row in rows]


class Slack(Markdown):
    # Neither Slack's mrkdwn nor its converter has lists; a bullet reads the same in Mattermost.
    bullet = "• "

    def title(self, text: str) -> str:
        # Slack's header block is plain text (apprise escapes it): no Markdown escapes there.
        return no_mentions(Plain.escape(self, text))


_MAX_ACTIONS = 12
_MAX_OTHERS = 5
_MAX_LINE = 400
#: Slack rejects a section block over 3,000 characters; apprise escapes &, < and >.
SLACK_TEXT_MAX = 2900


def summary_lines(envelope: Envelope, stories: Sequence[Story], up: Plain) -> list[str]:
    """What happened, to whom, why, and what sentinel did: the top of every body."""
    job = envelope.job
    rows = [[("Job", up.escape(job.name)), ("Host", up.escape(job.host)), ("Run", job.run_id)]]
    if not stories:
        return up.fields(rows)
    story = stories[0]
    lead = story.lead
    alert = lead.alert
    lines = [up.bold(up.escape(status(lead)))]
    quiet = (NoticeKind.TEST, NoticeKind.ACTIONS)  # an ACTIONS alert's message is its actions
    if alert.get("message") and lead.kind not in quiet:
        lines.append(up.escape(str(alert["message"])))
    if lead.kind is not NoticeKind.TEST:
        row = [
            ("Rule", f"{up.escape(lead.rule)} ({lead.severity})"),
            ("Incident", up.escape(lead.incident_id)),
        ]
        if alert.get("step") is not None:
            row.append(("Step", str(alert["step"])))
        value = value_text(alert)
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
    section("Timeline (UTC)", [up.escape(event(n)) for n in events] if len(events) > 1 else [])
    section("Diagnosis", [up.escape(line) for line in story.diagnosis] if news else [])
    actions = [up.escape(line) for line in story.actions]
    if len(actions) > _MAX_ACTIONS:
        skipped = len(actions) - _MAX_ACTIONS + 1
        actions = [f"... {skipped} earlier actions", *actions[-_MAX_ACTIONS + 1 :]]
    section("What sentinel did (UTC)", actions)
    section("Evidence and chart", [up.code(path) for path in story.attachments] if news else [])
    others = []
    for other in stories[1 : 1 + _MAX_OTHERS]:
        others.append(up.escape(f"{event(other.lead)} (incident {other.lead.incident_id})"))
        if other.diagnosis and other.lead.kind is not NoticeKind.RESOLVED:
            others[-1] += f"; {up.escape(other.diagnosis[0])}"
        if other.actions:
            others[-1] += f"; sentinel: {up.escape(other.actions[-1])}"
    if len(stories) > 1 + _MAX_OTHERS:
        others.append(f"... and {len(stories) - 1 - _MAX_OTHERS} more incidents")
    section("Also in this message", others)
    return [line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 3] + "..." for line in lines]


def tail_lines(envelope: Envelope, up: Plain) -> list[str]:
    """The lines no body may lose: the dashboard, what was held back, the key."""
    lines = [""]
    if envelope.job.dashboard_url:
        lines.append(up.link("Dashboard", envelope.job.dashboard_url))
    if held := folded_line(envelope.folded):
        lines.append(up.escape(held))
    lines.append(f"sentinel · message key {up.code(envelope.key)}")
    return lines


def slack_length(text: str) -> int:
    return len(text) + 4 * text.count("&") + 3 * (text.count("<") + text.count(">"))


def fit(head: list[str], tail: list[str], limit: int) -> list[str]:
    """``head + tail`` within ``limit`` characters, cutting the end of ``head`` if needed."""
    note = ["", "... (cut to fit; the incident report has everything)"]
    while head and slack_length("\n".join(head + tail)) > limit:
        head = head[:-1]
        tail = note + tail if tail[:2] != note else tail
    return head + tail
