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
  value of its last ``tail_window`` (500: the range the run has shown), a spike of
  another metric (``corroborate``, the grad-norm by default) from ``sustain`` values
  before the onset on, or the eval loss risen at an evaluation since the onset
  (``eval_signal``). Then the job is stopped and rolled back to before the episode's
  onset; else it stays a warning;
- resolves after ``resolve_after`` consecutive values under the bar (``"recovered"``),
  so two spikes further apart than that are two episodes;
- opens without a warning (and resolves without a word) when it is within the run's
  own tails: ``tail_count`` of the metric's last ``tail_window`` judged values were at
  least 1/``tail_margin`` as far above their own baseline (ratios, so a loss that fell
  since is not measured against its old level). A run that logs every step shows a
  batch 2-3x its median many times an hour, amid many at 1.5-2x; a run whose values
  never stray shows a 4x batch as news every time. A larger one, or one that persists
  with a second signal, is news again;
- resolves as well when a metric stays above the bar for a whole ``window``
  (``"level_shift"``): that is a new level, not a spike, and the baseline is
  re-learned from it.

A blow-up needs no window: a value ``blowup_factor`` (100) times or more the least of
the last 3 values before it (however few there are), that level floored at 1% of where
the run began, and above anything the metric has shown (a floor of scale: a loss that fell
1,000x has hard batches 100x its level that are no blow-up; ``blows_up``), on a record
whose grad-norm (a ``corroborate``
metric) is ``blowup_corroboration`` (10) times or more its own median is
``sustain_severity`` (critical) on that first value (``"blow_up"``): at a logging
interval of 100 steps, waiting for ``sustain`` values would let 400 steps of a blown-up
run go by. Alone, such a value opens the episode as any spike does.

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
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from itertools import islice
from typing import Any, ClassVar

from pydantic import Field, model_validator

from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricNames, MetricRuleConfig, Reading, Recent
from sentinel.rules.eval_signal import EVAL_METRIC, EvalSignal
from sentinel.rules.noise import above_noise, beyond_seen
from sentinel.rules.series import (
    LazyRolling,
    Rolling,
    Warmup,
    finite_values,
    finite_with_steps,
    never_above,
    sorted_median,
)


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
    #: A spike is also more than this many robust standard deviations above the baseline.
    noise_sigmas: float = Field(default=3.0, ge=0)
    #: Non-spike values the noise is taken over (long enough to hold a per-epoch rhythm);
    #: until it is full a spike must be ``extreme_factor`` x ``noise_sigmas`` above it.
    noise_window: int = Field(default=50, ge=3, le=10_000)
    #: The noise is at least this fraction of the baseline (a flat series has a MAD of 0).
    noise_floor: float = Field(default=0.01, ge=0)
    #: Alone, a run escalates only past this multiple of the highest non-spike value seen.
    extreme_factor: float = Field(default=3.0, gt=1.0)
    #: Metrics whose spike (judged the same way) corroborates a run of the judged ones.
    corroborate: MetricNames = Field(default_factory=lambda: ["grad_norm"])
    #: In warmup, a value above this multiple of the least seen in the attempt warns.
    warmup_factor: float = Field(default=10.0, gt=1.0)
    #: A spike is the run's own tail (a hard batch now and then), and opens no warning,
    #: when ``tail_count`` of the metric's last ``tail_window`` judged values were at least
    #: 1/``tail_margin`` as far above their baseline; it still escalates when it persists
    #: with a second signal (0: every spike warns). Values ``tail_floor`` x their baseline
    #: or more (no spike) and spikes the run came back from are remembered for that.
    tail_count: int = Field(default=3, ge=0)
    tail_window: int = Field(default=500, ge=1, le=100_000)
    tail_margin: float = Field(default=1.75, ge=1.0)
    tail_floor: float = Field(default=1.5, gt=1.0)
    #: A value this multiple of the median before it, however few values that median is
    #: taken over, is a blow-up...
    blowup_factor: float = Field(default=100.0, gt=1.0)
    #: ...``sustain_severity`` at once when the same record's grad-norm (a ``corroborate``
    #: metric) is at least this multiple of its own median.
    blowup_corroboration: float = Field(default=10.0, gt=1.0)

    @model_validator(mode="after")
    def _coherent(self) -> LossSpikeConfig:
        if self.sustain >= self.window:
            raise ValueError("sustain must be less than window (a longer run is a level shift)")
        if self.sustain_severity < self.severity:
            raise ValueError("sustain_severity must not be lower than severity")
        return self


#: The least a spike rises above its baseline, as a fraction of where the run began
#: (``spikes``): ratios to a level near 0 mean little.
SPIKE_FLOOR = 0.01
#: The first values learned whose median is where the run began.
START_VALUES = 3


def spike_bar(baseline: float, factor: float) -> float:
    """The value above which a sample is a spike against ``baseline``: ``factor`` x it.

    Rises with ``baseline`` (``factor`` > 1): a value at most the bar of the least value
    a median can be is no spike against that median.
    """
    return factor * baseline


def is_spike(value: float, baseline: float, factor: float) -> bool:
    """Whether ``value`` passes the ratio test against the median ``baseline``: above its
    bar, with a baseline above 0 (a ratio to a level <= 0 means nothing). The rule also
    asks the noise test (``above_noise``) of a value that passes this one."""
    return baseline > 0 and value > spike_bar(baseline, factor)


def growth_bar(least: float, settings: LossSpikeConfig) -> float:
    """In warmup, a value above this is growth far past the ``least`` seen (rising with it)."""
    return settings.warmup_factor * least


def spikes(
    value: float,
    baseline: float,
    noise: deque[float],
    settings: LossSpikeConfig,
    began: float = 0.0,
) -> bool:
    """The rule's decision on a value past warmup: a spike against the median ``baseline``
    (``is_spike``), above the run's own ``noise`` (``above_noise``) and more than
    ``SPIKE_FLOOR`` of where the run began (``began``) above the baseline: a loss that
    fell 500x, to 0.0084, has batches 2.6x that (+0.014) that are no spike.

    Until the noise window is full the run has not shown its whole rhythm (the first
    epoch has no earlier one to compare with): a spike must then be far beyond its noise,
    ``extreme_factor`` times as many robust standard deviations.
    """
    sigmas = settings.noise_sigmas
    if len(noise) < settings.noise_window:
        sigmas *= settings.extreme_factor
    return (
        is_spike(value, baseline, settings.factor)
        and value > baseline + SPIKE_FLOOR * began
        and above_noise(value, baseline, noise, sigmas, settings.noise_floor)
    )


def grows(value: float, least: float, noise: deque[float], settings: LossSpikeConfig) -> bool:
    """The rule's decision on a value in warmup: past the growth bar of the ``least`` seen
    (above 0: a ratio to a level <= 0 means nothing) and above the run's own ``noise``."""
    return (
        least > 0
        and value > growth_bar(least, settings)
        and above_noise(value, least, noise, settings.noise_sigmas, settings.noise_floor)
    )


def never_spikes(values: list[float], least: float, start: int, settings: LossSpikeConfig) -> bool:
    """Block path: no value from ``start`` on can be judged a spike, ``least`` the least of
    the baseline before them (``never_above`` with ``spikes``' own bar)."""
    return never_above(values, partial(spike_bar, factor=settings.factor), least, start)


def within_tail(
    tail: deque[tuple[int, float]], ratio: float, count: int, settings: LossSpikeConfig
) -> bool:
    """Whether a spike ``ratio`` x its baseline is the run's own tail: ``tail_count`` of its
    last ``tail_window`` judged values (``count`` now) were at least 1/``tail_margin`` as
    far above their own baseline."""
    if settings.tail_count == 0:
        return False
    bar = 1 + (ratio - 1) / settings.tail_margin
    since = count - settings.tail_window
    return sum(1 for at, seen in tail if at > since and seen >= bar) >= settings.tail_count


#: A blow-up is judged against the least of this many latest values before it.
BLOWUP_LEVEL = 3


def recent_level(baseline: Rolling) -> float:
    """The least of the latest ``BLOWUP_LEVEL`` values of a (non-empty) window: the level a
    blow-up is judged against (a loss early in a run falls fast; an older median lags)."""
    return min(islice(reversed(baseline.values), BLOWUP_LEVEL))


def blows_up(value: float, before: float, series: SpikeSeries, factor: float) -> bool:
    """Whether ``value`` is a blow-up: ``factor`` (100) times or more the level just
    ``before`` it, that level floored at ``SPIKE_FLOOR`` of where the run began (ratios to a
    level near 0 mean little), and above anything the metric has shown (its last
    ``tail_window`` values that were no spike). A loss that fell 1,000x to 0.0008 and has
    one batch at 0.14 is a hard batch, 179x its level but a fifth of where the run began (a
    real BERT-tiny classifier's, its grad-norm 24x with it); a watcher attached after the
    fall knows no start, and its next hard batch, no higher than the last, is one too."""
    return (
        before > 0
        and value >= factor * before  # the cheap test first: most values end here
        and value >= factor * SPIKE_FLOOR * series.began()
        and (not series.seen or value > max(series.seen))
    )


def never_blows_up(values: list[float], baseline: Rolling, settings: LossSpikeConfig) -> bool:
    """Block path: no value can be a blow-up (``blowup_factor`` x the median before it):
    each median is at least the least of the window and the block's values before it."""
    top = max(values)
    if top <= 0:
        return True
    least = min(baseline.least(), min(values))
    return least > 0 and top < settings.blowup_factor * least


def last_ratio(
    baseline: Rolling, values: list[float], steps: list[int]
) -> tuple[int | None, float] | None:
    """Block path: ``SpikeSeries.last_ratio`` after ``values`` (finite, all learned): the
    last one against the median of the window before it."""
    prior = [*baseline.values, *values[:-1]][-baseline.size :]
    if not prior:
        return None
    before = sorted_median(sorted(prior))
    return (steps[-1], values[-1] / before) if before > 0 else None


def never_grows(values: list[float], least: float, settings: LossSpikeConfig) -> bool:
    """Block path: no value can be judged growth, ``least`` the least seen before them."""
    return never_above(values, partial(growth_bar, settings=settings), least, 0)


class SpikeSeries:
    """One metric's baseline and its current run of spikes."""

    __slots__ = (
        "baseline",
        "calm",
        "episode",
        "last_ratio",
        "least",
        "noise",
        "offending",
        "recent",
        "run",
        "seen",
        "spiked_at",
        "start",
        "tail",
    )

    def __init__(self, window: int, noise_window: int, tail_window: int = 500) -> None:
        self.baseline = Rolling(window)
        #: (the rule's count of judged values, value / baseline) of its values that were
        #: ``tail_floor`` x their baseline or more but no spike, and of the peaks of the
        #: spikes it came back from: how far, and how often, it strays.
        self.tail: deque[tuple[int, float]] = deque(maxlen=tail_window)
        #: The last non-spike values, whose spread is the run's own noise.
        self.noise = LazyRolling(noise_window)
        #: The last ``tail_window`` non-spike values: the range the run has shown. A curriculum
        #: step back up to 2.17 was "far beyond anything the run has shown (0.4244)", the
        #: highest of the noise's 50, in a run that began at 2.83.
        self.seen: deque[float] = deque(maxlen=tail_window)
        #: The least finite value of the attempt (the warmup's yardstick).
        self.least = math.inf
        #: The first ``START_VALUES`` values learned: where the run began (``spike_floor``).
        self.start: list[float] = []
        #: The rule's count of judged values when this metric last spiked.
        self.spiked_at: int | None = None
        #: This metric's spikes in the open episode: the run's behaviour once it recovers.
        self.episode: list[float] = []
        #: Every finite value seen lately, spikes included: the evidence in ``details``.
        self.recent: deque[tuple[int | None, float]] = deque(maxlen=2 * window)
        #: The consecutive spikes up to now, as (step, value).
        self.run: list[tuple[int | None, float]] = []
        #: Consecutive values under the bar since this metric's last spike.
        self.calm = 0
        #: Whether this metric keeps the episode open.
        self.offending = False
        #: (step, value / the median of the values before it) of its last finite value;
        #: None before it has a median. A corroborating metric's, for a blow-up's record.
        self.last_ratio: tuple[int | None, float] | None = None

    def began(self) -> float:
        """Where the run began: the median of its first values learned (0 before any)."""
        start = self.start
        if len(start) == START_VALUES:
            return start[1] if start[0] <= start[1] <= start[2] else sorted(start)[1]
        return sorted_median(sorted(start)) if start else 0.0

    def learn(self, value: float) -> None:
        """A value that is no spike: part of the baseline and the noise."""
        self.baseline.add(value)
        self.noise.add(value)
        self.seen.append(value)
        self.least = min(self.least, value)
        if len(self.start) < START_VALUES:
            self.start.append(value)


#: ``BaseDetector.sample_alert`` of the rule: how its alerts are built.
AlertMaker = Callable[..., Alert]


class SpikeEpisode:
    """The open episode of the rule (if any): its onset, whether it escalated."""

    def __init__(self, settings: LossSpikeConfig, alert: AlertMaker) -> None:
        self.settings = settings
        self.alert = alert
        self.series: dict[str, SpikeSeries] = {}
        self.open = False
        self.escalated = False
        #: Opened without a warning: a spike within the run's own tails.
        self.quiet = False
        self.onset_step: int | None = None
        #: The rule's count of judged values when the episode opened.
        self.onset_count = 0
        #: The evaluations: the eval loss rising since the onset is a second signal.
        self.evals = EvalSignal()

    def reset(self, series: dict[str, SpikeSeries]) -> None:
        """A new attempt: no episode, and these are the metrics' series."""
        self.series = series
        self.evals.reset()
        self.open = False
        self.escalated = False
        self.quiet = False
        self.onset_step = None
        self.onset_count = 0

    def spike(
        self,
        series: SpikeSeries,
        baseline: float,
        sample: Sample,
        count: int,
        source: str,
        time: float,
    ) -> list[Alert]:
        """A judged value that is a spike: opens the episode, escalates it, or ends this
        metric's part as a level shift; ``count`` is the rule's count of judged values."""
        settings = self.settings
        name = sample.name
        series.calm = 0
        series.run.append((sample.step, sample.value))
        series.episode.append(sample.value)
        alerts: list[Alert] = []
        if not series.offending:
            series.offending = True
            if not self.open:
                self.open = True
                self.onset_step = sample.step
                self.onset_count = count
                ratio = sample.value / baseline
                self.quiet = within_tail(series.tail, ratio, count, settings)
                message = (
                    f"{name} {sample.value:.4g} at step {sample.step}"
                    f" is {ratio:.1f}x its recent median {baseline:.4g}"
                )
                details = self._details("spike", series, baseline, sample)
                details["ratio"] = round(ratio, 3)
                if not self.quiet:
                    alerts.append(
                        self._say(settings.severity, message, sample, source, time, details)
                    )
        run_length = len(series.run)
        evidence = None
        if (
            run_length >= settings.sustain
            and not self.escalated
            and settings.sustain_severity > settings.severity
        ):
            evidence = self._second_signal(series)
        if evidence is not None:
            self.escalated = True
            bar = spike_bar(baseline, settings.factor)
            message = (
                f"{name} above {bar:.4g} ({settings.factor:g}x its recent"
                f" median {baseline:.4g}) for {run_length} consecutive values since step"
                f" {series.run[0][0]} (now {sample.value:.4g} at step {sample.step}), {evidence}"
            )
            details = self._details("persistent", series, baseline, sample)
            details["evidence"] = evidence
            alerts.append(
                self._say(settings.sustain_severity, message, sample, source, time, details)
            )
        if run_length >= settings.window:
            alerts += self._level_shift(series, baseline, sample, source, time)
        return alerts

    def blow_up(
        self,
        series: SpikeSeries,
        baseline: float,
        loss: Sample,
        sample: Sample,
        evidence: str,
        count: int,
        source: str,
        time: float,
    ) -> list[Alert]:
        """A corroborated blow-up of ``loss`` (its record's grad-norm up with it): the episode
        opens, or escalates, at ``sustain_severity`` at once; ``sample`` is the value that
        completed the evidence (the loss, or its record's grad-norm)."""
        settings = self.settings
        if not self.open:
            self.open = True
            self.onset_step = loss.step
            self.onset_count = count
        self.escalated = True
        if not series.offending:
            series.offending = True
            series.calm = 0
            series.run.append((loss.step, loss.value))
            series.episode.append(loss.value)
        ratio = loss.value / baseline
        message = (
            f"{loss.name} {loss.value:.4g} at step {loss.step} is {ratio:.3g}x its level"
            f" {baseline:.4g} just before, {evidence}: a blow-up"
        )
        details = self._details("blow_up", series, baseline, loss)
        details.update(ratio=round(ratio, 3), evidence=evidence, completed_by=sample.name)
        return [self._say(settings.sustain_severity, message, loss, source, time, details)]

    def under(
        self, series: SpikeSeries, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        """A value under the bar of a metric that keeps the episode open."""
        series.run.clear()
        series.calm += 1
        if series.calm < self.settings.resolve_after:
            return []
        series.offending = False
        series.calm = 0
        # Spikes the run came back from are part of its wobble (a rhythm's peaks), and of
        # its tail (a level shift's values are not: that part never came back).
        if series.episode and baseline > 0 and series.spiked_at is not None:
            series.tail.append((series.spiked_at, max(series.episode) / baseline))
        series.noise.extend(series.episode)
        series.seen.extend(series.episode)
        series.episode.clear()
        if self._still_offending():
            return []
        if self.quiet and not self.escalated:
            self._close()
            return []
        details = self._details("recovered", series, baseline, sample)
        message = (
            f"{sample.name} back under {spike_bar(baseline, self.settings.factor):.4g} for"
            f" {self.settings.resolve_after} values (last {sample.value:.4g} at step"
            f" {sample.step})"
        )
        return [self._resolve(message, sample, source, time, details)]

    def _second_signal(self, series: SpikeSeries) -> str | None:
        """What makes a persistent run more than one noisy signal, or None: a value far
        beyond anything the run has shown, a spike of another watched metric since
        ``sustain`` judged values before the onset, or the eval loss risen at an evaluation
        since the onset (``eval_signal``)."""
        settings = self.settings
        highest = max(value for _, value in series.run)
        if beyond_seen(highest, series.seen, settings.extreme_factor):
            return f"far beyond anything the run has shown ({max(series.seen):.4g})"
        since = self.onset_count - settings.sustain
        for name, other in self.series.items():
            if other is not series and other.spiked_at is not None and other.spiked_at >= since:
                return f"and {name} spiked with it"
        return self.evals.rose_since(self.onset_step)

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
        series.seen.extend(series.episode)
        series.episode.clear()
        series.run.clear()
        series.offending = False
        if self._still_offending():
            return []
        if self.quiet and not self.escalated:
            self._close()  # never announced; ``divergence`` judges the new level
            return []
        new_level = series.baseline.median()
        details["new_baseline"] = new_level
        message = (
            f"{sample.name} above {spike_bar(baseline, self.settings.factor):.4g} for"
            f" {self.settings.window} values since step {run_start}: a level shift, not a"
            f" spike; baseline re-learned at {new_level:.4g}"
        )
        return [self._resolve(message, sample, source, time, details)]

    def _still_offending(self) -> bool:
        return any(series.offending for series in self.series.values())

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
            "onset_step": self.onset_step,
            "run_length": len(series.run),
            "values": [value for _, value in recent],
            "steps": [step for step, _ in recent],
        }

    def _say(
        self,
        severity: Severity,
        message: str,
        sample: Sample,
        source: str,
        time: float,
        details: dict[str, Any],
    ) -> Alert:
        return self.alert(
            sample,
            severity=severity,
            message=message,
            time=time,
            source=source,
            onset_step=self.onset_step,
            details=details,
        )

    def _resolve(
        self, message: str, sample: Sample, source: str, time: float, details: dict[str, Any]
    ) -> Alert:
        alert = self.alert(
            sample,
            severity=Severity.INFO,
            message=message,
            time=time,
            source=source,
            onset_step=self.onset_step,
            resolves=True,
            details=details,
        )
        self._close()
        return alert

    def _close(self) -> None:
        self.open = False
        self.escalated = False
        self.quiet = False
        self.onset_step = None


__all__ = ["LossSpikeConfig", "LossSpikeDetector"]


class LossSpikeDetector(BaseDetector):
    """Warns on a spike of the loss, escalates when it persists, resolves when it is over."""

    rule = "loss_spike"
    config_model = LossSpikeConfig
    story = "blow_up"
    divergent = True

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        if alert.details.get("kind") == "blow_up":
            return (
                "optimisation blow-up: the loss and the grad-norm exploded together on one record",
                "roll back to the checkpoint before the onset; lower the learning rate, clip"
                " gradients at 1.0, use bf16 rather than fp16 (an fp16 overflow blows up so)",
                alert.metric,
            )
        if "eval_loss rose" in str(alert.details.get("evidence", "")):
            return (
                "a persistent loss spike that hurt the model: the eval loss rose with it",
                "roll back to the checkpoint before the onset; inspect the batches from the"
                " onset step (a bad shard, a data-order change); if it comes back, lower the"
                " learning rate or Adam's beta2 (0.95)",
                alert.metric,
            )
        return (
            "loss spike: a bad batch or an optimiser instability",
            "inspect the batch at this step; if spikes repeat, lower the learning rate or"
            " Adam's beta2 (0.95), or skip the offending batches",
            alert.metric,
        )

    def __init__(self, config: LossSpikeConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._judged = frozenset(config.metrics)
        #: Metrics whose value on a blow-up's record corroborates it (their last ratio kept).
        self._corroborating = frozenset(config.corroborate)
        self.watches = frozenset({*config.metrics, *config.corroborate, EVAL_METRIC, "lr"})
        self._warmup = Warmup(config.warmup_steps)
        self._series: dict[str, SpikeSeries] = {}
        self._episode = SpikeEpisode(config, self.sample_alert)
        #: Judged values seen in this attempt.
        self._count = 0
        self._warmup_warned = False
        #: A judged value that is a blow-up its record's grad-norm may still corroborate:
        #: (the value, the median before it); until the next judged value.
        self._pending: tuple[Sample, float] | None = None
        self.job_started(0.0)

    def job_started(self, now: float) -> None:
        settings = self.settings
        self._warmup.reset()
        names = dict.fromkeys([*settings.metrics, *settings.corroborate])
        self._series = {
            name: SpikeSeries(settings.window, settings.noise_window, settings.tail_window)
            for name in names
        }
        self._episode.reset(self._series)
        self._count = 0
        self._warmup_warned = False
        self._pending = None

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
        rolling = series.baseline
        time = stamp if stamp is not None else now
        settings = self.settings
        if name in self._corroborating:
            median = rolling.median() if len(rolling) else 0.0
            series.last_ratio = (step, value / median) if median > 0 else None
        if judged:
            self._count += 1
            self._pending = None
            # Against the level the loss had just before it (it may still fall fast).
            before = recent_level(rolling) if len(rolling) else None
            if before is not None and blows_up(value, before, series, settings.blowup_factor):
                evidence = self._corroboration(step)
                if evidence is not None:
                    series.recent.append((step, value))
                    series.least = min(series.least, value)
                    return self._episode.blow_up(
                        series, before, sample, sample, evidence, self._count, source, time
                    )
                self._pending = (sample, before)
        elif self._pending is not None and not self._episode.escalated:
            # Judged as any value of its metric, besides corroborating the blow-up.
            corroborated = self._corroborates(series, sample, source, time)
            return corroborated + self._level(series, sample, False, source, time)
        return self._level(series, sample, judged, source, time)

    def _level(
        self, series: SpikeSeries, sample: Sample, judged: bool, source: str, time: float
    ) -> list[Alert]:
        """``_against_level``, then a judged value far enough above its baseline joins the
        metric's tail (past warmup, the window full: where it is judged)."""
        rolling = series.baseline
        settings = self.settings
        value = sample.value
        judging = judged and rolling.full and not self._warmup.active(sample.step)
        baseline = rolling.median() if judging else 0.0
        near = (
            baseline > 0
            and value >= settings.tail_floor * baseline
            and not spikes(value, baseline, series.noise.values, settings, series.began())
        )
        alerts = self._against_level(series, sample, judged, source, time)
        if near:
            series.tail.append((self._count, value / baseline))
        return alerts

    def _against_level(
        self, series: SpikeSeries, sample: Sample, judged: bool, source: str, time: float
    ) -> list[Alert]:
        """A value against its metric's level: learned in warmup or while the window fills
        (a judged one checked for growth then), else judged against the baseline."""
        value, step = sample.value, sample.step
        rolling = series.baseline
        series.recent.append((step, value))
        if self._warmup.active(step) or not rolling.full:
            alerts = self._growth(series, sample, source, time) if judged else []
            series.learn(value)
            return alerts
        baseline = rolling.median()
        if spikes(value, baseline, series.noise.values, self.settings, series.began()):
            series.spiked_at = self._count
            series.least = min(series.least, value)
            if not judged:
                return []
            return self._episode.spike(series, baseline, sample, self._count, source, time)
        series.learn(value)
        if not judged or not series.offending:
            return []
        return self._episode.under(series, baseline, sample, source, time)

    def _corroboration(self, step: int | None) -> str | None:
        """What on the record at ``step`` makes a blow-up more than one value: a
        corroborating metric's value there at ``blowup_corroboration`` x its median."""
        for name in self.settings.corroborate:
            other = self._series.get(name)
            last = other.last_ratio if other is not None else None
            if (
                last is not None
                and last[0] == step
                and last[1] >= self.settings.blowup_corroboration
            ):
                return f"with {name} {last[1]:.3g}x its median on the same record"
        return None

    def _corroborates(
        self, series: SpikeSeries, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        """A corroborating value after a blow-up of a judged one on the same record."""
        pending = self._pending
        last = series.last_ratio
        if (
            pending is None
            or sample.name in self._judged
            or last is None
            or last[0] != pending[0].step
            or last[1] < self.settings.blowup_corroboration
        ):
            return []
        loss, before = pending
        self._pending = None
        judged = self._series[loss.name]
        evidence = f"with {sample.name} {last[1]:.3g}x its median on the same record"
        return self._episode.blow_up(
            judged, before, loss, sample, evidence, self._episode.onset_count or self._count,
            source, time,
        )  # fmt: skip

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
        if self._pending is not None and any(name in columns for name in settings.corroborate):
            return False  # a value on the blow-up's record may corroborate it
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
            if (
                not phase
                and name in self._judged
                and not never_above(
                    values,
                    partial(spike_bar, factor=settings.tail_floor),
                    baseline.least(),
                    filling,
                )
            ):
                return False  # a value the tail would remember
            if name in self._judged and values and not never_blows_up(values, baseline, settings):
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
            if name in self._corroborating:
                series.last_ratio = last_ratio(series.baseline, values, steps)
            if name in self._judged:
                self._count += len(values)
                self._pending = None
            kept = series.recent.maxlen or len(values)
            series.recent.extend(zip(steps[-kept:], values[-kept:], strict=True))
            series.baseline.extend(values)
            series.noise.extend(values)
            series.seen.extend(values)
            series.least = min(series.least, *values)
            if len(series.start) < START_VALUES:
                series.start.extend(values[: START_VALUES - len(series.start)])
