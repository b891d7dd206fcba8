"""loss_spike: loss far above its recent level, even if it recovers.

A logged value is a spike when it is more than ``factor`` times the baseline: the
rolling median of the last ``window`` values that were not spikes themselves, so
one spike neither raises the bar for the next nor hides it; and more than
``noise_sigmas`` robust standard deviations above it, taken over the last
``noise_window`` non-spike values (``sentinel.rules.noise``): a change smaller
than the run's own wobble, or than the swing of a rhythm that window holds, is no
spike whatever its ratio; until that noise window is full (a first epoch has no
earlier one to compare with) a spike must be ``extreme_factor`` times as many
deviations above it. Nothing is judged until the baseline's window is full, nor while
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
  value in the noise window, a spike of another metric (``corroborate``, the
  grad-norm by default) from ``sustain`` values before the onset on, or the eval loss
  risen at an evaluation since the onset (``eval_signal``). Then the job is
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

The decision is written once, in ``loss_spike_config``: ``observe`` judges each value
with ``spikes`` (or ``grows`` in warmup), and replay's blocks (``can_absorb``) are taken
whole when every line is in warmup, or none is and no value of a calm metric can be a
spike (``never_spikes``: at most ``spike_bar`` of the least value its baseline could hold
by then, which bounds the median from below; the bar only rises with the baseline).
What the episode says is ``loss_spike_episode``'s.
"""

from __future__ import annotations

import math

from sentinel.model.records import Alert, Block, Sample
from sentinel.rules.base import BaseDetector
from sentinel.rules.eval_signal import EVAL_METRIC
from sentinel.rules.loss_spike_config import (
    LossSpikeConfig,
    SpikeSeries,
    grows,
    never_grows,
    never_spikes,
    spikes,
)
from sentinel.rules.loss_spike_episode import SpikeEpisode
from sentinel.rules.series import Warmup, finite_values, finite_with_steps

__all__ = ["LossSpikeConfig", "LossSpikeDetector"]


class LossSpikeDetector(BaseDetector):
    """Warns on a spike of the loss, escalates when it persists, resolves when it is over."""

    rule = "loss_spike"
    config_model = LossSpikeConfig

    def __init__(self, config: LossSpikeConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._judged = frozenset(config.metrics)
        self.watches = frozenset({*config.metrics, *config.corroborate, EVAL_METRIC, "lr"})
        self._warmup = Warmup(config.warmup_steps)
        self._series: dict[str, SpikeSeries] = {}
        self._episode = SpikeEpisode(config, self.sample_alert)
        #: Judged values seen in this attempt.
        self._count = 0
        self._warmup_warned = False
        self.job_started(0.0)

    def job_started(self, now: float) -> None:
        settings = self.settings
        self._warmup.reset()
        names = dict.fromkeys([*settings.metrics, *settings.corroborate])
        self._series = {name: SpikeSeries(settings.window, settings.noise_window) for name in names}
        self._episode.reset(self._series)
        self._count = 0
        self._warmup_warned = False

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        if sample.name == "lr":
            self._warmup.observe(sample)
        elif sample.name == EVAL_METRIC:
            self._episode.evals.observe(sample.step, sample.value)
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
            elif name == EVAL_METRIC:
                self._episode.evals.observe(sample.step, sample.value)
            series = by_name.get(name)
            if series is not None:
                for alert in self._judge(series, sample, source, now):
                    found.append((index, alert))
        return found

    def _judge(self, series: SpikeSeries, sample: Sample, source: str, now: float) -> list[Alert]:
        """One value of a watched metric: learned in warmup or while the window fills (a
        judged one checked for growth then), else judged against the baseline (``spikes``)
        and learned unless it is a spike."""
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
        if spikes(value, baseline, series.noise.values, settings):
            series.spiked_at = self._count
            series.least = min(series.least, value)
            if not judged:
                return []
            return self._episode.spike(series, baseline, sample, self._count, source, time)
        series.learn(value)
        if not judged or not series.offending:
            return []
        return self._episode.under(series, baseline, sample, source, time)

    def _growth(self, series: SpikeSeries, sample: Sample, source: str, time: float) -> list[Alert]:
        """Once an attempt: a value in warmup (or before the window is full) far above the
        least the metric has been, and above its noise."""
        least, value = series.least, sample.value
        settings = self.settings
        if self._warmup_warned or not grows(value, least, series.noise.values, settings):
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
        settings = self.settings
        for name in present:
            series = self._series[name]
            if series.offending:
                return False  # a value under the bar counts towards the resolve
            values = finite_values(columns[name])
            baseline = series.baseline
            # The first values fill the window: not judged, only checked for growth.
            filling = len(values) if phase else baseline.size - len(baseline)
            checks_growth = name in self._judged and not self._warmup_warned
            if checks_growth and filling and not never_grows(values, series.least, settings):
                return False
            if not phase and not never_spikes(values, baseline.least(), filling, settings):
                return False
        return True

    def absorb(self, block: Block) -> None:
        """What ``observe`` does with values that are no spike: keep them, learn them."""
        columns = block.columns
        self._warmup.extend(columns.get("lr"))
        self._episode.evals.extend(columns.get(EVAL_METRIC), block.steps)
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
