"""What a message says: how each target's style renders an envelope of notices.

Slack gets its layout, email a subject that sorts and the report in the body,
a JSON webhook the alert schema. A message tells one story: it leads with its
worst notice, merges the notices of one incident (timeline, latest diagnosis,
every action once) and lists other incidents briefly (``message_story``). Every
body ends with the envelope's idempotency key, so a receiver can drop a message
delivered twice. Rendering is pure: no I/O, no clock. Which style a target gets,
and the apprise call that sends it, are ``apprise_message``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sentinel.model.secrets import mask_tokens
from sentinel.notify.message_json import json_body
from sentinel.notify.message_markup import (
    SLACK_TEXT_MAX,
    Markdown,
    Plain,
    Slack,
    fit,
    summary_lines,
    tail_lines,
)
from sentinel.notify.message_story import folded_line, incident_stories, title
from sentinel.notify.notices import Envelope

__all__ = ["SLACK_TEXT_MAX", "Rendered", "Style", "folded_line", "render"]

#: How a target's kind wants its message: plain text, markdown, Slack mrkdwn, or the
#: alert schema as JSON.
Style = Literal["text", "markdown", "slack", "json"]


@dataclass(frozen=True)
class Rendered:
    """A message rendered for one target."""

    title: str
    body: str
    style: Style


def render(envelope: Envelope, style: Style) -> Rendered:
    """The title and body of ``envelope`` for a target of ``style``.

    The title sorts well in a mailbox: ``[sentinel] CRITICAL nan_inf job=llama-ft
    step=1342``, from the worst notice; Slack and markdown targets get a title for
    people (``🔴 CRITICAL nan_inf · llama-ft · step 1342``).
    """
    stories = incident_stories(envelope)
    if style == "json":
        # The job's text as it was, but for the credentials in it.
        return Rendered(
            mask_tokens(title(envelope, stories, sortable=True)),
            json_body(envelope, stories),
            style,
        )
    if style == "text":
        plain = Plain()
        *body, footer = summary_lines(envelope, stories, plain) + tail_lines(envelope, plain)
        for report in (story.report.rstrip() for story in stories if story.report):
            # Written safe for Markdown already; a report queued by an older sentinel is not.
            body += ["", "-" * 72, "", *(plain.escape(line) for line in report.splitlines())]
        body += ["", "-- ", footer]
        return Rendered(
            plain.title(title(envelope, stories, sortable=True)), "\n".join(body), style
        )
    up = Slack() if style == "slack" else Markdown()
    lines = summary_lines(envelope, stories, up)
    tail = tail_lines(envelope, up)
    heading = up.title(title(envelope, stories, sortable=False))
    if style == "slack":
        lines = fit(lines, tail, SLACK_TEXT_MAX)
        # Slack's header block takes at most 150 characters.
        return Rendered(heading[:140], "\n".join(lines), style)
    return Rendered(heading, "\n".join(lines + tail), style)
