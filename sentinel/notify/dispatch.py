"""Who hears of an incident, and when: the policy between incidents and the outbox.

Alertmanager's behaviour, with sentinel's own notice kinds:

- Routing. Every target has a minimum severity and, optionally, the rules it
  cares about. It gets an incident's OPENED, ESCALATED, REPEAT and FLAPPING
  notices when the incident is that severe and one of its rules passes the
  filter; ACTIONS and RESOLVED only about incidents it was told of.
- Repeat. An open critical incident is announced again every ``repeat_interval_s``.
- Flapping. A rule whose incidents opened ``flap_threshold`` times within
  ``flap_window_s`` sends one FLAPPING notice instead of its next OPENED; its
  OPENED and RESOLVED notices are then held until it has been quiet (no
  opening) for ``flap_window_s``.
- Grouping, the rate limit and a reopen cancelling a pending resolve are the
  outbox's part (``outbox.Batching``): they must be decided in the same
  transaction as the write.

Nothing here reads a clock or does I/O but the outbox call: the caller passes ``now``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sentinel.model.records import Severity
from sentinel.model.secrets import mask_url
from sentinel.notify.notices import JobInfo, Notice, NoticeKind
from sentinel.notify.outbox import Added, Batching, Outbox, Target, target_hash
from sentinel.notify.settings import NotifyConfig

log = logging.getLogger(__name__)

#: Kinds that announce an incident: they go by route, and tell a target of it.
_ANNOUNCING = frozenset(
    {NoticeKind.OPENED, NoticeKind.ESCALATED, NoticeKind.REPEAT, NoticeKind.FLAPPING}
)


@dataclass(frozen=True)
class Route:
    """One target and what reaches it."""

    url: str
    name: str
    min_severity: Severity
    #: Rules this target hears of; empty: every rule.
    rules: frozenset[str] = frozenset()

    def accepts(self, severity: Severity, rules: Sequence[str]) -> bool:
        """Whether an incident this severe, of these rules, is for this target."""
        if severity < self.min_severity:
            return False
        return not self.rules or any(rule in self.rules for rule in rules)

    @property
    def target(self) -> Target:
        return Target(self.url, self.name)


def routes(config: NotifyConfig) -> list[Route]:
    """Every target of ``[notify]``: each of ``urls``, then each of ``targets``.

    A URL given twice keeps its last route (a ``targets`` entry refines a bare URL).
    """
    found: dict[str, Route] = {}
    for secret in config.urls:
        url = secret.get_secret_value()
        found[url] = Route(url, mask_url(url), config.min_severity)
    for target in config.targets:
        url = target.url.get_secret_value()
        found[url] = Route(
            url,
            target.name or mask_url(url),
            target.min_severity or config.min_severity,
            frozenset(target.rules),
        )
    return list(found.values())


@dataclass(frozen=True)
class Policy:
    """The timing of notices (``[notify]``'s keys of the same names)."""

    group_wait_s: float = 30.0
    repeat_interval_s: float = 4 * 3600.0
    send_resolved: bool = True
    rate_limit: int = 20
    rate_window_s: float = 3600.0
    flap_threshold: int = 3
    flap_window_s: float = 3600.0

    @classmethod
    def from_config(cls, config: NotifyConfig) -> Policy:
        return cls(
            group_wait_s=config.group_wait_s,
            repeat_interval_s=config.repeat_interval_s,
            send_resolved=config.send_resolved,
            rate_limit=config.rate_limit,
            rate_window_s=config.rate_window_s,
            flap_threshold=config.flap_threshold,
            flap_window_s=config.flap_window_s,
        )

    @property
    def batching(self) -> Batching:
        return Batching(
            group_wait_s=self.group_wait_s,
            rate_limit=self.rate_limit,
            rate_window_s=self.rate_window_s,
        )


_OUTCOMES = {
    Added.NEW: "a new message",
    Added.JOINED: "joined a message still gathering",
    Added.FOLDED: "folded into the rate limit's digest",
    Added.CANCELLED: "cancelled with the resolve still waiting: neither is sent",
}


class Dispatcher:
    """Decides which targets get each notice, then hands it to the outbox."""

    def __init__(
        self, outbox: Outbox, routes: Sequence[Route], policy: Policy, job: JobInfo
    ) -> None:
        self.outbox = outbox
        self.routes = list(routes)
        self.policy = policy
        self.job = job
        outbox.add_targets(route.target for route in self.routes)
        #: Per target URL: the incidents it was told of.
        self._told: dict[str, set[str]] = {route.url: set() for route in self.routes}
        #: Per incident: when it was last announced to anyone (for repeats).
        self._announced_at: dict[str, float] = {}
        #: Per rule: when its recent incidents opened (within ``flap_window_s``).
        self._opened_at: dict[str, list[float]] = {}
        #: Per flapping rule: when it last opened (held or not).
        self._flapping: dict[str, float] = {}

    def set_routes(self, routes: Sequence[Route]) -> None:
        """New routes (SIGHUP): a new target is configured in the outbox, so that what it is
        sent is delivered; what the others were told is kept."""
        self.routes = list(routes)
        self.outbox.add_targets(route.target for route in self.routes)
        for route in self.routes:
            self._told.setdefault(route.url, set())

    def dispatch(
        self, notice: Notice, rules: Sequence[str], now: float, *, force: bool = False
    ) -> list[str]:
        """Hand ``notice`` (about an incident of ``rules``) to its targets; their names.

        ``force`` sends an ACTIONS notice by route even to targets never told of
        the incident (sentinel gave up on it: someone must hear).
        """
        held = self._damp(notice, now)
        if held is None:
            return []
        notice = held
        if notice.kind in _ANNOUNCING or force:
            chosen = [route for route in self.routes if route.accepts(notice.severity, rules)]
        elif notice.kind is NoticeKind.RESOLVED and not self.policy.send_resolved:
            chosen = []
        else:
            chosen = [route for route in self.routes if notice.incident_id in self._told[route.url]]
        if notice.kind is NoticeKind.RESOLVED:
            self.forget(notice.incident_id)
        if not chosen:
            return []
        outcome = self.outbox.add(
            notice, self.job, [route.url for route in chosen], now, self.policy.batching
        )
        names = []
        for route in chosen:
            added = outcome[route.url]
            if notice.kind in _ANNOUNCING or force:
                self._told[route.url].add(notice.incident_id)
                self._announced_at[notice.incident_id] = now
            names.append(route.name)
            log.log(
                # A storm folds hundreds of notices: one line each only when debugging.
                logging.DEBUG if added is Added.FOLDED else logging.INFO,
                "%s notice of %s (%s) for %s: %s",
                notice.kind,
                notice.incident_id,
                notice.rule,
                route.name,
                _OUTCOMES[added],
            )
        return names

    def memory(self) -> dict[str, Any]:
        """The clocks and the told lists, as JSON, for the state dir; targets by hash."""
        return {
            "told": {target_hash(url): sorted(ids) for url, ids in self._told.items() if ids},
            "announced_at": dict(self._announced_at),
            "opened_at": dict(self._opened_at),
            "flapping": dict(self._flapping),
        }

    def remember(self, memory: dict[str, Any], *, same_job: bool) -> None:
        """Take back the flapping clocks (the run's); with ``same_job``, who was told of
        which incident and when each was last announced (the incidents are the job's)."""
        self._opened_at.update({rule: list(at) for rule, at in memory["opened_at"].items()})
        self._flapping.update(memory["flapping"])
        if not same_job:
            return
        self._announced_at.update(memory["announced_at"])
        by_hash = {target_hash(url): url for url in self._told}
        for hashed, ids in memory["told"].items():
            if hashed in by_hash:  # a target no longer configured is told nothing more
                self._told[by_hash[hashed]].update(ids)

    def repeat_due(self, incident_id: str, now: float) -> bool:
        """Whether an announced incident, still open and critical, is due to be announced again."""
        announced_at = self._announced_at.get(incident_id)
        return announced_at is not None and now - announced_at >= self.policy.repeat_interval_s

    def forget(self, incident_id: str) -> None:
        """The incident is over: no repeat, and nothing more goes to its targets."""
        self._announced_at.pop(incident_id, None)
        for told in self._told.values():
            told.discard(incident_id)

    def flapping(self, rule: str) -> bool:
        return rule in self._flapping

    def _damp(self, notice: Notice, now: float) -> Notice | None:
        """The notice to send after flap damping (FLAPPING for an OPENED), or None to hold it."""
        rule, window_s = notice.rule, self.policy.flap_window_s
        if notice.kind is NoticeKind.RESOLVED:
            if rule in self._flapping:
                log.debug("held the resolve of %s: %s is flapping", notice.incident_id, rule)
                return None
            return notice
        if notice.kind is not NoticeKind.OPENED:
            return notice
        last_open = self._flapping.get(rule)
        if last_open is not None:
            self._flapping[rule] = now
            if now - last_open < window_s:
                log.debug("held the opening of %s: %s is flapping", notice.incident_id, rule)
                return None
            del self._flapping[rule]
            log.info("%s has settled (no new incident for %gs)", rule, window_s)
        opened = [at for at in self._opened_at.get(rule, []) if now - at < window_s] + [now]
        self._opened_at[rule] = opened
        if len(opened) < self.policy.flap_threshold:
            return notice
        self._flapping[rule] = now
        self._opened_at[rule] = []
        log.warning(
            "%s is flapping (%d incidents within %gs): holding its opens and resolves until it"
            " is quiet for %gs",
            rule,
            len(opened),
            window_s,
            window_s,
        )
        note = (
            f"{rule} opened {len(opened)} incidents within {_duration(window_s)}: its openings"
            f" and resolutions are held until none opens for {_duration(window_s)}"
        )
        return replace(notice, kind=NoticeKind.FLAPPING, note=note)


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
