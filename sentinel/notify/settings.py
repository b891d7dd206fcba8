"""``[notify]``: the notification targets, their routes, and how often people hear of alerts.

The settings the notify actions read (``dispatch``, ``notify``, ``heartbeat``);
``sentinel.config`` puts them in the settings tree and checks that each target's
``rules`` exist.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from sentinel.model import secrets
from sentinel.model.bounds import MAX_NAME_CHARS, SettingsTable
from sentinel.model.records import Severity


def _split_urls(value: object) -> object:
    """Apprise URLs from one string are separated by whitespace (a URL may hold commas); a
    string in brackets is a JSON list of them. One in brackets that is not JSON is what a
    shell leaves of ``["slack://..."]`` when it strips the quotes: said so, in one line."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            urls = json.loads(text)
        except ValueError:
            raise ValueError(
                "starts with '[' but is not a JSON list of URLs (did the shell remove its"
                " quotes?): write the URLs separated by spaces, without brackets"
            ) from None
        if not isinstance(urls, list) or not all(isinstance(url, str) for url in urls):
            raise ValueError("a JSON list of URLs holds strings only")
        return urls
    return text.split()


def _accepted_url(url: SecretStr) -> SecretStr:
    """An apprise URL apprise accepts; the error shows it masked."""
    problem = secrets.validate_url(url.get_secret_value())
    if problem:
        raise ValueError(f"{secrets.mask_url(url.get_secret_value())}: {problem}")
    return url


class NotifyTarget(SettingsTable):
    """``[[notify.targets]]``: one apprise URL with its own route."""

    url: SecretStr
    #: Shown instead of the masked URL in ``sentinel status`` and the logs.
    name: str = Field(default="", max_length=MAX_NAME_CHARS)
    #: The least severe alert this target gets; unset: ``[notify] min_severity``.
    min_severity: Severity | None = None
    #: Only incidents of these rules reach this target; empty: every rule.
    rules: list[str] = Field(default_factory=list)

    _accepted = field_validator("url")(_accepted_url)


class NotifyConfig(SettingsTable):
    """``[notify]``: where alerts go, and how often people hear of them."""

    #: Apprise URLs (https://github.com/caronc/apprise/wiki); they hold tokens and are never logged.
    #: Each gets every incident at ``min_severity`` or worse.
    urls: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    #: Targets with routes of their own (severity, rules), beside ``urls``.
    targets: list[NotifyTarget] = Field(default_factory=list)
    min_severity: Severity = Severity.WARNING
    timeout_s: float = Field(default=10.0, gt=0)
    retry_max_s: float = Field(default=300.0, gt=0)
    #: Notices raised within this many seconds of the first go out as one message
    #: (a NaN, the grad-norm run before it and the rollback that followed).
    group_wait_s: float = Field(default=30.0, ge=0)
    #: An incident still open and critical is announced again this often (Alertmanager: 4 h).
    repeat_interval_s: float = Field(default=4 * 3600.0, gt=0)
    #: Send a message when an announced incident resolves.
    send_resolved: bool = True
    #: At most this many messages per target per ``rate_window_s``; the rest are folded
    #: into one digest (every alert stays in the journal).
    rate_limit: int = Field(default=20, ge=1)
    rate_window_s: float = Field(default=3600.0, gt=0)
    #: A rule whose incidents open this many times within ``flap_window_s`` is flapping:
    #: one message says so, and its opens and resolves are held until it settles.
    flap_threshold: int = Field(default=3, ge=2)
    flap_window_s: float = Field(default=3600.0, gt=0)
    #: A URL pinged every ``heartbeat_interval_s`` while sentinel is healthy (a dead-man
    #: switch such as healthchecks.io), so silence from sentinel itself is noticed.
    heartbeat_url: SecretStr | None = None
    heartbeat_interval_s: float = Field(default=300.0, gt=0)

    _split = field_validator("urls", mode="before")(_split_urls)

    @field_validator("urls")
    @classmethod
    def _apprise_accepts(cls, urls: list[SecretStr]) -> list[SecretStr]:
        return [_accepted_url(url) for url in urls]
