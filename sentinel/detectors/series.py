"""Small helpers the statistical rules share: a rolling window and warmup tracking.

Pure and cheap: each call is O(window) at worst, and windows are tens of values.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from math import isfinite

from sentinel.records import Sample


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

    def clear(self) -> None:
        self.values.clear()
        self._sorted.clear()

    @property
    def full(self) -> bool:
        return len(self.values) == self.values.maxlen

    def __len__(self) -> int:
        return len(self.values)

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
