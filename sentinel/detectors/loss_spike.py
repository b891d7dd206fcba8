"""loss_spike: loss far above its recent level, even if it recovers.

A logged value is a spike when it is more than ``factor`` times the baseline: the
rolling median of the last ``window`` values that were not spikes themselves, so
one spike neither raises the bar for the next nor hides it; and more than
``noise_sigmas`` robust standard deviations above it, taken over the last
``noise_window`` non-spike values (``sentinel.detectors.noise``): a change smaller
than the run's own wobble, or than the swing of a rhythm that window holds, is no
spike whatever its ratio. Nothing is judged until the window is full, nor while
the baseline is <= 0 (a ratio to it means nothing). Non-finite values are
``nan_inf``'s business and are skipped.

During warmup the rule relaxes, it does not switch off: a value more than
``warmup_factor`` times the least the metric has been in this attempt (and above
its noise) warns once (``"warmup_growth"``), whatever the learning rate does.

One episode of the rule, shared by every watched metric:

- opens on the first spike (config ``severity``), ``details["kind"] = "spike"``;
- escalates once to ``sustain_severity`` when ``sustain`` consecutive logged
  values are spikes (``"persistent"``) and the evidence is more than one noisy
  signal: a value of the run beyond ``extreme_factor`` times the highest non-spike
  value in the noise window, or a spike of another metric (``corroborate``, the
  grad-norm by default) from ``sustain`` values before the onset on. Then the job is
  stopped and rolled back to before the episode's onset; else it stays a warning;
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
from functools import partial
from typing import Any

from sentinel.detectors.base import BaseDetector
from sentinel.detectors.loss_spike_config import (
    LossSpikeConfig,
    SpikeSeries,
    growth_bar,
    is_spike,
    spike_bar,
)
from sentinel.detectors.noise import above_noise, beyond_seen
from sentinel.detectors.series import (
    Warmup,
    finite_values,
    finite_with_steps,
    never_above,
)
from sentinel.records import Alert, Block, Sample, Severity


class LossSpikeDetector(BaseDetector):
    """Warns on a spike of the loss, escalates when it persists, resolves when it is over."""

    rule = "loss_spike"
    config_model = LossSpikeConfig

    def __init__(self, config: LossSpikeConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._judged = frozenset(config.metrics)
        self.watches = frozenset({*config.metrics, *config.corroborate, "lr"})
        self._warmup = Warmup(config.warmup_steps)
        self._series: dict[str, SpikeSeries] = {}
        self._onset_step: int | None = None
        #: Judged values seen in this attempt, and their count when the episode opened.
        self._count = 0
        self._onset_count = 0
        self._open = False
        self._escalated = False
        self._warmup_warned = False
        self.job_started(0.0)

    def job_started(self, now: float) -> None:
        settings = self.settings
        self._warmup.reset()
        names = dict.fromkeys([*settings.metrics, *settings.corroborate])
        self._series = {name: SpikeSeries(settings.window, settings.noise_window) for name in names}
        self._onset_step = None
        self._count = self._onset_count = 0
        self._open = False
        self._escalated = False
        self._warmup_warned = False

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

    def _judge(self, series: SpikeSeries, sample: Sample, source: str, now: float) -> list[Alert]:
        """One value of a watched metric: learned in warmup or while the window fills (a
        judged one checked for growth then), else judged against the baseline (``is_spike``
        and ``above_noise``) and learned unless it is a spike."""
        name, value, step, stamp = sample[:4]
        if not math.isfinite(value):
            return []
        judged = name in self._judged
        if judged:
            self._count += 1
        series.recent.append((step, value))
        rolling = series.baseline
        time = stamp if stamp is not None else now
        settings = self.settings
        if self._warmup.active(step) or not rolling.full:
            alerts = self._growth(series, sample, source, time) if judged else []
            series.learn(value)
            return alerts
        baseline = rolling.median()
        if is_spike(value, baseline, settings.factor) and above_noise(
            value, baseline, series.noise.values, settings.noise_sigmas, settings.noise_floor
        ):
            series.spiked_at = self._count
            series.least = min(series.least, value)
            return self._spike(series, baseline, sample, source, time) if judged else []
        series.learn(value)
        if not judged or not series.offending:
            return []
        return self._under(series, baseline, sample, source, time)

    def _growth(self, series: SpikeSeries, sample: Sample, source: str, time: float) -> list[Alert]:
        """Once an attempt: a value in warmup (or before the window is full) far above the
        least the metric has been, and above its noise."""
        least, value = series.least, sample.value
        settings = self.settings
        if self._warmup_warned or not least > 0 or value <= growth_bar(least, settings):
            return []
        if not above_noise(
            value, least, series.noise.values, settings.noise_sigmas, settings.noise_floor
        ):
            return []
        self._warmup_warned = True
        message = (
            f"{sample.name} {value:.4g} at step {sample.step} is {value / least:.3g}x the"
            f" lowest it has been ({least:.4g}) while the rule is still learning (warmup):"
            " the run is diverging"
        )
        recent = list(series.recent)[-settings.window :]
        details = {
            "kind": "warmup_growth",
            "metric": sample.name,
            "least": least,
            "factor": settings.warmup_factor,
            "ratio": round(value / least, 3),
            "onset_step": sample.step,
            "values": [value for _, value in recent],
            "steps": [step for step, _ in recent],
        }
        return [
            self.sample_alert(
                sample,
                severity=settings.severity,
                message=message,
                time=time,
                source=source,
                onset_step=sample.step,
                details=details,
            )
        ]

    def can_absorb(self, block: Block) -> bool:
        """Uneventful: no metric in an episode; no judged value past the growth bar of the
        least before it where it could be checked for growth; and, past warmup, no value of
        a watched metric above ``factor`` x the least of its window and the values before it."""
        columns = block.columns
        present = [name for name in self._series if name in columns]
        if not present:
            return True  # only learning rates
        phase = self._warmup.block_phase(block.step_range(), columns.get("lr"))
        if phase is None:
            return False
        bar = partial(spike_bar, factor=self.settings.factor)
        growth = partial(growth_bar, settings=self.settings)
        for name in present:
            series = self._series[name]
            if series.offending:
                return False  # a value under the bar counts towards the resolve
            values = finite_values(columns[name])
            baseline = series.baseline
            # The first values fill the window: not judged, only checked for growth.
            filling = len(values) if phase else baseline.size - len(baseline)
            checks_growth = name in self._judged and not self._warmup_warned
            if checks_growth and filling and not never_above(values, growth, series.least, 0):
                return False
            if not phase and not never_above(values, bar, baseline.least(), filling):
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
            if not values:
                continue
            if name in self._judged:
                self._count += len(values)
            kept = series.recent.maxlen or len(values)
            series.recent.extend(zip(steps[-kept:], values[-kept:], strict=True))
            series.baseline.extend(values)
            series.noise.extend(values)
            series.least = min(series.least, *values)

    def _spike(
        self, series: SpikeSeries, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        settings = self.settings
        name = sample.name
        series.calm = 0
        series.run.append((sample.step, sample.value))
        series.episode.append(sample.value)
        alerts: list[Alert] = []
        if not series.offending:
            series.offending = True
            if not self._open:
                self._open = True
                self._onset_step = sample.step
                self._onset_count = self._count
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
        evidence = None
        if (
            run_length >= settings.sustain
            and not self._escalated
            and settings.sustain_severity > settings.severity
        ):
            evidence = self._second_signal(series)
        if evidence is not None:
            self._escalated = True
            bar = spike_bar(baseline, settings.factor)
            message = (
                f"{name} above {bar:.4g} ({settings.factor:g}x its recent"
                f" median {baseline:.4g}) for {run_length} consecutive values since step"
                f" {series.run[0][0]} (now {sample.value:.4g} at step {sample.step}), {evidence}"
            )
            details = self._details("persistent", series, baseline, sample)
            details["evidence"] = evidence
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

    def _second_signal(self, series: SpikeSeries) -> str | None:
        """What makes a persistent run more than one noisy signal, or None: a value far
        beyond anything the run has shown, or a spike of another watched metric since
        ``sustain`` judged values before the onset."""
        settings = self.settings
        highest = max(value for _, value in series.run)
        if beyond_seen(highest, series.noise.values, settings.extreme_factor):
            return f"far beyond anything the run has shown ({max(series.noise.values):.4g})"
        since = self._onset_count - settings.sustain
        for name, other in self._series.items():
            if other is not series and other.spiked_at is not None and other.spiked_at >= since:
                return f"and {name} spiked with it"
        return None

    def _level_shift(
        self, series: SpikeSeries, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        """A whole window above the bar is a new level: learn it; this metric's part is over."""
        details = self._details("level_shift", series, baseline, sample)
        run_start = series.run[0][0]
        series.baseline.clear()
        for _, value in series.run:
            series.baseline.add(value)
        series.noise.extend(series.episode)
        series.episode.clear()
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
        self, series: SpikeSeries, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        """A value under the bar of a metric that keeps the episode open."""
        series.run.clear()
        series.calm += 1
        if series.calm < self.settings.resolve_after:
            return []
        series.offending = False
        series.calm = 0
        # Spikes the run came back from are part of its wobble (a rhythm's peaks).
        series.noise.extend(series.episode)
        series.episode.clear()
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
        self, kind: str, series: SpikeSeries, baseline: float, sample: Sample
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
