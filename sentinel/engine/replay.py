"""``sentinel replay``: the live detectors over finished logs, to backtest thresholds.

The clock comes from the data: each line's own timestamp when it has one, so
time-based rules (stall, throughput) see the run's real gaps; a log without
timestamps is replayed in step order and time-based rules stay silent.

The result is a backtest table: per rule, whether it fired, its first step,
how many episodes, and for the warning rules their lead over the first
``nan_inf`` (how many steps of warning a kill would have had).

A run often writes its metrics twice (TensorBoard events and a CSV, a JSONL and
stdout). Read one file after the other, the rules would see step 300, then step 1
again. So when replay is given several files, each is read ahead to learn its steps
and times, and files whose steps overlap (by ``OVERLAP`` of the shorter one's span or
more) and whose times do not lie apart are one run: their lines are merged by step,
each file in its own order, at one step the files in name order; the engine takes
a metric seen twice at one step as one observation (``engine_ranks``). Files that do
not overlap (two attempts, two runs) are read one after the other, as given. One file,
or an MLflow run (merged already), is streamed.
"""

from __future__ import annotations

import heapq
import logging
import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count, groupby, repeat
from operator import itemgetter
from pathlib import Path

from sentinel.config import Settings
from sentinel.engine.core import Engine, build_detectors
from sentinel.evidence.diagnosis import DIAGNOSIS_SAMPLES, explain
from sentinel.follow.terminal_text import TerminalLines
from sentinel.model.incidents import IncidentTracker
from sentinel.model.records import PROGRESS, Alert, Severity
from sentinel.parsing import Garbled, LineParser
from sentinel.parsing.files import MetricsFile, ReplayPlan, iter_replay_batches, replay_plan
from sentinel.parsing.hf_trainer import read_trainer_state_entries, trainer_state_info
from sentinel.rules import DETECTORS, STORIES

log = logging.getLogger(__name__)

_DIGITS = re.compile(r"(\d+)")
#: Files are one run when their step ranges share at least this fraction of the shorter span.
OVERLAP = 0.5
#: The log's last lines kept for what its end says (``job_crash`` reads its ``tail_lines``
#: of them, 200 by default).
TAIL_LINES = 1_000


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
        # the failure the other rules' warnings lead up to (a NaN): each one's lead before it
        nan = next(
            (
                row
                for rule, row in table.items()
                if getattr(DETECTORS.get(rule), "failure_point", False)
            ),
            None,
        )
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
    parser = LineParser(
        regexes=settings.parsers.regexes, logging_steps=settings.parsers.logging_steps
    )
    engine = Engine(
        build_detectors(settings),
        parser,
        data_clock=True,
        logging_steps=settings.parsers.logging_steps,
    )
    engine.facts = settings.run_facts()
    tracker = IncidentTracker("replay", STORIES)
    result = ReplayResult()
    episodes: dict[str, bool] = {}  # rule -> in an episode

    def keep(alerts: list[Alert]) -> None:
        for alert in alerts:
            tracker.observe(alert)
            if not alert.resolves and alert.rule in tracker.open:
                explain(
                    tracker.open[alert.rule],
                    alert,
                    engine.recent_for(alert, DIAGNOSIS_SAMPLES),
                    samples_per_step=engine.facts.samples_per_step,
                    written_after=engine.written_after,
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
            parser.learn_trainer_state(text)  # each printed HF dict at its exact step
            states.append((path, text))
    logs = [path for path in paths if path.name != "trainer_state.json"]
    plan = replay_plan(logs)
    for group in plan:
        for file in group:
            engine.open_source(file.source, file.new_reader())
    feed_texts = engine.feed_texts
    # What a terminal received (``run``'s own output.log, a ``script`` capture) is read as
    # ``run`` read it live: escapes out, a redraw that says nothing new dropped.
    terminals: dict[str, TerminalLines] = {}
    # The last lines read, for what the log's end says (a traceback: likely a crash).
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    for source, texts in run_batches(plan, settings.parsers.regexes):
        cleaner = terminals.get(source)
        if cleaner is None and any("\x1b" in text for text in texts):
            cleaner = terminals[source] = TerminalLines()
        if cleaner is not None:
            texts = cleaner.clean(texts)
            if not texts:
                continue
        tail.extend(texts[-TAIL_LINES:])
        alerts = feed_texts(source, texts, 0.0)  # 0.0: the engine keeps the data's own clock
        if alerts:
            keep(alerts)
    for path, text in states:
        # Each entry is one logged record, as a line of the log is (a summary: none).
        for entry in read_trainer_state_entries(text):
            keep(engine.feed_samples(entry, str(path), engine.data_time or 0.0))
    keep(engine.log_ended(engine.data_time or 0.0, list(tail)))
    result.lines = parser.stats.lines
    result.garbled += parser.stats.garbled
    result.samples = engine.samples_seen
    result.incidents = len({id(incident) for incident in tracker.open.values()}) + len(
        tracker.closed
    )
    return result


@dataclass
class FileRead:
    """One file read ahead: its lines, each line's step (the last one named, for a line
    that names none; -1 before any), and the file's range of steps and times."""

    file: MetricsFile
    texts: list[str]
    keys: list[int]
    steps: tuple[int, int] | None = None
    times: tuple[float, float] | None = None


def read_ahead(file: MetricsFile, regexes: Sequence[str]) -> FileRead:
    """Every line of ``file`` with its step, read by a parser of its own (not the engine's)."""
    reader = file.new_reader()
    parse = LineParser(regexes=regexes).parse if reader is None else reader.parse
    read = FileRead(file, [], [])
    for _, lines in iter_replay_batches([[file]]):
        read.texts += lines
    key = -1
    steps: list[int] = []
    times: list[float] = []
    for text in read.texts:
        try:
            samples = parse(text) or ()
        except Garbled:
            samples = ()
        for sample in samples:
            if sample[3] is not None:
                times.append(sample[3])
            if sample[2] is not None and sample[0] != PROGRESS:
                key = sample[2]
                steps.append(key)
        read.keys.append(key)
    if steps:
        read.steps = (min(steps), max(steps))
    if times:
        read.times = (min(times), max(times))
    return read


def same_run(one: FileRead, other: FileRead) -> bool:
    """Whether two files are of one run: overlapping steps, times not apart."""
    if one.steps is None or other.steps is None:
        return False
    shared = min(one.steps[1], other.steps[1]) - max(one.steps[0], other.steps[0])
    shorter = min(one.steps[1] - one.steps[0], other.steps[1] - other.steps[0])
    if shared < 0 or shared < OVERLAP * shorter:
        return False
    if one.times is not None and other.times is not None:
        return one.times[0] <= other.times[1] and other.times[0] <= one.times[1]
    return True


def run_batches(plan: ReplayPlan, regexes: Sequence[str] = ()) -> Iterator[tuple[str, list[str]]]:
    """``iter_replay_batches(plan)``, the files of one run merged in step order."""
    if len(plan) < 2:
        yield from iter_replay_batches(plan)
        return
    runs: list[list[FileRead] | list[MetricsFile]] = []
    reads: list[list[FileRead]] = []
    for group in plan:
        if group[0].group is not None:
            runs.append(group)
            continue
        read = read_ahead(group[0], regexes)
        run = next((run for run in reads if any(same_run(read, other) for other in run)), None)
        if run is None:
            run = [read]
            reads.append(run)
            runs.append(run)
        else:
            run.append(read)
    for each in runs:
        if each and isinstance(each[0], MetricsFile):
            yield from iter_replay_batches(
                [[file for file in each if isinstance(file, MetricsFile)]]
            )
        else:
            yield from _merged([read for read in each if isinstance(read, FileRead)])


def _merged(reads: list[FileRead]) -> Iterator[tuple[str, list[str]]]:
    """The lines of a run's files by step, each file in its own order: a batch per stretch
    of one file's lines. At one step the files go in the order of their names (numbers by
    value), so ``metrics_rank0.jsonl`` comes before ``metrics_rank1.jsonl``."""
    by_name = sorted(reads, key=lambda read: _natural(str(read.file.path)))
    streams = [
        zip(read.keys, repeat(order), count(), repeat(read.file.source), read.texts)
        for order, read in enumerate(by_name)
    ]
    for source, lines in groupby(heapq.merge(*streams), key=itemgetter(3)):
        yield source, [line[4] for line in lines]


def _natural(name: str) -> tuple[tuple[int, str], ...]:
    """Sort key that orders the numbers in names by value: ``rank2`` before ``rank10``."""
    return tuple(
        (0, part) if index % 2 == 0 else (1, part.zfill(20))
        for index, part in enumerate(_DIGITS.split(name))
    )
