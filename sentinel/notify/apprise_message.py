"""A message as apprise sends it: the style a target's URL gets, the URL parameters its
layout needs, and the keyword arguments of ``notify``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import apprise

from sentinel.model.records import Severity
from sentinel.notify.messages import Style, render
from sentinel.notify.notices import Envelope, NoticeKind

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
    arguments: dict[str, Any] = {
        "title": rendered.title,
        "body": rendered.body,
        "body_format": _BODY_FORMATS[rendered.style],
        "notify_type": notify_type,
    }
    if scheme in ("mailto", "mailtos") and (files := attachments(envelope)):
        arguments["attach"] = files
    return url, arguments


def attachments(envelope: Envelope) -> list[str]:
    """The incident files an email carries: those of its notices that exist by now."""
    paths = dict.fromkeys(path for notice in envelope.notices for path in notice.attachments)
    return [path for path in paths if os.path.isfile(path)]
