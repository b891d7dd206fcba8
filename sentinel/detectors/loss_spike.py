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

Replay's blocks (``can_absorb``) are taken whole when every line is in warmup, or
none is and no value of a calm metric can be a spike: at most ``factor`` x the least
value its baseline could hold by then, which bounds the median from below.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, model_validator

from sentinel.detectors.base import BaseDetector, MetricNames, MetricRuleConfig
from sentinel.detectors.series import (
    Rolling,
    Warmup,
    finite_values,
    finite_with_steps,
    never_above_multiple,
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
        if series is None or not math.isfinite(sample.value):
            return []
        series.recent.append((sample.step, sample.value))
        if self._warmup.active(sample.step) or not series.baseline.full:
            series.baseline.add(sample.value)
            return []
        baseline = series.baseline.median()
        time = sample.time if sample.time is not None else now
        if baseline > 0 and sample.value > self.settings.factor * baseline:
            return self._spike(series, baseline, sample, source, time)
        series.baseline.add(sample.value)
        return self._under(series, baseline, sample, source, time)

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """``observe`` per sample, inlined: one call a line rather than one a sample."""
        found: list[tuple[int, Alert]] = []
        warmup = self._warmup
        factor = self.settings.factor
        isfinite = math.isfinite
        for index, sample in enumerate(samples):
            name, value, step, stamp = sample
            if name == "lr" and warmup.lr_rising is not False:
                warmup.observe(sample)
            series = self._series.get(name)
            if series is None or not isfinite(value):
                continue
            series.recent.append((step, value))
            rolling = series.baseline
            if (warmup.lr_rising or (step is not None and step < warmup.warmup_steps)) or len(
                rolling.values
            ) < rolling.size:
                rolling.add(value)
                continue
            baseline = rolling.median()
            time = stamp if stamp is not None else now
            if baseline > 0 and value > factor * baseline:
                raised = self._spike(series, baseline, sample, source, time)
            else:
                rolling.add(value)
                if not series.offending:
                    continue
                raised = self._under(series, baseline, sample, source, time)
            for alert in raised:
                found.append((index, alert))
        return found

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
        factor = self.settings.factor
        for name in judged:
            series = self._series[name]
            if series.offending:
                return False  # a value under the bar counts towards the resolve
            values = finite_values(columns[name])
            baseline = series.baseline
            # The first values fill the window: not judged.
            filling = baseline.size - len(baseline)
            if not never_above_multiple(values, factor, baseline.least(), filling):
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
                    self._alert(settings.severity, message, sample, source, time, details)
                )
        run_length = len(series.run)
        if (
            run_length >= settings.sustain
            and not self._escalated
            and settings.sustain_severity > settings.severity
        ):
            self._escalated = True
            message = (
                f"{name} above {settings.factor * baseline:.4g} ({settings.factor:g}x its recent"
                f" median {baseline:.4g}) for {run_length} consecutive values since step"
                f" {series.run[0][0]} (now {sample.value:.4g} at step {sample.step})"
            )
            details = self._details("persistent", series, baseline, sample)
            alerts.append(
                self._alert(settings.sustain_severity, message, sample, source, time, details)
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
            f"{sample.name} above {self.settings.factor * baseline:.4g} for"
            f" {self.settings.window} values since step {run_start}: a level shift, not a"
            f" spike; baseline re-learned at {new_level:.4g}"
        )
        return [self._resolve(message, sample, source, time, details)]

    def _under(
        self, series: _Series, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        if not series.offending:
            return []
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
            f"{sample.name} back under {self.settings.factor * baseline:.4g} for"
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
            "threshold": self.settings.factor * baseline,
            "factor": self.settings.factor,
            "onset_step": self._onset_step,
            "run_length": len(series.run),
            "values": [value for _, value in recent],
            "steps": [step for step, _ in recent],
        }

    def _alert(
        self,
        severity: Severity,
        message: str,
        sample: Sample,
        source: str,
        time: float,
        details: dict[str, Any],
        *,
        resolves: bool = False,
    ) -> Alert:
        return self.sample_alert(
            sample,
            severity,
            message,
            time,
            source,
            onset_step=self._onset_step,
            resolves=resolves,
            details=details,
        )

    def _resolve(
        self, message: str, sample: Sample, source: str, time: float, details: dict[str, Any]
    ) -> Alert:
        alert = self._alert(Severity.INFO, message, sample, source, time, details, resolves=True)
        self._open = False
        self._escalated = False
        self._onset_step = None
        return alert
