"""loss_spike: loss far above its recent level, even if it recovers.

A logged value is a spike when it is more than ``factor`` times the baseline: the
rolling median of the last ``window`` values that were not spikes themselves, so
one spike neither raises the bar for the next nor hides it. Nothing is judged
until that window is full, nor during warmup (the rule only learns then), nor
while the baseline is <= 0 (a ratio to it means nothing). Non-finite values are
``nan_inf``'s business and are skipped.

One episode of the rule, shared by every watched metric:

- opens on the first spike (config ``severity``), ``details["kind"] = "spike"``;
- escalates once to ``sustain_severity`` when ``sustain`` consecutive logged
  values are spikes (``"persistent"``): not a blip, so the job is stopped and
  rolled back to before the episode's onset;
- resolves after ``resolve_after`` consecutive values under the bar (``"recovered"``),
  so two spikes further apart than that are two episodes;
- resolves as well when a metric stays above the bar for a whole ``window``
  (``"level_shift"``): that is a new level, not a spike, and the baseline is
  re-learned from it.

``details`` holds ``kind``, ``metric``, ``baseline`` (the median), ``threshold``
(the bar), ``factor``, ``onset_step``, ``run_length`` (consecutive spikes so far)
and ``values``/``steps``: the last ``window`` finite values before the current run
of spikes and the run itself, in order; plus ``ratio`` (value / baseline) when the
episode opens and ``new_baseline`` on a level shift.

The decision is ``is_spike``, once: ``observe`` judges each value with it, and
replay's blocks (``can_absorb``) are taken whole when every line is in warmup, or none
is and no value of a calm metric can be a spike: at most ``spike_bar`` of the least
value its baseline could hold by then, which bounds the median from below (the bar
only rises with the baseline).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar

from pydantic import Field, model_validator

from sentinel.detectors.base import BaseDetector, MetricNames, MetricRuleConfig
from sentinel.detectors.series import (
    Rolling,
    Warmup,
    finite_values,
    finite_with_steps,
    never_above,
)
from sentinel.records import Alert, Block, Sample, Severity


class LossSpikeConfig(MetricRuleConfig):
    """``[rules.loss_spike]``.

    The defaults follow Lightning's ``SpikeDetection`` callback (a value over 2x the
    mean of the last 10 is a spike; the median here, so one spike does not raise the
    bar) and llm-foundry's ``KillLossSpike`` (act once a spike persists for 4 steps).
    """

    renamed: ClassVar[Mapping[str, str]] = {
        "persist_steps": "sustain",
        "persist_severity": "sustain_severity",
    }

    #: Metrics judged, each against its own baseline; they share one episode.
    metrics: MetricNames = Field(default_factory=lambda: ["loss"], min_length=1)
    #: Non-spike values whose median is the baseline; judging starts once it is full.
    window: int = Field(default=10, ge=3, le=10_000)
    #: A value above ``factor`` x the baseline is a spike.
    factor: float = Field(default=2.0, gt=1.0)
    #: Consecutive logged spikes that escalate the episode to ``sustain_severity``.
    sustain: int = Field(default=4, ge=1)
    #: Severity of that escalation (critical: stop, roll back before the onset).
    sustain_severity: Severity = Severity.CRITICAL
    #: Consecutive values under the bar that end the episode.
    resolve_after: int = Field(default=3, ge=1)

    @model_validator(mode="after")
    def _coherent(self) -> LossSpikeConfig:
        if self.sustain >= self.window:
            raise ValueError("sustain must be less than window (a longer run is a level shift)")
        if self.sustain_severity < self.severity:
            raise ValueError("sustain_severity must not be lower than severity")
        return self


def spike_bar(baseline: float, factor: float) -> float:
    """The value above which a sample is a spike against ``baseline``: ``factor`` x it.

    Rises with ``baseline`` (``factor`` > 1): a value at most the bar of the least value
    a median can be is no spike against that median.
    """
    return factor * baseline


def is_spike(value: float, baseline: float, factor: float) -> bool:
    """Whether ``value`` is a spike against the median ``baseline``: above its bar, with a
    baseline above 0 (a ratio to a level <= 0 means nothing)."""
    return baseline > 0 and value > spike_bar(baseline, factor)


class _Series:
    """One metric's baseline and its current run of spikes."""

    __slots__ = ("baseline", "calm", "offending", "recent", "run")

    def __init__(self, window: int) -> None:
        self.baseline = Rolling(window)
        #: Every finite value seen lately, spikes included: the evidence in ``details``.
        self.recent: deque[tuple[int | None, float]] = deque(maxlen=2 * window)
        #: The consecutive spikes up to now, as (step, value).
        self.run: list[tuple[int | None, float]] = []
        #: Consecutive values under the bar since this metric's last spike.
        self.calm = 0
        #: Whether this metric keeps the episode open.
        self.offending = False


class LossSpikeDetector(BaseDetector):
    """Warns on a spike of the loss, escalates when it persists, resolves when it is over."""

    rule = "loss_spike"
    config_model = LossSpikeConfig

    def __init__(self, config: LossSpikeConfig) -> None:
        super().__init__(config)
        self.settings = config
        self.watches = frozenset({*config.metrics, "lr"})
        self._warmup = Warmup(config.warmup_steps)
        self._series: dict[str, _Series] = {}
        self._onset_step: int | None = None
        self._open = False
        self._escalated = False
        self.job_started(0.0)

    def job_started(self, now: float) -> None:
        self._warmup.reset()
        self._series = {name: _Series(self.settings.window) for name in self.settings.metrics}
        self._onset_step = None
        self._open = False
        self._escalated = False

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        if sample.name == "lr":
            self._warmup.observe(sample)
        series = self._series.get(sample.name)
        if series is None:
            return []
        return self._judge(series, sample, source, now)

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """``observe`` on each sample of a line, in one call: the same ``_judge`` per value."""
        found: list[tuple[int, Alert]] = []
        warmup = self._warmup
        by_name = self._series
        for index, sample in enumerate(samples):
            name = sample.name
            if name == "lr":
                warmup.observe(sample)
            series = by_name.get(name)
            if series is not None:
                for alert in self._judge(series, sample, source, now):
                    found.append((index, alert))
        return found

    def _judge(self, series: _Series, sample: Sample, source: str, now: float) -> list[Alert]:
        """One value of a judged metric: learned in warmup or while the window fills, else
        judged against the baseline (``is_spike``) and learned unless it is a spike."""
        _, value, step, stamp = sample[:4]
        if not math.isfinite(value):
            return []
        series.recent.append((step, value))
        rolling = series.baseline
        if self._warmup.active(step) or not rolling.full:
            rolling.add(value)
            return []
        baseline = rolling.median()
        time = stamp if stamp is not None else now
        if is_spike(value, baseline, self.settings.factor):
            return self._spike(series, baseline, sample, source, time)
        rolling.add(value)
        if not series.offending:
            return []
        return self._under(series, baseline, sample, source, time)

    def can_absorb(self, block: Block) -> bool:
        """Uneventful: every line in warmup, or no metric in an episode and no value of a
        judged one above ``factor`` x the least of its window and the values before it."""
        columns = block.columns
        judged = [name for name in self._series if name in columns]
        if not judged:
            return True  # only learning rates
        phase = self._warmup.block_phase(block.step_range(), columns.get("lr"))
        if phase is None:
            return False
        if phase:
            return True  # in warmup every value is only learned
        bar = partial(spike_bar, factor=self.settings.factor)
        for name in judged:
            series = self._series[name]
            if series.offending:
                return False  # a value under the bar counts towards the resolve
            values = finite_values(columns[name])
            baseline = series.baseline
            # The first values fill the window: not judged.
            filling = baseline.size - len(baseline)
            if not never_above(values, bar, baseline.least(), filling):
                return False
        return True

    def absorb(self, block: Block) -> None:
        """What ``observe`` does with values that are no spike: keep them, learn them."""
        columns = block.columns
        self._warmup.extend(columns.get("lr"))
        for name, series in self._series.items():
            column = columns.get(name)
            if column is None:
                continue
            values, steps = finite_with_steps(column, block.steps)
            kept = series.recent.maxlen or len(values)
            series.recent.extend(zip(steps[-kept:], values[-kept:], strict=True))
            series.baseline.extend(values)

    def _spike(
        self, series: _Series, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        settings = self.settings
        name = sample.name
        series.calm = 0
        series.run.append((sample.step, sample.value))
        alerts: list[Alert] = []
        if not series.offending:
            series.offending = True
            if not self._open:
                self._open = True
                self._onset_step = sample.step
                ratio = sample.value / baseline
                message = (
                    f"{name} {sample.value:.4g} at step {sample.step}"
                    f" is {ratio:.1f}x its recent median {baseline:.4g}"
                )
                details = self._details("spike", series, baseline, sample)
                details["ratio"] = round(ratio, 3)
                alerts.append(
                    self.sample_alert(
                        sample,
                        severity=settings.severity,
                        message=message,
                        time=time,
                        source=source,
                        onset_step=self._onset_step,
                        details=details,
                    )
                )
        run_length = len(series.run)
        if (
            run_length >= settings.sustain
            and not self._escalated
            and settings.sustain_severity > settings.severity
        ):
            self._escalated = True
            bar = spike_bar(baseline, settings.factor)
            message = (
                f"{name} above {bar:.4g} ({settings.factor:g}x its recent"
                f" median {baseline:.4g}) for {run_length} consecutive values since step"
                f" {series.run[0][0]} (now {sample.value:.4g} at step {sample.step})"
            )
            details = self._details("persistent", series, baseline, sample)
            alerts.append(
                self.sample_alert(
                    sample,
                    severity=settings.sustain_severity,
                    message=message,
                    time=time,
                    source=source,
                    onset_step=self._onset_step,
                    details=details,
                )
            )
        if run_length >= settings.window:
            alerts += self._level_shift(series, baseline, sample, source, time)
        return alerts

    def _level_shift(
        self, series: _Series, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        """A whole window above the bar is a new level: learn it; this metric's part is over."""
        details = self._details("level_shift", series, baseline, sample)
        run_start = series.run[0][0]
        series.baseline.clear()
        for _, value in series.run:
            series.baseline.add(value)
        series.run.clear()
        series.offending = False
        if self._still_offending():
            return []
        new_level = series.baseline.median()
        details["new_baseline"] = new_level
        message = (
            f"{sample.name} above {spike_bar(baseline, self.settings.factor):.4g} for"
            f" {self.settings.window} values since step {run_start}: a level shift, not a"
            f" spike; baseline re-learned at {new_level:.4g}"
        )
        return [self._resolve(message, sample, source, time, details)]

    def _under(
        self, series: _Series, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        """A value under the bar of a metric that keeps the episode open."""
        series.run.clear()
        series.calm += 1
        if series.calm < self.settings.resolve_after:
            return []
        series.offending = False
        series.calm = 0
        if self._still_offending():
            return []
        details = self._details("recovered", series, baseline, sample)
        message = (
            f"{sample.name} back under {spike_bar(baseline, self.settings.factor):.4g} for"
            f" {self.settings.resolve_after} values (last {sample.value:.4g} at step"
            f" {sample.step})"
        )
        return [self._resolve(message, sample, source, time, details)]

    def _still_offending(self) -> bool:
        return any(series.offending for series in self._series.values())

    def _details(
        self, kind: str, series: _Series, baseline: float, sample: Sample
    ) -> dict[str, Any]:
        window = self.settings.window
        recent = list(series.recent)[-(window + len(series.run)) :]
        return {
            "kind": kind,
            "metric": sample.name,
            "baseline": baseline,
            "threshold": spike_bar(baseline, self.settings.factor),
            "factor": self.settings.factor,
            "onset_step": self._onset_step,
            "run_length": len(series.run),
            "values": [value for _, value in recent],
            "steps": [step for step, _ in recent],
        }

    def _resolve(
        self, message: str, sample: Sample, source: str, time: float, details: dict[str, Any]
    ) -> Alert:
        alert = self.sample_alert(
            sample,
            severity=Severity.INFO,
            message=message,
            time=time,
            source=source,
            onset_step=self._onset_step,
            resolves=True,
            details=details,
        )
        self._open = False
        self._escalated = False
        self._onset_step = None
        return alert
