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
from typing import TYPE_CHECKING

from sentinel.detectors import DETECTORS, BaseDetector
from sentinel.engine_blocks import (
    BLOCK_MIN_LINES,
    HISTORY_LEN,
    ROUTES_MAX,
    TRAINING_LOG_METRICS,
    UNCLOCKED,
    BlockFeeding,
)
from sentinel.facts import RunFacts
from sentinel.parsers import LineParser
from sentinel.parsers.files import FileReader, reader_for
from sentinel.records import PROGRESS, Alert, Line, Sample, Severity
from sentinel.sources import GPU_JOB

if TYPE_CHECKING:
    from sentinel.config import Settings

log = logging.getLogger(__name__)

#: Hooks whose detectors also include those that override the faster variant.
_ALSO_HOOKED = {"output": ("output_text",)}
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


class Engine(BlockFeeding):
    """Feeds lines, samples, ticks and job events to the detectors; returns alerts."""

    def __init__(
        self,
        detectors: Sequence[BaseDetector],
        parser: LineParser,
        *,
        data_clock: bool = False,
        logging_steps: int | None = None,
        blocks: bool = True,
    ) -> None:
        self.detectors = list(detectors)
        for detector in self.detectors:
            detector.facts = RunFacts()
        #: Step-less training log lines are ``logging_steps`` apart (HF's printed dicts).
        self.logging_steps = logging_steps
        self.start_step = 0
        self._logged = 0
        #: Replay: time comes from the data's own timestamps, not from the caller.
        self.data_clock = data_clock
        self.parser = parser
        #: The newest step seen from any source: progress bars and stepped metrics.
        self.current_step: int | None = None
        #: The data's own newest timestamp (replay's clock).
        self.data_time: float | None = None
        self.history: dict[str, deque[Sample]] = {}
        self.samples_seen = 0
        #: Whether ``feed_texts`` may hand rules whole blocks (False: line by line, the
        #: reference the block path is tested against).
        self.blocks = blocks
        #: Lines the rules took as blocks rather than one by one.
        self.lines_absorbed = 0
        self._facts = RunFacts()
        # Per source: the reader of a structured file (CSV, MLflow...), or None for a log.
        self._readers: dict[str, FileReader | None] = {}
        # Per tuple of a line's sample names: the detectors shown that line (see
        # BaseDetector.watches and sees_progress).
        self._routes: dict[tuple[str, ...], list[tuple[BaseDetector, bool]]] = {}
        # Per (metric names, output seen, clock ticking, progress shown): the detectors a
        # block concerns.
        self._block_routes: dict[tuple[tuple[str, ...], bool, bool, bool], list[BaseDetector]] = {}
        # Per hook name (output, tick): the detectors that implement it (see _hooked).
        self._hooks: dict[str, list[BaseDetector]] = {}

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
            return self._feed_run(source, texts, now)
        return self._feed_each(source, texts, now)

    def _feed_each(self, source: str, texts: list[str], now: float) -> list[Alert]:
        alerts: list[Alert] = []
        feed_text = self.feed_text
        for text in texts:
            found = feed_text(source, text, now)
            if found:
                alerts += found
        return alerts

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
                self.facts.observe_line(text)
        else:
            samples = self.parser.parse_with(reader, text)
        if self.logging_steps is not None and samples:
            samples = self._count_step(samples)
        alerts: list[Alert] = []
        if self.data_clock:
            if samples:
                # The line's own time: the latest timestamp among its samples.
                new_time: float | None = None
                for sample in samples:
                    stamp = sample.time
                    if stamp is not None and (new_time is None or stamp > new_time):
                        new_time = stamp
                if new_time is not None:
                    alerts = self._advance_clock(new_time)
            if self.data_time is None:
                # Before the data's first timestamp there is no clock: only the crash
                # classifier's tail of output and the metrics themselves matter.
                if samples:
                    return alerts + self.feed_samples(samples, source, UNCLOCKED)
                return alerts
            now = self.data_time
        watching = self._hooks.get("output")
        if watching is None:
            watching = self._hooked("output")
        for detector in watching:
            try:
                found = detector.output_text(text, source, now)
            except Exception as error:
                alerts.append(self._disable(detector, error, now))
                continue
            if found:
                alerts += found
        if samples:
            found = self.feed_samples(samples, source, now)
            if found:
                alerts += found
        return alerts

    def _count_step(self, samples: list[Sample]) -> list[Sample]:
        """Give a step-less line the step its position implies: start + n x logging_steps."""
        assert self.logging_steps is not None
        has_metric = training = False
        for sample in samples:
            if sample.name != PROGRESS:
                if sample.step is not None:
                    return samples
                has_metric = True
                training = training or sample.name in TRAINING_LOG_METRICS
        if not has_metric:
            return samples
        if training:
            self._logged += 1  # an eval line belongs to the step last logged
        step = self.start_step + self._logged * self.logging_steps
        return [
            sample
            if sample.name == PROGRESS
            else _new_sample(Sample, (sample.name, sample.value, step, sample.time))
            for sample in samples
        ]

    def _advance_clock(self, new_time: float) -> list[Alert]:
        """Replay: move the clock to the line's own time before its samples are seen."""
        if self.data_time is None:
            self.data_time = new_time
            self._each(lambda detector: detector.job_started(new_time), new_time)
            return []
        if new_time <= self.data_time:
            return []
        self.data_time = new_time
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

    def feed_samples(self, samples: Iterable[Sample], source: str, now: float) -> list[Alert]:
        """Samples from a parser or a structured reader (e.g. ``trainer_state.json``).

        The samples of one call are one line's: each rule is shown them all at once
        (``BaseDetector.observe_samples``), and the alerts come back in the order of
        the samples that raised them, rules in registry order for the same sample:
        what calling ``observe`` sample by sample, rule by rule, would give.
        """
        shown: list[Sample] = []
        metrics = 0
        current = self.current_step
        history = self.history
        data_clock = self.data_clock
        for sample in samples:
            name, value, step, stamp = sample
            if stamp is not None and not data_clock:
                self.data_time = stamp
            if name == PROGRESS:
                # Forward only: an evaluation's own progress bar counts batches from 0 again.
                if step is not None and (current is None or step > current):
                    current = step
                    # A progress bar's new step is progress for the rules that measure it
                    # (stall): a job logging metrics every 500 steps still moves every step.
                    shown.append(sample)
                continue
            if step is None:
                sample = _new_sample(Sample, (name, value, current, stamp))
            elif current is None or step > current:
                current = step
            metrics += 1
            kept = history.get(name)
            if kept is None:
                kept = history[name] = deque(maxlen=HISTORY_LEN)
            kept.append(sample)
            shown.append(sample)
        self.current_step = current
        if not shown:
            return []
        self.samples_seen += metrics
        names = tuple([sample.name for sample in shown])
        route = self._routes.get(names)
        if route is None:
            route = self._route(names)
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
        return [alert for _, alert in found]

    def _route(self, names: tuple[str, ...]) -> list[tuple[BaseDetector, bool]]:
        """The detectors shown a line whose samples have these names, in registry order,
        each with whether the engine calls its ``observe`` sample by sample."""
        if len(self._routes) >= ROUTES_MAX:
            self._routes.clear()
        route = self._routes[names] = [
            (detector, not _overrides(detector, "observe_samples"))
            for detector in self.detectors
            if any(
                detector.sees_progress
                if name == PROGRESS
                else detector.watches is None or name in detector.watches
                for name in names
            )
        ]
        return route

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
        detectors = self._hooks.get("tick")
        if detectors is None:
            detectors = self._hooked("tick")
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
        self.start_step = start_step
        self._logged = 0
        self.current_step = None
        self.history.clear()
        self._each(lambda detector: detector.job_started(now), now)

    def job_exited(self, exit_code: int, now: float, *, expected: bool) -> list[Alert]:
        return self._each(
            lambda detector: detector.job_exited(exit_code, now, expected=expected), now
        )

    def recent(self, before_step: int | None, per_metric: int = 8) -> dict[str, list[Sample]]:
        """The last samples of each metric up to ``before_step`` (inclusive), for reports."""
        out: dict[str, list[Sample]] = {}
        for name, history in self.history.items():
            kept = [
                s for s in history if before_step is None or s.step is None or s.step <= before_step
            ]
            if kept:
                out[name] = kept[-per_metric:]
        return out

    def _hooked(self, hook: str) -> list[BaseDetector]:
        """The detectors whose ``hook`` does something (BaseDetector's own hooks do nothing).

        ``output`` and ``tick`` run once a line in a replay, and most rules have neither.
        A rule with its own ``output_text`` watches output as well.
        """
        detectors = self._hooks.get(hook)
        if detectors is None:
            also = _ALSO_HOOKED.get(hook, ())
            detectors = self._hooks[hook] = [
                detector
                for detector in self.detectors
                if _overrides(detector, hook) or any(_overrides(detector, h) for h in also)
            ]
        return detectors

    def _each(
        self,
        hook: Callable[[BaseDetector], list[Alert] | None],
        now: float,
        detectors: Sequence[BaseDetector] | None = None,
    ) -> list[Alert]:
        """Run one hook on every detector; a detector that raises is disabled, not fatal."""
        alerts: list[Alert] = []
        for detector in list(self.detectors if detectors is None else detectors):
            try:
                alerts += hook(detector) or []
            except Exception as error:
                alerts.append(self._disable(detector, error, now))
        return alerts

    def _disable(self, detector: BaseDetector, error: Exception, now: float) -> Alert:
        """Take a rule that raised out of the engine; the alert that says so."""
        log.exception("rule %s failed and is disabled", detector.rule)
        self.detectors.remove(detector)
        # Routes are rebuilt without it; a loop over an old route list finishes safely.
        self._routes.clear()
        self._block_routes.clear()
        self._hooks.clear()
        return Alert(
            rule="sentinel_internal",
            severity=Severity.WARNING,
            message=f"rule {detector.rule} failed and was disabled: {error!r}",
            time=now,
            source="sentinel",
            step=self.current_step,
        )


def _overrides(detector: BaseDetector, hook: str) -> bool:
    """Whether ``detector.hook`` is its own, not BaseDetector's do-nothing method."""
    method = getattr(detector, hook)
    return getattr(method, "__func__", None) is not getattr(BaseDetector, hook)
