"""The hooks every rule has (the clock's tick, the job's start and exit, its memory),
called on every enabled rule, each call guarded.

A rule that raises is taken out of the engine (``disable``) with an alert that says
so; the other rules go on. The engine's line, sample and block paths take rules out
the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sentinel.engine.position import RunPosition
from sentinel.engine.routes import Routes
from sentinel.model.records import SENTINEL_SOURCE, Alert, Severity
from sentinel.rules import BaseDetector

log = logging.getLogger(__name__)


class RuleHooks:
    """Calls a hook on the enabled rules (``routes``); takes out a rule that raises."""

    __slots__ = ("position", "routes")

    def __init__(self, routes: Routes, position: RunPosition) -> None:
        self.routes = routes
        #: For the step of the alert that says a rule was taken out.
        self.position = position

    def tick(self, now: float) -> list[Alert]:
        routes = self.routes
        detectors = routes.hooks.get("tick")
        if detectors is None:
            detectors = routes.hooked("tick")
        alerts: list[Alert] = []
        for detector in detectors:
            try:
                found = detector.tick(now)
            except Exception as error:
                alerts.append(self.disable(detector, error, now))
                continue
            if found:
                alerts += found
        return alerts

    def output(self, text: str, source: str, now: float) -> list[Alert]:
        """A line of output to the rules that watch it (``output_text``)."""
        routes = self.routes
        detectors = routes.hooks.get("output")
        if detectors is None:
            detectors = routes.hooked("output")
        alerts: list[Alert] = []
        for detector in detectors:
            try:
                found = detector.output_text(text, source, now)
            except Exception as error:
                alerts.append(self.disable(detector, error, now))
                continue
            if found:
                alerts += found
        return alerts

    def memory(self, now: float) -> dict[str, Any]:
        """Per rule, what it keeps across restarts of sentinel (``BaseDetector.memory``)."""
        kept: dict[str, Any] = {}
        for detector in self.routes.detectors:
            memory = detector.memory(now)
            if memory is not None:
                kept[detector.rule] = memory
        return kept

    def remember(self, memory: dict[str, Any], *, same_job: bool) -> None:
        """Give each rule back its memory; one that cannot take it starts afresh (logged)."""
        for detector in self.routes.detectors:
            if detector.rule in memory:
                try:
                    detector.remember(memory[detector.rule], same_job=same_job)
                except (KeyError, TypeError, ValueError) as error:
                    log.warning(
                        "rule %s starts afresh: its memory is unusable (%r)", detector.rule, error
                    )

    def each(
        self,
        hook: Callable[[BaseDetector], list[Alert] | None],
        now: float,
    ) -> list[Alert]:
        """Run one hook on every detector; a detector that raises is disabled, not fatal."""
        alerts: list[Alert] = []
        for detector in list(self.routes.detectors):
            try:
                alerts += hook(detector) or []
            except Exception as error:
                alerts.append(self.disable(detector, error, now))
        return alerts

    def disable(self, detector: BaseDetector, error: Exception, now: float) -> Alert:
        """Take a rule that raised out of the engine; the alert that says so."""
        log.exception("rule %s failed and is disabled", detector.rule)
        self.routes.remove(detector)
        return Alert(
            rule="sentinel_internal",
            severity=Severity.WARNING,
            message=f"rule {detector.rule} failed and was disabled: {error!r}",
            time=now,
            source=SENTINEL_SOURCE,
            step=self.position.current_step,
        )
