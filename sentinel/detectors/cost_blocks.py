"""What a replay block does to ``cost_overrun``'s spend and step rate, a column at a time.

The block path of ``sentinel.detectors.cost_overrun``: ``taken`` works out the state a
block fed line by line leaves (or None unless the block is calm), ``projection_holds``
whether the projection at each of its new steps leaves the open/closed state as it is.
Both repeat the detector's own float operations in the same order, so the state they
give is the line-by-line state bit for bit.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate, compress, islice, repeat
from operator import add, gt, itemgetter, le, lt, mul, sub, truediv
from typing import TYPE_CHECKING, NamedTuple

from sentinel.cost import SECONDS_PER_HOUR
from sentinel.detectors.series import rising_steps
from sentinel.records import Block
from sentinel.sources import GPU_JOB

if TYPE_CHECKING:
    from sentinel.detectors.cost_overrun import CostOverrunDetector


class Taken(NamedTuple):
    """What a block fed line by line leaves of the spend and the step rate: the clock
    charged up to, GPU-seconds, unknown seconds, the new steps' (time, step) points, and
    how many of the rate's points (those kept, then the new) the window drops."""

    since: float | None
    gpu_s: float
    unknown_s: float
    points: list[tuple[float, int]]
    dropped: int


def taken(detector: CostOverrunDetector, block: Block, *, judge: bool) -> Taken | None:
    """What ``block`` leaves of ``detector``'s spend and step rate; None unless it is calm
    (the projections are judged only when ``judge``: ``absorb`` knows they hold)."""
    budget, since, gpus = detector.settings.budget, detector._since, detector._gpus
    gpu_s, unknown_s, count = detector._gpu_s, detector._unknown_s, detector.facts.gpu_count
    if budget is None:
        return Taken(since, gpu_s, unknown_s, [], 0)  # no hook does anything
    watched = not detector._step_metrics.isdisjoint(block.names)
    if since is None or not (watched or block.ticks):
        # No hook runs, or observe waits for an attempt to start, which a tick starts.
        return None if since is None and block.ticks else Taken(since, gpu_s, unknown_s, [], 0)
    if GPU_JOB in block.names or (count is not None and count != gpus):
        return None  # the GPU count changes
    if gpus is not None and unknown_s:
        return None  # time held before the count was known is charged now
    # Every line's hooks charge up to its clock (a tick, or the samples it watches);
    # a line the clock did not move charges 0.0, which adds nothing.
    clock = block.clock
    held_s = list(map(sub, clock, [since, *clock[:-1]]))
    if min(held_s) < 0:
        return None  # a clock going back: line by line
    charged: list[float] = []
    if gpus is None:
        unknown_s = list(accumulate(held_s, add, initial=unknown_s))[-1]
    else:
        charged = list(accumulate(map(mul, held_s, repeat(gpus)), add, initial=gpu_s))[1:]
        gpu_s = charged[-1]
    reached = detector._reached(gpu_s)
    if reached and reached[-1] not in detector._raised:
        return None  # spend passes a level within the block
    steps = block.steps
    new = rising_steps(steps, detector._last_step)
    if new is None:
        points = list(zip(clock, steps, strict=True))
    else:
        points = list(zip(compress(clock, new), compress(steps, new), strict=True))
        charged = list(compress(charged, new))
    if not watched or not points:
        return Taken(clock[-1], gpu_s, unknown_s, [], 0)
    window = [*detector._progress, *points]
    times = list(map(itemgetter(0), window))
    kept = len(window) - len(points)
    if not all(map(le, times, islice(times, 1, kept + 1))):
        return None  # points kept out of time order (a live clock that went back)
    if judge and charged and not projection_holds(detector, window, times, kept, charged):
        return None
    # At each new step observe drops the points before the last one at or before
    # now - window; the times only grow, so the drop at the last step covers them all.
    dropped = bisect_right(times, times[-1] - detector.settings.rate_window_s) - 1
    return Taken(clock[-1], gpu_s, unknown_s, points, max(dropped, 0))


def projection_holds(
    detector: CostOverrunDetector,
    window: list[tuple[float, int]],
    times: list[float],
    kept: int,
    charged: list[float],
) -> bool:
    """Whether the projection at each new step (``window[kept:]``, with the GPU-seconds
    ``charged`` then) leaves ``detector._projection_open`` as it is: ``_project``'s own
    float operations, a column at a time."""
    settings, facts, gpus = detector.settings, detector.facts, detector._gpus
    budget, price, max_steps = settings.budget, facts.price_per_gpu_hour, facts.max_steps
    if budget is None or price is None or max_steps is None or gpus is None:
        return True  # no projection
    # The window's first point at each new step: the last at or before now - window,
    # or the one it started at for the step before (observe's popleft).
    now = times[kept:]
    starts = map(sub, now, repeat(settings.rate_window_s))
    lasts = map(bisect_right, repeat(times), starts, repeat(0), range(kept + 1, len(times) + 1))
    heads = accumulate(map(sub, lasts, repeat(1)), max, initial=0)
    next(heads)
    firsts = list(map(window.__getitem__, heads))
    step = list(map(itemgetter(1), window[kept:]))
    started_s, started_step = detector._first or window[kept]
    # Too soon in the attempt is a prefix (time and step only grow); then a step is
    # judged when the window spans some time (and so some steps).
    soon = max(
        bisect_left(now, settings.projection_min_s, key=lambda at: at - started_s),
        bisect_left(step, settings.projection_min_steps, key=lambda at: at - started_step),
    )
    first_s = list(map(itemgetter(0), firsts))
    judged = [False] * soon + list(map(lt, first_s[soon:], now[soon:]))
    now, step = list(compress(now, judged)), list(compress(step, judged))
    first_s = list(compress(first_s, judged))
    first_step = list(compress(map(itemgetter(1), firsts), judged))
    rate = map(truediv, map(sub, step, first_step), map(sub, now, first_s))
    remaining = map(max, map(sub, repeat(max_steps), step), repeat(0))
    future = map(mul, map(mul, map(truediv, remaining, rate), repeat(gpus)), repeat(price))
    hours = map(truediv, compress(charged, judged), repeat(SECONDS_PER_HOUR))
    projected = map(
        add, map(mul, hours, repeat(price)), map(truediv, future, repeat(SECONDS_PER_HOUR))
    )
    if detector._projection_open:
        return not any(map(le, projected, repeat(budget)))
    return not any(map(gt, projected, repeat(budget * (1 + settings.projected_margin))))


__all__ = ["Taken", "projection_holds", "taken"]
