"""``sentinel replay``: the live detectors over finished logs, to backtest thresholds.

The clock comes from the data: each line's own timestamp when it has one, so
time-based rules (stall, throughput) see the run's real gaps; a log without
timestamps is replayed in step order and time-based rules stay silent.

The result is a backtest table: per rule, whether it fired, its first step,
how many episodes, and for the warning rules their lead over the first
``nan_inf`` (how many steps of warning a kill would have had).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from sentinel.config import Settings
from sentinel.diagnosis import explain
from sentinel.engine import Engine, build_detectors
from sentinel.incidents import IncidentTracker
from sentinel.parsers import Garbled, LineParser
from sentinel.parsers.files import iter_replay_batches, replay_plan
from sentinel.parsers.hf_trainer import read_trainer_state, trainer_state_info
from sentinel.records import Alert, Severity

log = logging.getLogger(__name__)


@dataclass
class RuleSummary:
    """How one rule fared over the replayed data."""

    rule: str
    #: Alerts raised (resolutions not counted).
    count: int = 0
    #: Episodes: alerts that opened one (escalations and repeats are not new episodes).
    episodes: int = 0
    first_step: int | None = None
    first_time: float | None = None
    worst: Severity | None = None
    #: Steps from this rule's first alert to the first ``nan_inf`` (warning rules only).
    lead_steps: int | None = None
    lead_s: float | None = None


@dataclass
class ReplayResult:
    alerts: list[Alert] = field(default_factory=list)
    incidents: int = 0
    lines: int = 0
    garbled: int = 0
    samples: int = 0
    #: Alerts that opened an episode of their rule, by rule (an episode's first alert).
    _openers: list[Alert] = field(default_factory=list)

    def summary(self, rules: list[str]) -> list[RuleSummary]:
        table = {rule: RuleSummary(rule) for rule in rules}
        for alert in self.alerts:
            if alert.resolves:
                continue
            row = table.setdefault(alert.rule, RuleSummary(alert.rule))
            row.count += 1
            if row.first_step is None:
                row.first_step = alert.step
                row.first_time = alert.time
            if row.worst is None or alert.severity > row.worst:
                row.worst = alert.severity
        for alert in self._openers:
            table.setdefault(alert.rule, RuleSummary(alert.rule)).episodes += 1
        nan = table.get("nan_inf")
        if nan is not None and nan.first_step is not None:
            for row in table.values():
                if row is nan or row.first_step is None or row.first_step > nan.first_step:
                    continue
                row.lead_steps = nan.first_step - row.first_step
                if row.first_time and nan.first_time:
                    row.lead_s = nan.first_time - row.first_time
        return list(table.values())

    def worst(self) -> Severity | None:
        severities = [alert.severity for alert in self.alerts if not alert.resolves]
        return max(severities, key=lambda severity: severity.rank) if severities else None


def replay(paths: list[Path], settings: Settings) -> ReplayResult:
    """Run every enabled rule over the files, in order, as if they were being written."""
    parser = LineParser(regexes=settings.parsers.regexes)
    engine = Engine(
        build_detectors(settings),
        parser,
        data_clock=True,
        logging_steps=settings.parsers.logging_steps,
    )
    engine.facts = settings.run_facts()
    tracker = IncidentTracker("replay")
    result = ReplayResult()
    episodes: dict[str, bool] = {}  # rule -> in an episode

    def keep(alerts: list[Alert]) -> None:
        for alert in alerts:
            tracker.observe(alert)
            if not alert.resolves and alert.rule in tracker.open:
                explain(
                    tracker.open[alert.rule],
                    alert,
                    engine.recent(None),
                    samples_per_step=engine.facts.samples_per_step,
                )
            result.alerts.append(alert)
            if alert.resolves:
                episodes.pop(alert.rule, None)
            elif not episodes.get(alert.rule):
                episodes[alert.rule] = True
                result._openers.append(alert)

    states: list[tuple[Path, str]] = []
    for path in paths:
        if path.name == "trainer_state.json":
            text = path.read_text(encoding="utf-8")
            try:
                engine.facts.observe_trainer_state(
                    trainer_state_info(text),
                    accumulation_steps=settings.training.gradient_accumulation_steps,
                    world_size=settings.training.world_size,
                )
            except Garbled as error:
                log.warning("%s: %s (skipped)", path, error)
                result.garbled += 1
                continue
            states.append((path, text))
    logs = [path for path in paths if path.name != "trainer_state.json"]
    plan = replay_plan(logs)
    for group in plan:
        for file in group:
            engine.open_source(file.source, file.new_reader())
    feed_texts = engine.feed_texts
    for source, texts in iter_replay_batches(plan):
        alerts = feed_texts(source, texts, 0.0)  # 0.0: the engine keeps the data's own clock
        if alerts:
            keep(alerts)
    for path, text in states:
        samples = read_trainer_state(text)
        keep(engine.feed_samples(samples, str(path), engine.data_time or 0.0))
    result.lines = parser.stats.lines
    result.garbled += parser.stats.garbled
    result.samples = engine.samples_seen
    result.incidents = len({id(incident) for incident in tracker.open.values()}) + len(
        tracker.closed
    )
    return result
