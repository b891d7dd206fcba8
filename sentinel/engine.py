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
from sentinel.facts import RunFacts
from sentinel.parsers import LineParser
from sentinel.parsers.files import FileReader, reader_for
from sentinel.records import PROGRESS, Alert, Line, Sample, Severity
from sentinel.sources import GPU_JOB

if TYPE_CHECKING:
    from sentinel.config import Settings

log = logging.getLogger(__name__)

#: Metrics that mark a line as a training log line (as opposed to an eval line).
TRAINING_LOG_METRICS = frozenset({"loss", "grad_norm", "lr"})

#: Samples of each metric kept for incident reports ("the last samples before onset").
HISTORY_LEN = 32


def build_detectors(settings: Settings) -> list[BaseDetector]:
    """One detector per enabled rule, in registry order."""
    detectors = []
    for rule, detector_class in DETECTORS.items():
        config = settings.rule(rule)
        if config.enabled:
            detectors.append(detector_class(config))
    return detectors


class Engine:
    """Feeds lines, samples, ticks and job events to the detectors; returns alerts."""

    def __init__(
        self,
        detectors: Sequence[BaseDetector],
        parser: LineParser,
        *,
        data_clock: bool = False,
        logging_steps: int | None = None,
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
        self._facts = RunFacts()
        # Per source: the reader of a structured file (CSV, MLflow...), or None for a log.
        self._readers: dict[str, FileReader | None] = {}
        # Per metric name: the detectors that watch it (see BaseDetector.watches).
        self._routes: dict[str, list[BaseDetector]] = {}
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

    def feed_text(self, source: str, text: str, now: float) -> list[Alert]:
        """``feed_line`` for a line read at ``now`` (ignored with the data's clock).

        The ``Line`` the rules see is made only when a rule watches output:
        replay feeds every line of a log through here.
        """
        if source in self._readers:
            reader = self._readers[source]
        else:
            reader = self._readers[source] = reader_for(source)
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
                alerts += self._advance_clock(samples)
            if self.data_time is None:
                # Before the data's first timestamp there is no clock: only the crash
                # classifier's tail of output and the metrics themselves matter.
                return alerts + self.feed_samples(samples, source, 0.0) if samples else alerts
            now = self.data_time
        watching = self._hooked("output")
        if watching:
            line = Line(source, text, now)
            for detector in watching:
                try:
                    found = detector.output(line)
                except Exception as error:
                    alerts.append(self._disable(detector, error, now))
                    continue
                if found:
                    alerts += found
        if samples:
            alerts += self.feed_samples(samples, source, now)
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
            else Sample(sample.name, sample.value, step, sample.time)
            for sample in samples
        ]

    def _advance_clock(self, samples: list[Sample]) -> list[Alert]:
        """Replay: move the clock to the line's own time before its samples are seen."""
        new_time: float | None = None
        for sample in samples:
            stamp = sample.time
            if stamp is not None and (new_time is None or stamp > new_time):
                new_time = stamp
        if new_time is None:
            return []
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
        """Samples from a parser or a structured reader (e.g. ``trainer_state.json``)."""
        alerts: list[Alert] = []
        for sample in samples:
            name = sample.name
            if sample.time is not None and not self.data_clock:
                self.data_time = sample.time
            step = sample.step
            if name == PROGRESS:
                # Forward only: an evaluation's own progress bar counts batches from 0 again.
                if step is not None and (self.current_step is None or step > self.current_step):
                    self.current_step = step
                    # A progress bar's new step is progress for the rules that measure it
                    # (stall): a job logging metrics every 500 steps still moves every step.
                    for detector in self._progress_watchers():
                        try:
                            found = detector.observe(sample, source, now)
                        except Exception as error:
                            alerts.append(self._disable(detector, error, now))
                            continue
                        if found:
                            alerts += found
                continue
            if step is None:
                sample = Sample(name, sample.value, self.current_step, sample.time)
            elif self.current_step is None or step > self.current_step:
                self.current_step = step
            self.samples_seen += 1
            history = self.history.get(name)
            if history is None:
                history = self.history[name] = deque(maxlen=HISTORY_LEN)
            history.append(sample)
            route = self._routes.get(name)
            if route is None:
                route = self._routes[name] = [
                    detector
                    for detector in self.detectors
                    if detector.watches is None or name in detector.watches
                ]
            # The hot loop of a replay: a plain loop, not _each's closure per detector.
            for detector in route:
                try:
                    found = detector.observe(sample, source, now)
                except Exception as error:
                    alerts.append(self._disable(detector, error, now))
                    continue
                if found:
                    alerts += found
        return alerts

    def tick(self, now: float) -> list[Alert]:
        detectors = self._hooked("tick")
        return self._each(lambda detector: detector.tick(now), now, detectors) if detectors else []

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

    def _progress_watchers(self) -> list[BaseDetector]:
        """The detectors shown progress-bar samples (``BaseDetector.sees_progress``)."""
        detectors = self._hooks.get(PROGRESS)
        if detectors is None:
            detectors = self._hooks[PROGRESS] = [d for d in self.detectors if d.sees_progress]
        return detectors

    def _hooked(self, hook: str) -> list[BaseDetector]:
        """The detectors whose ``hook`` does something (BaseDetector's own hooks do nothing).

        ``output`` and ``tick`` run once a line in a replay, and most rules have neither.
        """
        detectors = self._hooks.get(hook)
        if detectors is None:
            detectors = self._hooks[hook] = [
                detector for detector in self.detectors if _overrides(detector, hook)
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
