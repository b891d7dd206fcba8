"""The engine: the one owner of detector state, the same live and in replay.

It turns lines into samples (filling in the step of step-less lines from the
last progress it saw), hands every event to every enabled detector, and
returns the alerts. It does no I/O and reads no clock: the caller passes
``now``, from the wall clock when live, from the data when replaying.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sentinel.engine.blocks import BLOCK_MIN_LINES, BlockFeeder
from sentinel.engine.history import HISTORY_LEN, History
from sentinel.engine.hooks import RuleHooks
from sentinel.engine.position import UNCLOCKED, RunPosition
from sentinel.engine.ranks import RunSeries, rank_rules, with_rank
from sentinel.engine.routes import Routes
from sentinel.engine.samples import SampleFeeder
from sentinel.follow.gathering import LOOK_S
from sentinel.model.facts import Resumed, RunFacts
from sentinel.model.machine import GPU_JOB
from sentinel.model.records import Alert, Block, Line, Marks, Sample
from sentinel.parsing import LineParser
from sentinel.parsing.files import FileReader, reader_for
from sentinel.parsing.lines import BATCH_S, PART_S, UNKNOWN
from sentinel.rules import DETECTORS, BaseDetector

if TYPE_CHECKING:
    from sentinel.config import Settings

log = logging.getLogger(__name__)

__all__ = ["HISTORY_LEN", "Engine", "build_detectors"]

_UNSEEN = object()
#: Alerts whose history is kept for their diagnosis (``recent_for``), newest last.
RECENT_KEPT_ALERTS = 256
#: How long before it is handed on a line may have been read: the readers' gathering window
#: (``tail.batch_s``) and one look (``tail.look_s``). The bound of lines handed on without
#: ``Marks``.
READ_WINDOW_S = BATCH_S + LOOK_S


def _parts(marks: Marks, unknown: float) -> list[tuple[int, float]]:
    """``marks`` coarsened to parts of at least ``PART_S``, each with the earliest bound of
    the marks it takes in; a mark of lines of unknown age (``UNKNOWN``) bounds them by
    ``unknown``."""
    parts: list[tuple[int, float]] = []
    for index, written_after in marks:
        bound = written_after if written_after != UNKNOWN else unknown
        if not parts or bound - parts[-1][1] >= PART_S:
            parts.append((index, bound))
        elif bound < parts[-1][1]:
            parts[-1] = (parts[-1][0], bound)
    return parts


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
    for reports), the hooks every rule has, guarded (``RuleHooks``), and the sample
    and block paths (``SampleFeeder``, ``BlockFeeder``), which move the same parts.
    """

    def __init__(
        self,
        detectors: Sequence[BaseDetector],
        parser: LineParser,
        *,
        data_clock: bool = False,
        logging_steps: int | None = None,
        blocks: bool = True,
        read_window_s: float = READ_WINDOW_S,
    ) -> None:
        self.routes = Routes(detectors)
        for detector in self.routes.detectors:
            detector.facts = RunFacts()
        self.parser = parser
        self.position = RunPosition(data_clock=data_clock, logging_steps=logging_steps)
        self._hooks = RuleHooks(self.routes, self.position)
        self._history = History()
        #: Per alert a line raised (by ``id``, with the alert): what its diagnosis reads.
        self._recent_of: dict[int, tuple[Alert, dict[str, list[Sample]]]] = {}
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
            feed_rank_block=self._feed_rank_block,
            disable=self._hooks.disable,
        )
        self._samples = SampleFeeder(
            position=self.position,
            history=self._history,
            routes=self.routes,
            feed_rank=self._feed_rank,
            disable=self._hooks.disable,
        )
        self._facts = RunFacts()
        # Per source: the reader of a structured file (CSV, MLflow...), or None for a log.
        self._readers: dict[str, FileReader | None] = {}
        #: Each source's latest read (``feed_texts``'s ``now``).
        self._read_at: dict[str, float] = {}
        #: How long before it is handed on a line may have been read (``read_since``).
        self.read_window_s = read_window_s

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

    def feed_texts(
        self, source: str, texts: list[str], now: float, marks: Marks = ()
    ) -> list[Alert]:
        """Lines of one source read together at ``now``: what ``feed_text`` on each, in
        order, gives, and the alerts in that order. ``marks``: when they were written at
        the earliest (``Marks``); without, the previous read of ``source`` or the start of
        this read's window (``read_window_s``), if later, bounds them all.

        A run of JSON lines of one schema goes to the rules as columns (``Block``):
        each rule it concerns says whether it is uneventful for it, and if all say so
        each takes it in one call. Otherwise the block is halved, down to a few lines
        fed one by one, so the lines around an alert cost what they always did. HF
        Trainer output replayed before any timestamp goes the same way, its dicts as
        the block's lines and its progress bars beside them (``Block.progress``).
        """
        before = self._read_at.get(source)
        since = now - self.read_window_s
        since = since if before is None else max(before, since)
        self._read_at[source] = now
        if not marks:
            return self._feed_read(source, texts, now, since)
        # The marks say it, not the read before: a reader that gathers hands on at its
        # window's end, and what it read after that may have been written before it.
        parts = _parts(marks, since)
        alerts = self._feed_read(source, texts[: parts[0][0]], now, since) if parts[0][0] else []
        ends = [index for index, _ in parts[1:]]
        for (start, written_after), end in zip(parts, [*ends, len(texts)], strict=True):
            if end > start:
                alerts += self._feed_read(source, texts[start:end], now, written_after)
        return alerts

    def _feed_read(self, source: str, texts: list[str], now: float, since: float) -> list[Alert]:
        """``feed_texts`` for lines written after ``since``."""
        if not texts:
            return []
        position = self.position
        position.read_since = since
        parser = self.parser
        try:
            if (
                self.blocks
                and len(texts) >= BLOCK_MIN_LINES
                and (parser.reads_json_blocks or parser.reads_hf_blocks)
                and self._reader(source) is None
            ):
                return self._blocks.feed(source, texts, now)
            return self._blocks.feed_each(source, texts, now)
        finally:
            position.read_since = None

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
        What each alert's diagnosis reads is kept as it is now (``recent_for``).
        """
        alerts = self._feed_text(source, text, now)
        if alerts:
            self._keep_recent(alerts)
        return alerts

    def _keep_recent(self, alerts: list[Alert]) -> None:
        """Each alert's ``recent_at`` as the line that raised it left the history: by the
        time the caller reads it, the rest of a batch or of a replayed chunk has moved on
        (every incident of a replay drew the last values of its file)."""
        kept = self._recent_of
        for alert in alerts:
            if not alert.resolves:
                kept[id(alert)] = (alert, self.recent_at(alert.step, HISTORY_LEN))
        while len(kept) > RECENT_KEPT_ALERTS:
            del kept[next(iter(kept))]

    def written_after(self, step: int) -> float | None:
        """A time before which the run's ``step`` was not logged yet
        (``RunPosition.written_after``)."""
        return self.position.written_after(step)

    def logged_before(self, step: int) -> bool:
        """Whether this attempt logged a step before ``step`` (``RunPosition.logged_before``)."""
        return self.position.logged_before(step)

    def recent_for(self, alert: Alert, per_metric: int) -> dict[str, list[Sample]]:
        """What a diagnosis of ``alert`` reads: each metric's last ``per_metric`` samples up
        to its step, as they were when it was raised (``recent_at`` now, for an alert no
        line raised: a tick's, a rank's)."""
        found = self._recent_of.pop(id(alert), None)
        if found is None or found[0] is not alert:
            return self.recent_at(alert.step, per_metric)
        return {name: samples[-per_metric:] for name, samples in found[1].items()}

    def _feed_text(self, source: str, text: str, now: float) -> list[Alert]:
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
                    return alerts + self._samples.feed(samples, source, UNCLOCKED, rank)
                return alerts
            now = position.data_time
        found = self._hooks.output(text, source, now)
        if found:
            alerts += found
        if samples:
            found = self._samples.feed(samples, source, now, rank)
            if found:
                alerts += found
        return alerts

    def _advance_clock(self, new_time: float) -> list[Alert]:
        """Replay: move the clock to the line's own time before its samples are seen."""
        position = self.position
        if position.data_time is None:
            position.data_time = new_time
            self._hooks.each(lambda detector: detector.job_started(new_time), new_time)
            return []
        if new_time <= position.data_time:
            return []
        position.data_time = new_time
        return self.tick(new_time)

    def feed_system(self, source: str, samples: list[Sample], now: float) -> list[Alert]:
        """Samples of the GPU or process source (``sentinel.model.machine``), read at ``now``.

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
        return self._samples.feed(samples, source, now, rank)

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
        self._at_run_step(ranked)
        return with_rank(ranked.feed_samples(samples, source, now), rank)

    def _at_run_step(self, ranked: Engine) -> None:
        """A rank's engine is at least at the run's step: a step-less line of the rank (an
        HF dict) is at the run's step, as on rank 0."""
        run_step, own_step = self.position.current_step, ranked.position.current_step
        if run_step is not None and (own_step is None or own_step < run_step):
            ranked.position.current_step = run_step

    def _feed_rank_block(self, rank: int, block: Block) -> list[Alert] | None:
        """A block of rank ``rank``'s own file (above 0): what ``feed_text`` on each line
        gives, with that rank's rules taking the lines whole; None where they would not,
        or the rank's rules are not made yet (its first line makes them, one by one).

        The rules that watch the job see each line as ``feed_text`` shows it them: its
        tick, then its output; this engine's own series, step and history are untouched,
        as they are by a line of a rank above 0."""
        ranked = self._ranked.get(rank)
        series = self.series
        if ranked is None or series is None or not series.takes_rank_block(block, rank):
            return None
        # The rank's rules are shown samples only: no output, no tick.
        own = replace(block, output=False, ticks=False)
        concerned = ranked._blocks.accepting(own)
        if concerned is None:
            return None
        alerts = self._job_hooks(block)
        self._at_run_step(ranked)
        failed = ranked._blocks.absorb(own, concerned)
        if failed:
            alerts += with_rank(failed, rank)
        series.took_rank_block(block, rank)
        position = self.position
        position.count_lines(block.names, block.steps)
        if position.data_clock and block.start_clock is not None:
            position.data_time = block.clock[-1]
        return alerts

    def _job_hooks(self, block: Block) -> list[Alert]:
        """The tick and output hooks ``feed_text`` calls for each line of ``block``, one by
        one: few rules have them, and those watch the job, not a rank's series."""
        alerts: list[Alert] = []
        if not block.output:
            return alerts  # no clock yet: no tick, no output (see feed_text)
        hooks, ticks = self._hooks, block.ticks
        previous = block.start_clock
        for text, now in zip(block.texts, block.clock, strict=True):
            if ticks and previous is not None and now > previous:
                previous = now
                alerts += hooks.tick(now)
            alerts += hooks.output(text, block.source, now)
        return alerts

    def tick(self, now: float) -> list[Alert]:
        return self._hooks.tick(now)

    def job_started(self, now: float, start_step: int = 0, resumed: Resumed | None = None) -> None:
        """A new attempt: steps start again from its checkpoint, episodes are forgotten.
        ``resumed``: where it resumed after a rollback (``RunFacts.resumed``)."""
        self._facts.resumed = resumed
        for detector in self.routes.detectors:
            detector.facts.resumed = resumed
        self.position.restart(start_step)
        self._history.clear()
        if self.series is not None:
            self.series.restart()
        self._ranked.clear()
        self._hooks.each(lambda detector: detector.job_started(now), now)

    def job_exited(self, exit_code: int | None, now: float, *, expected: bool) -> list[Alert]:
        return self._hooks.each(
            lambda detector: detector.job_exited(exit_code, now, expected=expected), now
        )

    def log_ended(self, now: float, tail: Sequence[str]) -> list[Alert]:
        """A replayed log has no more lines, ``tail`` its last: what each rule makes of its
        end (its output hooks did not see the lines before the data's first timestamp)."""
        return self._hooks.each(lambda detector: detector.log_ended(now, tail), now)

    def memory(self, now: float) -> dict[str, Any]:
        """Per rule, what it keeps across restarts of sentinel (``BaseDetector.memory``)."""
        return self._hooks.memory(now)

    def remember(self, memory: dict[str, Any], *, same_job: bool) -> None:
        """Give each rule back its memory; one that cannot take it starts afresh (logged)."""
        self._hooks.remember(memory, same_job=same_job)

    def recent(self, before_step: int | None, per_metric: int = 8) -> dict[str, list[Sample]]:
        """The last samples of each metric up to ``before_step`` (inclusive), for reports."""
        return self._history.recent(before_step, per_metric)

    def recent_at(self, step: int | None, per_metric: int) -> dict[str, list[Sample]]:
        """What a diagnosis of an alert at ``step`` reads: each metric's last ``per_metric``
        samples up to it, the same whatever else the batch held; of a metric whose kept
        samples all came after it (a replayed block read far past the step), its last."""
        around = self._history.recent(step, per_metric)
        if step is not None:
            for name, samples in self._history.recent(None, per_metric).items():
                around.setdefault(name, samples)
        return around
