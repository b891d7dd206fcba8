"""The engine: the one owner of detector state, the same live and in replay.

It turns lines into samples (filling in the step of step-less lines from the
last progress it saw), hands every event to every enabled detector, and
returns the alerts. It does no I/O and reads no clock: the caller passes
``now``, from the wall clock when live, from the data when replaying.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sentinel.detectors import DETECTORS, BaseDetector
from sentinel.engine_blocks import BLOCK_MIN_LINES, BlockFeeder
from sentinel.engine_history import HISTORY_LEN, History
from sentinel.engine_position import UNCLOCKED, RunPosition
from sentinel.engine_ranks import RunSeries, rank_rules, with_rank
from sentinel.engine_routes import Routes
from sentinel.facts import RunFacts
from sentinel.parsers import LineParser
from sentinel.parsers.files import FileReader, reader_for
from sentinel.records import PROGRESS, Alert, Line, Sample, Severity
from sentinel.sources import GPU_JOB

if TYPE_CHECKING:
    from sentinel.config import Settings

log = logging.getLogger(__name__)

__all__ = ["HISTORY_LEN", "Engine", "build_detectors"]

_UNSEEN = object()
_new_sample = tuple.__new__


def _position(found: tuple[int, Alert]) -> int:
    return found[0]


def build_detectors(settings: Settings) -> list[BaseDetector]:
    """One detector per enabled rule, in registry order."""
    detectors = []
    for rule, detector_class in DETECTORS.items():
        config = settings.rule(rule)
        if config.enabled:
            detectors.append(detector_class(config))
    return detectors


class Engine:
    """Feeds lines, samples, ticks and job events to the detectors; returns alerts.

    Its parts: ``routes`` (which rule sees what, and the rules still enabled),
    ``position`` (the run's step and the data's clock), ``history`` (the last samples
    for reports) and the block path (``BlockFeeder``), which moves the same parts.
    """

    def __init__(
        self,
        detectors: Sequence[BaseDetector],
        parser: LineParser,
        *,
        data_clock: bool = False,
        logging_steps: int | None = None,
        blocks: bool = True,
    ) -> None:
        self.routes = Routes(detectors)
        for detector in self.routes.detectors:
            detector.facts = RunFacts()
        self.parser = parser
        self.position = RunPosition(data_clock=data_clock, logging_steps=logging_steps)
        self._history = History()
        #: Each rank its own series, each observation once (``engine_ranks``); None in the
        #: engine of one rank's series (``_ranked``), whose lines were sorted already.
        self.series: RunSeries | None = RunSeries()
        # Per rank above 0: an engine of its own with the rules that judge a metric series.
        self._ranked: dict[int, Engine] = {}
        #: Whether ``feed_texts`` may hand rules whole blocks (False: line by line, the
        #: reference the block path is tested against).
        self.blocks = blocks
        self._blocks = BlockFeeder(
            parser=parser,
            position=self.position,
            history=self._history,
            routes=self.routes,
            series=self.series,
            feed_text=self.feed_text,
            disable=self._disable,
        )
        self._facts = RunFacts()
        # Per source: the reader of a structured file (CSV, MLflow...), or None for a log.
        self._readers: dict[str, FileReader | None] = {}

    @property
    def detectors(self) -> list[BaseDetector]:
        """The enabled rules, in registry order (a rule that raised is taken out)."""
        return self.routes.detectors

    @property
    def current_step(self) -> int | None:
        """The newest step seen from any source: progress bars and stepped metrics."""
        return self.position.current_step

    @property
    def data_time(self) -> float | None:
        """The data's own newest timestamp (replay's clock)."""
        return self.position.data_time

    @property
    def history(self) -> dict[str, deque[Sample]]:
        """The last samples of each metric (``HISTORY_LEN``)."""
        return self._history.by_metric

    @property
    def samples_seen(self) -> int:
        return self._history.samples_seen

    @property
    def lines_absorbed(self) -> int:
        """Lines the rules took as blocks rather than one by one."""
        return self._blocks.lines_absorbed

    @property
    def facts(self) -> RunFacts:
        """Batch size, total steps, GPUs and price, as the log states them (the owner seeds
        it from config). The detectors read the same object."""
        return self._facts

    @facts.setter
    def facts(self, facts: RunFacts) -> None:
        self._facts = facts
        for detector in self.detectors:
            detector.facts = facts

    def feed_line(self, line: Line) -> list[Alert]:
        """One line of output: parsed into samples, and shown to rules that watch output."""
        return self.feed_text(line.source, line.text, line.time)

    def feed_texts(self, source: str, texts: list[str], now: float) -> list[Alert]:
        """Lines of one source read together at ``now``: what ``feed_text`` on each, in
        order, gives, and the alerts in that order.

        A run of JSON lines of one schema goes to the rules as columns (``Block``):
        each rule it concerns says whether it is uneventful for it, and if all say so
        each takes it in one call. Otherwise the block is halved, down to a few lines
        fed one by one, so the lines around an alert cost what they always did. HF
        Trainer output replayed before any timestamp goes the same way, its dicts as
        the block's lines and its progress bars beside them (``Block.progress``).
        """
        parser = self.parser
        if (
            self.blocks
            and len(texts) >= BLOCK_MIN_LINES
            and (parser.reads_json_blocks or parser.reads_hf_blocks)
            and self._reader(source) is None
        ):
            return self._blocks.feed(source, texts, now)
        return self._blocks.feed_each(source, texts, now)

    def open_source(self, source: str, reader: FileReader | None) -> None:
        """Read the lines of ``source`` with ``reader`` (None: a plain log, line by line):
        the reader of the format its opener decided (replay's plan). A source not opened
        gets the reader its path implies (``reader_for``) on its first line."""
        self._readers[source] = reader

    def _reader(self, source: str) -> FileReader | None:
        readers = self._readers
        reader = readers.get(source, _UNSEEN)
        if reader is _UNSEEN:
            reader = readers[source] = reader_for(source)
        return reader  # type: ignore[return-value]

    def feed_text(self, source: str, text: str, now: float) -> list[Alert]:
        """``feed_line`` for a line read at ``now`` (ignored with the data's clock).

        The ``Line`` the rules see is made only when a rule watches output with
        ``output`` rather than ``output_text``: replay feeds every line of a log here.
        """
        reader = self._reader(source)
        if reader is None:
            samples = self.parser.parse(text)
            if not samples:
                self._facts.observe_line(text)
        else:
            samples = self.parser.parse_with(reader, text)
        rank = None
        if samples and self.series is not None:
            # Before steps are counted: only a line's own step tells ranks and copies apart.
            samples, rank = self.series.admit(samples, source)
        position = self.position
        if position.logging_steps is not None and samples:
            samples = position.count_step(samples)
        alerts: list[Alert] = []
        if position.data_clock:
            if samples:
                # The line's own time: the latest timestamp among its samples.
                new_time: float | None = None
                for sample in samples:
                    stamp = sample.time
                    if stamp is not None and (new_time is None or stamp > new_time):
                        new_time = stamp
                if new_time is not None:
                    alerts = self._advance_clock(new_time)
            if position.data_time is None:
                # Before the data's first timestamp there is no clock: only the crash
                # classifier's tail of output and the metrics themselves matter.
                if samples:
                    return alerts + self.feed_samples(samples, source, UNCLOCKED, rank=rank)
                return alerts
            now = position.data_time
        routes = self.routes
        watching = routes.hooks.get("output")
        if watching is None:
            watching = routes.hooked("output")
        for detector in watching:
            try:
                found = detector.output_text(text, source, now)
            except Exception as error:
                alerts.append(self._disable(detector, error, now))
                continue
            if found:
                alerts += found
        if samples:
            found = self.feed_samples(samples, source, now, rank=rank)
            if found:
                alerts += found
        return alerts

    def _advance_clock(self, new_time: float) -> list[Alert]:
        """Replay: move the clock to the line's own time before its samples are seen."""
        position = self.position
        if position.data_time is None:
            position.data_time = new_time
            self._each(lambda detector: detector.job_started(new_time), new_time)
            return []
        if new_time <= position.data_time:
            return []
        position.data_time = new_time
        return self.tick(new_time)

    def feed_system(self, source: str, samples: list[Sample], now: float) -> list[Alert]:
        """Samples of the GPU or process source (``sentinel.sources``), read at ``now``.

        A GPU's ``gpu_job`` sample updates the facts (which GPUs are the job's) before
        any rule sees the reading.
        """
        for sample in samples:
            if sample.name == GPU_JOB:
                self._facts.observe_gpu(source, sample.value >= 0.5)
        return self.feed_samples(samples, source, now)

    def feed_samples(
        self, samples: Iterable[Sample], source: str, now: float, *, rank: int | None = None
    ) -> list[Alert]:
        """Samples from a parser or a structured reader (e.g. ``trainer_state.json``).

        The samples of one call are one line's: each rule is shown them all at once
        (``BaseDetector.observe_samples``), and the alerts come back in the order of
        the samples that raised them, rules in registry order for the same sample:
        what calling ``observe`` sample by sample, rule by rule, would give.

        ``rank``: the line's (``RunSeries.admit``); above 0 the samples go to that rank's
        own rules. Alerts of a ranked line name the rank.
        """
        if rank:
            return self._feed_rank(rank, list(samples), source, now)
        shown: list[Sample] = []
        metrics = 0
        position = self.position
        current = position.current_step
        history = self._history.by_metric
        data_clock = position.data_clock
        for sample in samples:
            name, value, step, stamp = sample[:4]
            if stamp is not None and not data_clock:
                position.data_time = stamp
            if name == PROGRESS:
                # Forward only: an evaluation's own progress bar counts batches from 0 again.
                if step is not None and (current is None or step > current):
                    current = step
                    # A progress bar's new step is progress for the rules that measure it
                    # (stall): a job logging metrics every 500 steps still moves every step.
                    shown.append(sample)
                continue
            if step is None:
                sample = _new_sample(Sample, (name, value, current, stamp, None))
            elif current is None or step > current:
                current = step
            metrics += 1
            kept = history.get(name)
            if kept is None:
                kept = self._history.series(name)
            kept.append(sample)
            shown.append(sample)
        position.current_step = current
        if not shown:
            return []
        self._history.samples_seen += metrics
        names = tuple([sample.name for sample in shown])
        routes = self.routes
        route = routes.lines.get(names)
        if route is None:
            route = routes.line(names)
        found: list[tuple[int, Alert]] | None = None
        merged = False
        for detector, sample_by_sample in route:
            if sample_by_sample:
                raised = self._observe_each(detector, shown, source, now)
            else:
                try:
                    raised = detector.observe_samples(shown, source, now)
                except Exception as error:
                    raised = [(len(shown), self._disable(detector, error, now))]
            if raised:
                if found is None:
                    found = raised
                else:
                    found = found + raised
                    merged = True
        if found is None:
            return []
        if merged:
            # Sample order first; for one sample, the rules' order (a stable sort).
            found.sort(key=_position)
        alerts = [alert for _, alert in found]
        return alerts if rank is None else with_rank(alerts, rank)

    def _feed_rank(self, rank: int, samples: list[Sample], source: str, now: float) -> list[Alert]:
        """A line of rank ``rank`` (above 0), to that rank's own rules (``rank_rules``),
        made when the rank first logs."""
        ranked = self._ranked.get(rank)
        if ranked is None:
            ranked = self._ranked[rank] = Engine(
                rank_rules(self.detectors), self.parser, blocks=False
            )
            ranked.series = None
            ranked.facts = self._facts
            ranked.job_started(now, self.position.start_step)
        # A step-less line of the rank (an HF dict) is at the run's step, as on rank 0.
        run_step, own_step = self.position.current_step, ranked.position.current_step
        if run_step is not None and (own_step is None or own_step < run_step):
            ranked.position.current_step = run_step
        return with_rank(ranked.feed_samples(samples, source, now), rank)

    def _observe_each(
        self, detector: BaseDetector, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """A rule without its own ``observe_samples``: ``observe`` per sample it watches.

        A rule that raises is disabled at that sample, its earlier alerts kept.
        """
        found: list[tuple[int, Alert]] = []
        watches = detector.watches
        for index, sample in enumerate(samples):
            name = sample.name
            if name == PROGRESS:
                if not detector.sees_progress:
                    continue
            elif watches is not None and name not in watches:
                continue
            try:
                raised = detector.observe(sample, source, now)
            except Exception as error:
                found.append((index, self._disable(detector, error, now)))
                break
            if raised:
                found += [(index, alert) for alert in raised]
        return found

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
                alerts.append(self._disable(detector, error, now))
                continue
            if found:
                alerts += found
        return alerts

    def job_started(self, now: float, start_step: int = 0) -> None:
        """A new attempt: steps start again from its checkpoint, episodes are forgotten."""
        self.position.restart(start_step)
        self._history.clear()
        if self.series is not None:
            self.series.restart()
        self._ranked.clear()
        self._each(lambda detector: detector.job_started(now), now)

    def job_exited(self, exit_code: int, now: float, *, expected: bool) -> list[Alert]:
        return self._each(
            lambda detector: detector.job_exited(exit_code, now, expected=expected), now
        )

    def memory(self, now: float) -> dict[str, Any]:
        """Per rule, what it keeps across restarts of sentinel (``BaseDetector.memory``)."""
        kept: dict[str, Any] = {}
        for detector in self.detectors:
            memory = detector.memory(now)
            if memory is not None:
                kept[detector.rule] = memory
        return kept

    def remember(self, memory: dict[str, Any], *, same_job: bool) -> None:
        """Give each rule back its memory; one that cannot take it starts afresh (logged)."""
        for detector in self.detectors:
            if detector.rule in memory:
                try:
                    detector.remember(memory[detector.rule], same_job=same_job)
                except (KeyError, TypeError, ValueError) as error:
                    log.warning(
                        "rule %s starts afresh: its memory is unusable (%r)", detector.rule, error
                    )

    def recent(self, before_step: int | None, per_metric: int = 8) -> dict[str, list[Sample]]:
        """The last samples of each metric up to ``before_step`` (inclusive), for reports."""
        return self._history.recent(before_step, per_metric)

    def _each(
        self,
        hook: Callable[[BaseDetector], list[Alert] | None],
        now: float,
    ) -> list[Alert]:
        """Run one hook on every detector; a detector that raises is disabled, not fatal."""
        alerts: list[Alert] = []
        for detector in list(self.detectors):
            try:
                alerts += hook(detector) or []
            except Exception as error:
                alerts.append(self._disable(detector, error, now))
        return alerts

    def _disable(self, detector: BaseDetector, error: Exception, now: float) -> Alert:
        """Take a rule that raised out of the engine; the alert that says so."""
        log.exception("rule %s failed and is disabled", detector.rule)
        self.routes.remove(detector)
        return Alert(
            rule="sentinel_internal",
            severity=Severity.WARNING,
            message=f"rule {detector.rule} failed and was disabled: {error!r}",
            time=now,
            source="sentinel",
            step=self.position.current_step,
        )
