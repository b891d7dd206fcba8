"""throughput_drop: throughput below a fraction of the run's own baseline, sustained.

The series is the first throughput metric the job logs (tokens/sec, samples/sec...);
a job that logs none is judged on steps/sec derived from the time at which each
new step first appears in its training log lines.

A value is low when ``is_low`` against the ``low_bar`` of the baseline (both in
``throughput_blocks``): ``_judge`` decides each value with them, and the block path's
proof (``block_lows``) applies the same two to the columns.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate, chain, compress, count, islice, repeat
from operator import gt, lt, not_, sub, truediv
from typing import NamedTuple

from pydantic import Field

from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricNames, MetricRuleConfig, Reading, Recent
from sentinel.rules.series import Rolling, Warmup, judged_mask, longest_run_at_least

#: Throughput metrics as the common loggers name them (lower-cased, ``train/`` stripped):
#: sentinel's canonical name, MosaicML Composer, Lightning's ThroughputMonitor, torchtitan.
#: Not HF's ``train_samples_per_second``: the Trainer logs it once, in its end-of-run summary.
THROUGHPUT_METRICS: tuple[str, ...] = (
    "tokens_per_sec",
    "throughput/tokens_per_sec",
    "items_per_sec",
    "throughput(tps)",
    "perf/throughput(tps)",
    "wps",
    "samples_per_sec",
    "samples_per_second",
    "throughput/samples_per_sec",
    "steps_per_sec",
    "steps_per_second",
    "batches_per_sec",
    "throughput/batches_per_sec",
    "it_per_sec",
)


class ThroughputDropConfig(MetricRuleConfig):
    """``[rules.throughput_drop]``.

    The runbooks' defaults: "< 50% of the run's baseline, sustained". Five values in a row
    just under the bar outlast a checkpoint save or an evaluation, which slow one logging
    interval; a deeper drop needs fewer (``values_needed``), never under two; the
    baseline is the median of 20 values, so a slow first step (compilation, allocator
    warmup) does not set it.
    """

    #: Throughput metrics (names as logged, lower-cased). The first of them the job logs
    #: becomes the series and the others are ignored, so only like is compared with like.
    metrics: MetricNames = Field(default_factory=lambda: list(THROUGHPUT_METRICS))
    #: Metrics whose steps time the run when it logs no throughput: steps/sec is derived
    #: from the time each new step first appears in them. Empty: never derive.
    step_metrics: MetricNames = Field(default_factory=lambda: ["loss", "grad_norm", "lr"])
    #: Throughput below this fraction of the baseline is a drop.
    fraction: float = Field(default=0.5, gt=0, lt=1)
    #: Values (after warmup) whose median is the first baseline; also the rolling window
    #: whose median can later raise it (it never lowers it).
    baseline_window: int = Field(default=20, ge=3)
    #: Consecutive values just below the bar that make a drop; a deeper drop needs fewer
    #: (a drop to a quarter of the baseline two, with the default bar).
    sustain: int = Field(default=5, ge=1)
    #: Seconds the drop must also have lasted (from its first low value); 0 counts values only.
    sustain_s: float = Field(default=0.0, ge=0)
    #: Consecutive values back at or above the bar that end the episode.
    resolve_after: int = Field(default=5, ge=1)


#: The fewest values any drop needs, however deep: one slow interval (a save, an eval) is
#: no drop.
MIN_SUSTAIN = 2


def depth_slack(fraction: float) -> float:
    """What each low value's depth below the baseline (``1 - value / baseline``) gives up
    before it counts as evidence: 80% of the depth at the bar."""
    return 0.8 * (1.0 - fraction)


def evidence_needed(settings: ThroughputDropConfig) -> float:
    """The evidence that makes a drop: what ``sustain`` values just under the bar give.

    A one-sided CUSUM of the depth below the baseline, restarted by any value at or
    above the bar: with the default bar (50%), five values just under it, three at 40%
    of the baseline, two at a quarter. The slack is what keeps a shallow dip from paging
    on fewer values: each value just under the bar adds a fifth of what is needed.
    """
    return settings.sustain * (1.0 - settings.fraction - depth_slack(settings.fraction))


def values_needed(depth: float, settings: ThroughputDropConfig) -> int:
    """How many low values of the same ``depth`` make a drop (for docs and tests)."""
    gain = depth - depth_slack(settings.fraction)
    need = evidence_needed(settings)
    count = MIN_SUSTAIN if settings.sustain >= MIN_SUSTAIN else 1
    while count * gain < need - 1e-9:
        count += 1
    return count


#: Derived steps/sec is measured over this many seconds at least: a run that logs every 3 ms
#: with timestamps to the millisecond had rates quantised to 333, 250, 143 steps/sec, and
#: a scheduler's hiccup of a few milliseconds was a drop under half.
MIN_SPAN_S = 1.0

#: Derived steps/sec: (time, highest step) of a time point, or None.
Point = tuple[float, int] | None
#: The rule's derived steps/sec state: ``_data_clock``, ``_previous``, ``_point``.
Clock = tuple[bool, Point, Point]


def low_bar(baseline: float, fraction: float) -> float:
    """The bar under which a throughput value is low: ``fraction`` of the baseline. It
    rises with the baseline, so a value at or above the bar of the highest baseline a
    block could reach is high whatever the baseline does."""
    return fraction * baseline


#: Whether a throughput value is low: under the ``low_bar`` of the baseline (``value <
#: bar``: ``operator.lt`` itself, so the block path applies it to a column at C speed).
is_low: Callable[[float, float], bool] = lt


def highs_among(values: list[float], bar: float) -> list[bool]:
    """``not is_low`` for each value: which are at or above ``bar``."""
    return list(map(not_, map(is_low, values, repeat(bar))))


class Judged(NamedTuple):
    """What a block hands ``_judge``, in order: each value with its step and time, and the
    derived steps/sec state after it (``_data_clock``, ``_previous``, ``_point``)."""

    values: list[float]
    steps: list[int]
    times: list[float]
    derive: Clock | None


def judged_values(
    block: Block,
    series: str | None,
    throughput: frozenset[str],
    step_metrics: frozenset[str],
    warmup: Warmup,
    clock: Clock,
) -> Judged | None:
    """The values the block's lines hand ``_judge``; None when not told in bulk.

    ``series`` is the judged throughput metric (None while steps/sec is derived from
    ``step_metrics`` with the derived state ``clock``).
    """
    names = block.names
    if warmup.lr_rising is not False and "lr" in names:
        return None  # the warmup may end inside the block
    derive = None
    if series is not None:
        if series == "lr":
            return None
        if series not in names:
            return Judged([], [], [], None)
        values, steps = block.columns[series], block.steps
        times = block.times if block.times is not None else block.clock
    elif not throughput.isdisjoint(names):
        return None  # the job's own throughput is adopted at its first value
    elif step_metrics.isdisjoint(names):
        return Judged([], [], [], None)
    else:
        derived = derive_block(block, clock)
        if derived is None:
            return None
        values, steps, times, derive = derived
    if warmup.lr_rising:
        return Judged([], [], [], derive)
    keep = judged_mask(values, steps, warmup.warmup_steps)
    if keep is not None:
        values, steps, times = (
            list(compress(values, keep)),
            list(compress(steps, keep)),
            list(compress(times, keep)),
        )
    return Judged(values, steps, times, derive)


def derive_block(
    block: Block, clock: Clock
) -> tuple[list[float], list[int], list[float], Clock] | None:
    """``_derive`` over the block's lines from the derived state ``clock``: the rates, their
    steps and times, and the state after; None unless every line has a new, higher step."""
    data_clock, previous, point = clock
    stamps: list[float]
    if block.times is None:
        if data_clock:
            return [], [], [], clock  # untimed: no rate
        stamps = block.clock
    else:
        stamps = block.times
        if not data_clock:
            data_clock, previous, point = True, None, None
    steps = block.steps
    if not all(map(lt, steps, islice(steps, 1, None))):
        return None
    if point is None:
        point = (stamps[0], steps[0])
        stamps, steps = stamps[1:], steps[1:]
    elif steps[0] <= point[1]:
        return None
    point_time, point_step = point
    times = [point_time, *stamps]
    steps = [point_step, *steps]
    # A line closes the open time point when its time is past every earlier one; the
    # closed point has the time of the line that opened it and the step of the line
    # before the closing one (each line in between moved its step up).
    closes = list(compress(count(1), map(gt, islice(times, 1, None), accumulate(times, max))))
    close_steps = list(map(steps.__getitem__, map(sub, closes, repeat(1))))
    close_times = [point_time, *map(times.__getitem__, closes[:-1])] if closes else []
    point = (times[closes[-1]] if closes else point_time, steps[-1])
    chain_steps, chain_times = [], []
    for close_time, close_step in zip(close_times, close_steps, strict=True):
        # As ``_derive``: a rate once ``MIN_SPAN_S`` has passed since the point it is from.
        if previous is None:
            previous = (close_time, close_step)
            chain_steps, chain_times = [close_step], [close_time]
        elif close_time - previous[0] >= MIN_SPAN_S:
            if not chain_steps:
                chain_steps, chain_times = [previous[1]], [previous[0]]
            chain_steps.append(close_step)
            chain_times.append(close_time)
            previous = (close_time, close_step)
    rates = list(
        map(
            truediv,
            map(sub, islice(chain_steps, 1, None), chain_steps),
            map(sub, islice(chain_times, 1, None), chain_times),
        )
    )
    return rates, chain_steps[1:], chain_times[1:], (data_clock, previous, point)


def block_lows(
    values: list[float],
    baseline: float,
    recent: Sequence[float],
    low_run: int,
    is_open: bool,
    settings: ThroughputDropConfig,
) -> list[int] | None:
    """The positions of the low values among ``values`` judged against ``baseline`` (with
    the rolling window ``recent``, ``low_run`` lows before and the episode ``is_open``)
    when none raises an alert; None when that is not certain."""
    if not values:
        return []
    fraction = settings.fraction
    bar = low_bar(baseline, fraction)
    if is_open:
        return list(range(len(values))) if is_low(max(values), bar) else None
    if not bar > 0 or 0.0 in recent:
        return None  # +0.0 and -0.0 sort as equals: the rolling window's order is unsure
    # The baseline only rises, and at most to a window's median, which is at most the
    # window's rank-th largest value: so at most to the largest value of them all.
    smallest = min(values)
    top = max(baseline, max(recent), max(values))
    if not is_low(smallest, low_bar(top, fraction)):
        lows: list[int] = []  # every value high whatever the baseline does
    else:
        lows = list(compress(count(), map(is_low, values, repeat(bar))))
        if sum(highs_among(values, low_bar(top, fraction))) + len(lows) < len(values):
            # Some value near the bar: try the rank-th largest value as the bound.
            size = settings.baseline_window
            top = max(baseline, sorted(chain(recent, values))[size // 2 - size])
            if sum(highs_among(values, low_bar(top, fraction))) + len(lows) < len(values):
                return None  # which side of the bar it falls depends on the order
    if lows:
        # How many lows a drop needs depends on their depth: a run of the fewest any
        # drop needs, or one that goes on from before the block, is fed line by line.
        if low_run and lows[0] == 0:
            return None
        if longest_run_at_least(lows, min(MIN_SUSTAIN, settings.sustain)):
            return None
    return lows


#: Name of the series derived from timestamps.
DERIVED = "steps_per_sec"


class ThroughputDropDetector(BaseDetector):
    """Warns once when throughput stays below ``fraction`` of its baseline; resolves on recovery.

    The baseline is learned once, after warmup, as the median of the first
    ``baseline_window`` values. Later it follows the rolling median of the values
    above the bar, but only upwards: a slow decline never teaches it a lower level.
    Derived steps/sec is measured between the moments the clock moved: lines read
    in one burst (same time) are one point, so a buffered log still gives true rates;
    without any timestamps (replay of a log without times) there is no rate at all.
    """

    rule = "throughput_drop"
    config_model = ThroughputDropConfig

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        return (
            "throughput fell and stayed down",
            "look for data-loader starvation, GPU throttling, a straggler rank, host"
            " memory swapping, or another job on the GPUs",
            alert.metric,
        )

    def __init__(self, config: ThroughputDropConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._throughput = frozenset(config.metrics)
        self._step_metrics = frozenset(config.step_metrics)
        self.watches = self._throughput | self._step_metrics | {"lr"}
        self._warmup = Warmup(config.warmup_steps)
        self._reset()

    def _reset(self) -> None:
        self._warmup.reset()
        #: The logged throughput metric judged; None while steps/sec is derived.
        self._series: str | None = None
        # Derived steps/sec: (time, highest step) of the last closed and of the open time point.
        self._data_clock = False
        self._previous: tuple[float, int] | None = None
        self._point: tuple[float, int] | None = None
        self._clear_baseline()

    def _clear_baseline(self) -> None:
        size = self.settings.baseline_window
        self._learning: list[float] = []
        self._baseline: float | None = None
        self._recent = Rolling(size)
        self._values: deque[float] = deque(maxlen=self.settings.sustain + 5)
        self._low_run = 0
        # The run's evidence: the sum of each low value's depth less the slack (CUSUM).
        self._evidence = 0.0
        self._low_since: tuple[int | None, float] = (None, 0.0)
        self._open = False
        self._high_run = 0

    def job_started(self, now: float) -> None:
        self._reset()

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        name = sample.name
        if name == "lr":
            self._warmup.observe(sample)
        if name in self._throughput:
            time = sample.time if sample.time is not None else now
            alerts = [] if self._series is not None else self._adopt(name, source, time)
            if name != self._series:
                return alerts
            return alerts + self._judge(sample.value, sample.step, time, source, derived=False)
        if self._series is None and name in self._step_metrics:
            rate = self._derive(sample, now)
            if rate is not None:
                value, step, time = rate
                return self._judge(value, step, time, source, derived=True)
        return []

    def can_absorb(self, block: Block) -> bool:
        """Whether the block's judged values raise nothing, as far as a bound proves it.

        Outside an episode every value must sit clearly on one side of the bar (below
        the bar of the baseline now, or at or above the bar of the highest baseline the
        block could raise it to) with no run of ``sustain`` lows; within one, every value
        must stay below the bar. The learning rate must not be warming up in the block.
        """
        judged = self._judged(block)
        if judged is None:
            return False
        values, baseline = judged.values, self._baseline
        recent: Sequence[float] = self._recent.values
        low_run, is_open = self._low_run, self._open
        if baseline is None:
            learn = self.settings.baseline_window - len(self._learning)
            if len(values) < learn:
                return True
            learned = [*self._learning, *values[:learn]]
            baseline, recent, low_run, is_open = statistics.median(learned), learned, 0, False
            values = values[learn:]
        return block_lows(values, baseline, recent, low_run, is_open, self.settings) is not None

    def absorb(self, block: Block) -> None:
        """The state ``_judge`` leaves after the block's values, one by one."""
        judged = self._judged(block)
        assert judged is not None
        if judged.derive is not None:
            self._data_clock, self._previous, self._point = judged.derive
        values, steps, times = judged.values, judged.steps, judged.times
        if self._baseline is None:
            window = self.settings.baseline_window
            learn = window - len(self._learning)
            self._learning += values[:learn]
            if len(self._learning) < window:
                return
            self._baseline = statistics.median(self._learning)
            for learned in self._learning:
                self._recent.add(learned)
            values, steps, times = values[learn:], steps[learn:], times[learn:]
        recent = self._recent.values
        lows = block_lows(values, self._baseline, recent, self._low_run, self._open, self.settings)
        assert lows is not None
        self._take(values, steps, times, lows)

    def _judged(self, block: Block) -> Judged | None:
        """The values the block's lines hand ``_judge``; None when not told in bulk."""
        clock = (self._data_clock, self._previous, self._point)
        return judged_values(
            block, self._series, self._throughput, self._step_metrics, self._warmup, clock
        )

    def _take(
        self, values: list[float], steps: list[int], times: list[float], lows: list[int]
    ) -> None:
        """``_judge`` on each value, raising nothing: ``lows`` are those below the bar."""
        if not values:
            return
        self._values.extend(values)
        if self._open:
            self._high_run = 0
            return
        assert self._baseline is not None
        highs = values
        if lows:
            self._high_run = 0
            # The last run of lows started where consecutive positions stop (short: < sustain).
            first = len(lows) - 1
            while first and lows[first - 1] == lows[first] - 1:
                first -= 1
            start = lows[first]
            continued = self._low_run if start == 0 else 0
            if not continued:
                self._low_since = (steps[start], times[start])
            self._low_run = continued + len(values) - start if lows[-1] == len(values) - 1 else 0
            bar = low_bar(self._baseline, self.settings.fraction)
            highs = list(compress(values, highs_among(values, bar)))
            # The last low is a run of one (block_lows refuses longer runs): its evidence is
            # its depth against the baseline after the highs before it, and stays so after
            # highs (the next low starts the sum again).
            last = lows[-1]
            before = list(compress(values[:last], highs_among(values[:last], bar)))
            at_low = self._recent.peak_median(before, self._baseline) if before else self._baseline
            self._evidence = self._depth(values[last], at_low)
        else:
            self._low_run = 0
        if highs:
            self._baseline = self._recent.peak_median(highs, self._baseline)
            self._recent.extend(highs)

    def _adopt(self, name: str, source: str, now: float) -> list[Alert]:
        """The job logs throughput after all: judge it from now on, not derived steps/sec."""
        self._series = name
        was_open = self._open
        self._clear_baseline()
        if not was_open:
            return []
        return [
            Alert(
                rule=self.rule,
                severity=Severity.INFO,
                message=f"derived steps/sec no longer judged: the job logs {name}",
                time=now,
                source=source,
                metric=DERIVED,
                resolves=True,
            )
        ]

    def _derive(self, sample: Sample, now: float) -> tuple[float, int, float] | None:
        """Steps/sec over the last closed interval between time points, once the clock moves."""
        step = sample.step
        if step is None:
            return None
        if sample.time is not None and not self._data_clock:
            # The data's own clock from now on; never mixed with the time lines were read.
            self._data_clock = True
            self._previous = self._point = None
        elif sample.time is None and self._data_clock:
            return None
        time = sample.time if sample.time is not None else now
        point = self._point
        if point is None:
            self._point = (time, step)
            return None
        point_time, point_step = point
        if step <= point_step:
            return None  # not a new step
        if time <= point_time:
            self._point = (point_time, step)  # same burst: one time point
            return None
        previous, self._point = self._previous, (time, step)
        if previous is None:
            self._previous = point
            return None  # the first time point: nothing before it to measure from
        if point_time - previous[0] < MIN_SPAN_S:
            return None  # measured from ``previous`` still, over ``MIN_SPAN_S`` at least
        self._previous = point
        rate = (point_step - previous[1]) / (point_time - previous[0])
        return rate, point_step, point_time

    def _judge(
        self, value: float, step: int | None, time: float, source: str, *, derived: bool
    ) -> list[Alert]:
        if not math.isfinite(value) or self._warmup.active(step):
            return []
        baseline = self._baseline
        if baseline is None:
            self._learning.append(value)
            if len(self._learning) == self.settings.baseline_window:
                self._baseline = statistics.median(self._learning)
                for learned in self._learning:
                    self._recent.add(learned)
            return []
        self._values.append(value)
        if not is_low(value, low_bar(baseline, self.settings.fraction)):
            recent = self._recent
            recent.add(value)
            if len(recent.values) == recent.size:
                self._baseline = max(baseline, recent.median())
            self._low_run = 0
            if not self._open:
                return []
            self._high_run += 1
            if self._high_run < self.settings.resolve_after:
                return []
            self._open = False
            return [
                self._drop_alert(
                    value, step=step, time=time, source=source, derived=derived, resolves=True
                )
            ]
        self._high_run = 0
        if self._open:
            return []
        if self._low_run == 0:
            self._low_since = (step, time)
            self._evidence = 0.0
        self._low_run += 1
        self._evidence += self._depth(value, baseline)
        settings = self.settings
        if (
            self._low_run < min(MIN_SUSTAIN, settings.sustain)
            or self._evidence < evidence_needed(settings) - 1e-9
            or time - self._low_since[1] < settings.sustain_s
        ):
            return []
        self._open = True
        return [
            self._drop_alert(
                value, step=step, time=time, source=source, derived=derived, resolves=False
            )
        ]

    def _depth(self, value: float, baseline: float) -> float:
        """A low value's evidence: its depth below the baseline, less the slack."""
        return 1.0 - value / baseline - depth_slack(self.settings.fraction)

    def _drop_alert(
        self,
        value: float,
        *,
        step: int | None,
        time: float,
        source: str,
        derived: bool,
        resolves: bool,
    ) -> Alert:
        """The episode's alert about ``value`` (of the judged series, or derived steps/sec):
        the drop, or with ``resolves`` the recovery."""
        assert self._baseline is not None
        baseline = self._baseline
        metric = DERIVED if derived else (self._series or DERIVED)
        label = f"{metric} (derived from timestamps)" if derived else metric
        share = value / baseline if baseline else math.inf
        if resolves:
            return Alert(
                rule=self.rule,
                severity=Severity.INFO,
                message=(
                    f"{label} back to {value:.4g} ({share:.0%} of its baseline {baseline:.4g})"
                    f" for {self.settings.resolve_after} values"
                ),
                time=time,
                source=source,
                step=step,
                metric=metric,
                value=value,
                resolves=True,
            )
        onset_step = self._low_since[0]
        since = f" since step {onset_step}" if onset_step is not None else ""
        return Alert(
            rule=self.rule,
            severity=self.settings.severity,
            message=(
                f"{label} down to {value:.4g} for {self._low_run} values{since}:"
                f" {share:.0%} of its baseline {baseline:.4g}"
                f" (the bar is {self.settings.fraction:.0%})"
            ),
            time=time,
            source=source,
            step=step,
            metric=metric,
            value=value,
            onset_step=onset_step,
            details={
                "baseline": baseline,
                "bar": low_bar(baseline, self.settings.fraction),
                "fraction_of_baseline": share,
                "low_values": self._low_run,
                "low_for_s": time - self._low_since[1],
                "derived": derived,
                "values": list(self._values),
            },
        )


__all__ = ["DERIVED", "THROUGHPUT_METRICS", "ThroughputDropConfig", "ThroughputDropDetector"]
