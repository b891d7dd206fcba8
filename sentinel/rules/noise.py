"""The run's own noise: robust scales the statistical rules judge a change against.

A ratio says nothing near zero (0.0008 against 0.0003 is "2.7x"), and a loss with a
rhythm (the same rise and fall every epoch) has swings that a short window takes for
spikes. So a change is news only when it is also large against the run's own wobble:
the median absolute deviation of a long window of its values, as a standard deviation,
with a floor so that a flat series (MAD 0) does not make every change news.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from itertools import pairwise

from sentinel.rules.series import sorted_median

#: 1 / Phi^-1(3/4): the median absolute deviation of a normal sample times this is its sigma.
MAD_TO_SIGMA = 1.4826


def robust_sigma(values: Iterable[float], level: float, floor: float) -> float:
    """The robust standard deviation of ``values`` (1.4826 x their MAD), at least
    ``floor`` x ``|level|``."""
    ordered = sorted(values)
    if not ordered:
        return floor * abs(level)
    middle = sorted_median(ordered)
    deviation = sorted_median(sorted(abs(value - middle) for value in ordered))
    return max(MAD_TO_SIGMA * deviation, floor * abs(level))


def above_noise(
    value: float, level: float, window: deque[float], sigmas: float, floor: float
) -> bool:
    """Whether ``value`` is more than ``sigmas`` robust standard deviations of ``window``
    above ``level``."""
    return value - level > sigmas * robust_sigma(window, level, floor)


def beyond_seen(value: float, window: deque[float], factor: float) -> bool:
    """Whether ``value`` is far beyond anything in ``window``: above ``factor`` x its
    highest value (an empty window has shown nothing)."""
    return bool(window) and max(window) > 0 and value > factor * max(window)


def wobble(values: Iterable[float]) -> float:
    """The robust standard deviation of ``values`` around their trend: of the differences
    from one value to the next (1.4826 x their MAD, over sqrt 2, each difference holding
    two values' noise), so a loss still falling fast early in a run is not taken for
    noise; 0 for fewer than 3 values."""
    steps = sorted(b - a for a, b in pairwise(values))
    if len(steps) < 2:
        return 0.0
    middle = sorted_median(steps)
    deviation = sorted_median(sorted(abs(step - middle) for step in steps))
    return MAD_TO_SIGMA * deviation / math.sqrt(2)


#: The variance of a second difference (a - 2b + c) of independent values is 6 of theirs.
_SECOND_DIFFERENCE = math.sqrt(6)


def bend(values: Iterable[float]) -> float:
    """The robust standard deviation of ``values`` around a trend that bends smoothly: of
    their second differences (1.4826 x their MAD, over sqrt 6), so a loss early in a run,
    falling fast and ever slower (its step from one value to the next shrinking as it
    goes), is not taken for noise as ``wobble`` takes it; 0 for fewer than 5 values."""
    ordered = list(values)
    if len(ordered) < 5:
        return 0.0
    steps = [b - a for a, b in pairwise(ordered)]
    bends = sorted(b - a for a, b in pairwise(steps))
    middle = sorted_median(bends)
    deviation = sorted_median(sorted(abs(value - middle) for value in bends))
    return MAD_TO_SIGMA * deviation / _SECOND_DIFFERENCE


def how_far_above(value: float, level: float, noise: float) -> str:
    """How far ``value`` is above ``level``, in words: a ratio where the level is above 0
    (three significant figures from a thousand on); at or below it, where no ratio means
    anything, in ``noise`` (robust standard deviations of the run)."""
    if level > 0:
        ratio = value / level
        return f"{ratio:.2f}x" if ratio < 1000 else f"{ratio:.3g}x"
    return f"{(value - level) / noise:.0f} noise deviations above"
