"""Small helpers the statistical rules share: a rolling window and warmup tracking.

Pure and cheap: each call is O(window) at worst, and windows are tens of values.
The bulk variants (``Rolling.extend``, ``Warmup.extend``, ...) take a replay block's
column in a few C-level passes and leave exactly the state the one-value calls leave.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Sequence
from itertools import accumulate, compress, count, islice
from math import isfinite
from operator import and_, ge, gt, indexOf, le, lt, sub

from sentinel.model.records import Block, Sample

#: Below this a window's least value could make a median of two overflow to -inf.
_TINY = -1e300

#: Windows apart whose medians seed ``Rolling.peak_median`` (one sort each).
_SEED_EVERY = 128


def finite_values(values: list[float]) -> list[float]:
    """The finite values, in order: ``values`` itself when every one is finite."""
    # A sum is finite only when every term is (or it overflowed: then filter anyway).
    if isfinite(sum(values)):
        return values
    return list(filter(isfinite, values))


def finite_with_steps(values: list[float], steps: list[int]) -> tuple[list[float], list[int]]:
    """The finite values and the steps of their lines (the lists themselves when all are)."""
    if isfinite(sum(values)):
        return values, steps
    mask = list(map(isfinite, values))
    return list(compress(values, mask)), list(compress(steps, mask))


def warmup_and_values(
    warmup: Warmup, block: Block, metric: str
) -> tuple[bool, list[float], list[int]] | None:
    """A block's part for a rule that judges ``metric`` after warmup: the learning rates
    taken into ``warmup``, then whether the block's lines were in warmup, and the metric's
    finite values with their steps; None when the block does not log the metric."""
    columns = block.columns
    column = columns.get(metric)
    rates = columns.get("lr")
    in_warmup = column is not None and bool(warmup.block_phase(block.step_range(), rates))
    warmup.extend(columns.get("lr"))
    if column is None:
        return None
    values, steps = finite_with_steps(column, block.steps)
    return in_warmup, values, steps


def never_above(
    values: list[float], bar: Callable[[float], float], prior: float, start: int
) -> bool:
    """Whether every ``values[i]`` from ``start`` on is at most ``bar`` of the least of
    ``prior`` and ``values[:i]``, with no value so low that a median could overflow.

    The proof the rolling-median rules accept a block with, for a ``bar`` that rises
    with its argument (the rule's own bar function): when a window holds only values
    from ``prior``'s window and the values before ``i`` (none of which was an outlier),
    its median is at least their least, so ``value <= bar(least)`` means
    ``value <= bar(median)``.
    """
    if start >= len(values):
        return True
    least = min(prior, min(values[:-1])) if len(values) > 1 else prior
    if least < _TINY:
        return False
    if max(values[start:]) <= bar(least):
        return True
    # The one bound for the whole block is too coarse (a falling series): line by line.
    leasts = accumulate(values, min, initial=prior)
    bars = map(bar, islice(leasts, start, None))
    return all(map(le, values[start:], bars))


def judged_mask(values: list[float], steps: Sequence[int], warmup_steps: int) -> list[bool] | None:
    """Which lines a rule judges: finite values at steps from ``warmup_steps`` on, as a mask
    for ``itertools.compress`` over the block's aligned columns; None when every line is
    (one cheap check: an overflowing sum still gives a mask, of True only)."""
    warm = bool(warmup_steps) and min(steps, default=warmup_steps) < warmup_steps
    if not warm:
        return None if isfinite(sum(values)) else list(map(isfinite, values))
    return list(map(and_, map(warmup_steps.__le__, steps), map(isfinite, values)))


def longest_run_at_least(positions: list[int], length: int) -> bool:
    """Whether ``length`` consecutive integers occur among the sorted distinct ``positions``."""
    return len(positions) >= length and (length - 1) in map(
        sub, islice(positions, length - 1, None), positions
    )


def majority_in_every_window(flags: list[bool], size: int, start: int) -> bool:
    """Whether every ``size`` consecutive flags ending at index ``start`` or later hold
    at least ``size // 2 + 1`` True: then a median of their values is on the True side
    (for an even ``size``, both middle values are).

    The first ``size - 1`` flags end no full run: where ``start`` is among them, each
    of those must be True (a median of fewer values is then on the True side too).
    """
    if start >= len(flags):
        return True
    if start < size - 1:
        if not all(flags[: size - 1]):
            return False
        start = size - 1
        if start >= len(flags):
            return True
    first = start + 1 - size
    if all(flags[first:]):
        return True
    totals = list(accumulate(flags, initial=0))
    fewest: int = min(map(sub, totals[start + 1 :], totals[first:]))
    return fewest >= size // 2 + 1


class Rolling:
    """The last ``size`` finite values of a series, with mean and median.

    A sorted copy of the window is kept up to date as values come and go, so the
    median, asked for on every sample by several rules, costs no sort.
    """

    __slots__ = ("_sorted", "size", "values")

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: deque[float] = deque(maxlen=size)
        self._sorted: list[float] = []

    def add(self, value: float) -> None:
        """Append a value; non-finite values are not a level and are ignored."""
        if not isfinite(value):
            return
        values = self.values
        ordered = self._sorted
        if len(values) == self.size:
            del ordered[bisect_left(ordered, values[0])]
        values.append(value)
        insort(ordered, value)

    def extend(self, values: list[float]) -> None:
        """``add`` each value, in order, in one pass.

        The sorted copy of a window is ``sorted`` of it: ``add`` inserts after equal
        values and removes the first of them, which keeps equal values (0.0 and -0.0)
        in window order, as the stable ``sorted`` does.
        """
        new = finite_values(values)
        if len(new) * 8 < self.size:
            # A few values into a long window: cheaper one by one than a sort.
            for value in new:
                self.add(value)
            return
        window = self.values
        window.extend(new[-self.size :])
        self._sorted[:] = sorted(window)

    def peak_median(self, values: list[float], floor: float) -> float:
        """The highest of ``floor`` and the medians of the full windows ``add`` of each of
        ``values`` in turn would leave; pure (``extend`` then takes the values).

        Only the windows whose median can beat the peak so far are sorted: a median is at
        most its window's rank-th largest value, so such a window holds ``rank`` of the values
        above the peak, ``rank`` consecutive ones of them less than ``size`` apart (C-level
        passes find those). The peak is seeded with a few windows' medians, and the values
        above it found again after each batch of sorted windows.
        """
        size = self.size
        series = [*self.values, *finite_values(values)]
        rank = size - size // 2
        # The windows series[j : j + size] that end on a new value, from the first full one.
        first = max(0, len(self.values) - size + 1)
        last = len(series) - size
        peak = floor
        for start in range(last, first - 1, -_SEED_EVERY):
            median = sorted_median(sorted(series[start : start + size]))
            if median > peak:
                peak = median
        start, batch = first, 16
        while start <= last:
            above = list(compress(count(start), map(peak.__lt__, islice(series, start, None))))
            spans = map(sub, islice(above, rank - 1, None), above)
            taken = 0
            for group in compress(count(), map(size.__gt__, spans)):
                # The windows holding above[group] .. above[group + rank - 1].
                end = min(above[group], last)
                for window in range(max(start, above[group + rank - 1] - size + 1), end + 1):
                    median = sorted_median(sorted(series[window : window + size]))
                    if median > peak:
                        peak = median
                    taken += 1
                start = max(start, end + 1)
                if taken >= batch:
                    batch *= 2
                    break
            else:
                return peak
        return peak

    def clear(self) -> None:
        self.values.clear()
        self._sorted.clear()

    @property
    def full(self) -> bool:
        return len(self.values) == self.values.maxlen

    def __len__(self) -> int:
        return len(self.values)

    def ordered(self) -> list[float]:
        """The window's values in ascending order (the rolling copy: do not change it)."""
        return self._sorted

    def least(self) -> float:
        """The smallest value in the window; +inf when it is empty."""
        return self._sorted[0] if self._sorted else math.inf

    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values)

    def median(self) -> float:
        ordered = self._sorted
        middle = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[middle]
        return (ordered[middle - 1] + ordered[middle]) / 2


class LazyRolling:
    """``Rolling`` for a series whose median is rarely asked for: adding is a deque append,
    the median sorts the window when asked (and keeps it until the next value)."""

    __slots__ = ("_median", "values")

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self._median: float | None = None

    def add(self, value: float) -> None:
        """Append a value; non-finite values are not a level and are ignored."""
        if isfinite(value):
            self.values.append(value)
            self._median = None

    def extend(self, values: list[float]) -> None:
        """``add`` each value, in order, in one pass."""
        new = finite_values(values)
        if new:
            self.values.extend(new[-(self.values.maxlen or len(new)) :])
            self._median = None

    def clear(self) -> None:
        self.values.clear()
        self._median = None

    @property
    def full(self) -> bool:
        return len(self.values) == self.values.maxlen

    def __len__(self) -> int:
        return len(self.values)

    def median(self) -> float:
        median = self._median
        if median is None:
            median = self._median = sorted_median(sorted(self.values))
        return median


def sorted_median(ordered: list[float]) -> float:
    """The median of sorted values, as ``statistics.median`` computes it."""
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


class Warmup:
    """Whether a step is still in warmup: the configured steps, or the LR still rising.

    Feed it every ``lr`` sample (``observe``); ``active(step)`` then says whether
    a rule should only learn at that step. ``warmup_steps`` counts global steps
    (a job resumed at step 1200 is past a 100-step warmup). The LR warmup ends
    at the first logged learning rate that is not higher than the one before
    it, and does not come back (a cyclic schedule's later rises are not warmup).
    """

    __slots__ = ("_last_lr", "lr_rising", "warmup_steps")

    def __init__(self, warmup_steps: int) -> None:
        self.warmup_steps = warmup_steps
        self._last_lr: float | None = None
        #: None until two learning rates were seen; False for good once one did not rise.
        #: Rules test it inline on their hot path: ``observe`` does nothing once it is False.
        self.lr_rising: bool | None = None

    def reset(self) -> None:
        """A new attempt: what the learning rate does is learned again."""
        self._last_lr = None
        self.lr_rising = None

    def observe(self, sample: Sample) -> None:
        if sample.name != "lr" or not math.isfinite(sample.value) or self.lr_rising is False:
            return
        if self._last_lr is not None:
            self.lr_rising = sample.value > self._last_lr
        self._last_lr = sample.value

    def active(self, step: int | None) -> bool:
        if self.lr_rising:
            return True
        return step is not None and step < self.warmup_steps

    def extend(self, rates: list[float] | None) -> None:
        """``observe`` each learning rate of a block's ``lr`` column (None: no column)."""
        if rates is None or self.lr_rising is False:
            return
        rates = finite_values(rates)
        if not rates:
            return
        last = self._last_lr
        chain = rates if last is None else [last, *rates]
        if len(chain) < 2:
            self._last_lr = chain[-1]
            return
        try:
            # The first rate not above the one before ends the warmup, and is the last kept.
            fall = indexOf(map(ge, chain, islice(chain, 1, None)), True)
        except ValueError:
            self.lr_rising, self._last_lr = True, chain[-1]
        else:
            self.lr_rising, self._last_lr = False, chain[fall + 1]

    def block_phase(self, step_range: tuple[int, int], rates: list[float] | None) -> bool | None:
        """Whether every line of a block is in warmup (True), none is (False), or it changes
        inside the block or cannot be told cheaply (None).

        ``step_range`` is the block's lowest and highest step (``Block.step_range``),
        ``rates`` its ``lr`` column, None when it has none. Pure: the state moves on with
        ``extend`` once the block is taken.
        """
        lowest, highest = step_range
        rising = self.lr_rising
        if rising and (rates is None or self._keeps_rising(rates)):
            return True
        if highest < self.warmup_steps:
            return True
        # The LR can end a warmup only while it is still being learned.
        settled = rising is False or (rising is None and rates is None)
        if settled and lowest >= self.warmup_steps:
            return False
        return None

    def _keeps_rising(self, rates: list[float]) -> bool:
        """Whether each rate is finite and above the one before, from the last seen."""
        if not rates or not isfinite(sum(rates)):
            return False
        last = self._last_lr
        if last is None or not rates[0] > last:
            return False
        return all(map(lt, rates, islice(rates, 1, None)))


def rising_steps(steps: list[int], last_step: int | None) -> list[bool] | None:
    """Which lines bring a new step (one past every step before it, ``last_step`` the
    one before the block); None when every line does (the usual block: one pass)."""
    first = steps[0]
    if last_step is None or first > last_step:
        stride = steps[1] - first if len(steps) > 1 else 1
        if stride > 0 and steps == list(range(first, first + stride * len(steps), stride)):
            return None
    floor = first - 1 if last_step is None else last_step
    # The highest step before each line: a line is a new step when it passes it.
    new = list(map(gt, steps, accumulate(steps, max, initial=floor)))
    return None if all(new) else new
