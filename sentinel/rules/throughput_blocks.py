"""throughput_drop's settings and block path: ``[rules.throughput_drop]``, the values a
replay block hands its judge, and the proof that none of them raises an alert.

Pure functions of the block and of the rule's state, in a few C-level passes; the rule
(``throughput_drop.py``) asks them in ``can_absorb`` and ``absorb``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate, chain, compress, count, islice, repeat
from operator import gt, lt, not_, sub, truediv
from typing import NamedTuple

from pydantic import Field

from sentinel.model.records import Block
from sentinel.rules.base import MetricNames, MetricRuleConfig
from sentinel.rules.series import Warmup, judged_mask, longest_run_at_least

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

    DESIGN's table: "< 50% of the run's baseline, sustained". Five values in a row
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
    if closes:
        chain_steps, chain_times = close_steps, close_times
        if previous is not None:
            chain_steps, chain_times = [previous[1], *close_steps], [previous[0], *close_times]
        previous = (close_times[-1], close_steps[-1])
    else:
        chain_steps, chain_times = [], []
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
