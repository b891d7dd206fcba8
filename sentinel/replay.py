"""``sentinel replay``: the live detectors over finished logs, to backtest thresholds.

The clock comes from the data: each line's own timestamp when it has one, so
time-based rules (stall) see the run's real gaps; a log without timestamps
is replayed in step order and time-based rules stay silent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sentinel.config import Settings
from sentinel.engine import Engine, build_detectors
from sentinel.incidents import IncidentTracker
from sentinel.parsers import LineParser
from sentinel.parsers.hf_trainer import read_trainer_state
from sentinel.records import Alert, Line, Severity
from sentinel.sources.lines import LineSplitter

_CHUNK = 1 << 20


@dataclass
class RuleSummary:
    """How one rule fared over the replayed data."""

    rule: str
    count: int = 0
    first_step: int | None = None
    worst: Severity | None = None


@dataclass
class ReplayResult:
    alerts: list[Alert] = field(default_factory=list)
    incidents: int = 0
    lines: int = 0
    garbled: int = 0
    samples: int = 0

    def summary(self, rules: list[str]) -> list[RuleSummary]:
        table = {rule: RuleSummary(rule) for rule in rules}
        for alert in self.alerts:
            if alert.resolves:
                continue
            row = table.setdefault(alert.rule, RuleSummary(alert.rule))
            row.count += 1
            if row.first_step is None:
                row.first_step = alert.step
            if row.worst is None or alert.severity > row.worst:
                row.worst = alert.severity
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
    tracker = IncidentTracker("replay")
    result = ReplayResult()

    def keep(alerts: list[Alert]) -> None:
        for alert in alerts:
            result.alerts.append(alert)
            tracker.observe(alert)

    for path in paths:
        source = str(path)
        if path.name == "trainer_state.json":
            samples = read_trainer_state(path.read_text(encoding="utf-8"))
            keep(engine.feed_samples(samples, source, engine.data_time or 0.0))
            continue
        for text in _lines(path):
            keep(engine.feed_line(Line(source, text, 0.0)))
    result.lines = parser.stats.lines
    result.garbled = parser.stats.garbled
    result.samples = engine.samples_seen
    result.incidents = len(tracker.open) + len(tracker.closed)
    return result


def _lines(path: Path) -> Iterator[str]:
    splitter = LineSplitter()
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            yield from splitter.feed(chunk)
    yield from splitter.flush()
