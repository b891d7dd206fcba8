"""``cost_overrun``'s settings and state, and what a replay block does to its spend and
step rate, a column at a time.

``CostOverrunConfig`` is ``[rules.cost_overrun]``; ``CostState`` the spend and progress
the rule's hooks move; ``reached_levels`` the budget levels a spend reaches. The block
path of ``sentinel.rules.cost_overrun``: ``taken`` works out the state a block fed
line by line leaves (or None unless the block is calm), ``projection_holds`` whether the
projection at each of its new steps leaves the open/closed state as it is. Both repeat
the detector's own float operations in the same order, so the state they give is the
line-by-line state bit for bit.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice, repeat
from operator import add, gt, itemgetter, le, lt, mul, sub, truediv
from typing import ClassVar, Literal, NamedTuple

from pydantic import Field, model_validator

from sentinel.model.cost import SECONDS_PER_HOUR
from sentinel.model.machine import GPU_JOB
from sentinel.model.records import Block
from sentinel.rules.base import MetricNames, RuleConfig
from sentinel.rules.series import rising_steps

#: Relative slack when comparing spend to a level: 80.0 reached through float sums is 80%.
_EPSILON = 1e-9


class CostOverrunConfig(RuleConfig):
    """``[rules.cost_overrun]``.

    DESIGN's table: warn at 80% of the budget spent, critical at 100%, and warn
    when the projection at completion passes 120%. The projection waits for ten
    minutes and ten steps of progress in an attempt: the first minutes of a run
    (compilation, data-loader warmup, a first evaluation) are slower than the rest,
    and a projection from them would cry wolf at every start.
    """

    renamed: ClassVar[Mapping[str, str]] = {"kill_at": "kill_fraction"}

    #: The run's budget, in the currency of ``[cost] price_per_gpu_hour``. Unset: silent.
    budget: float | None = Field(default=None, gt=0)
    #: Fraction of the budget spent that warns.
    warn_fraction: float = Field(default=0.8, gt=0)
    #: Fraction of the budget spent that is critical.
    critical_fraction: float = Field(default=1.0, gt=0)
    #: Fraction of the budget at which sentinel stops the job (no restart). Unset: never.
    kill_fraction: float | None = Field(default=None, gt=0)
    #: The projection at completion warns above ``budget x (1 + projected_margin)``
    #: (the runbooks' 20%); it resolves once back at or under the budget itself.
    projected_margin: float = Field(default=0.2, ge=0)
    #: Seconds of progress the step rate is measured over: long enough to average out an
    #: evaluation or a checkpoint save, short enough to notice a slowdown within the hour.
    rate_window_s: float = Field(default=1800.0, gt=0)
    #: Seconds of progress in the current attempt before projecting (after a restart too).
    projection_min_s: float = Field(default=600.0, ge=0)
    #: Steps of progress in the current attempt before projecting.
    projection_min_steps: int = Field(default=10, ge=1)
    #: Metrics whose steps tell progress (the first sample of each new step counts).
    step_metrics: MetricNames = Field(default_factory=lambda: ["loss", "grad_norm", "lr"])
    #: Restarting a job that is over budget spends more: notify by default.
    on_critical: Literal["notify", "stop", "restart"] = "notify"

    @model_validator(mode="after")
    def _ordered(self) -> CostOverrunConfig:
        if self.warn_fraction >= self.critical_fraction:
            raise ValueError(
                f"warn_fraction ({self.warn_fraction:g}) must be less than"
                f" critical_fraction ({self.critical_fraction:g})"
            )
        if self.kill_fraction is not None and self.kill_fraction < self.critical_fraction:
            raise ValueError(
                f"kill_fraction ({self.kill_fraction:g}) must be at least"
                f" critical_fraction ({self.critical_fraction:g}): it stops the job"
                " only after the critical alert"
            )
        return self


@dataclass(slots=True)
class CostState:
    """What ``cost_overrun`` knows of the run's spend and of the current attempt's progress."""

    gpu_s: float = 0.0
    #: Seconds held before any GPU count was known: charged at the first count known
    #: (the GPU source attributes the GPUs a poll or two after the job took them).
    unknown_s: float = 0.0
    #: Start of the interval not yet charged, while an attempt runs; else None.
    since: float | None = None
    #: GPU count at ``since`` (the last one known).
    gpus: int | None = None
    started: bool = False
    #: Budget fractions already alerted on (warn, critical, kill), for the whole run.
    raised: set[str] = field(default_factory=set)
    projection_open: bool = False
    last_step: int | None = None
    #: (time, step) of each new step of the current attempt, within the rate window.
    progress: deque[tuple[float, int]] = field(default_factory=deque)
    #: (time, step) of the current attempt's first step: the evidence starts there.
    first: tuple[float, int] | None = None


def reached_levels(settings: CostOverrunConfig, price: float | None, gpu_s: float) -> list[str]:
    """The levels (warn, critical, kill) ``gpu_s`` GPU-seconds of spend reach: a prefix."""
    budget = settings.budget
    if budget is None or price is None or gpu_s <= 0:
        return []
    spent = gpu_s / SECONDS_PER_HOUR * price
    levels = (
        ("warn", settings.warn_fraction),
        ("critical", settings.critical_fraction),
        ("kill", settings.kill_fraction),
    )
    return [
        name
        for name, fraction in levels
        if fraction is not None and spent >= fraction * budget * (1 - _EPSILON)
    ]


class Taken(NamedTuple):
    """What a block fed line by line leaves of the spend and the step rate: the clock
    charged up to, GPU-seconds, unknown seconds, the new steps' (time, step) points, and
    how many of the rate's points (those kept, then the new) the window drops."""

    since: float | None
    gpu_s: float
    unknown_s: float
    points: list[tuple[float, int]]
    dropped: int


def taken(
    state: CostState,
    settings: CostOverrunConfig,
    block: Block,
    *,
    step_metrics: frozenset[str],
    gpu_count: int | None,
    price: float | None,
    max_steps: int | None,
    judge: bool,
) -> Taken | None:
    """What ``block`` leaves of the rule's spend and step rate (``state``, with the run's
    GPU count, price and total steps given); None unless it is calm (the projections are
    judged only when ``judge``: ``absorb`` knows they hold)."""
    budget, since, gpus = settings.budget, state.since, state.gpus
    gpu_s, unknown_s, count = state.gpu_s, state.unknown_s, gpu_count
    if budget is None:
        return Taken(since, gpu_s, unknown_s, [], 0)  # no hook does anything
    watched = not step_metrics.isdisjoint(block.names)
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
    reached = reached_levels(settings, price, gpu_s)
    if reached and reached[-1] not in state.raised:
        return None  # spend passes a level within the block
    steps = block.steps
    new = rising_steps(steps, state.last_step)
    if new is None:
        points = list(zip(clock, steps, strict=True))
    else:
        points = list(zip(compress(clock, new), compress(steps, new), strict=True))
        charged = list(compress(charged, new))
    if not watched or not points:
        return Taken(clock[-1], gpu_s, unknown_s, [], 0)
    window = [*state.progress, *points]
    times = list(map(itemgetter(0), window))
    kept = len(window) - len(points)
    if not all(map(le, times, islice(times, 1, kept + 1))):
        return None  # points kept out of time order (a live clock that went back)
    if (
        judge
        and charged
        and price is not None
        and max_steps is not None
        and not projection_holds(state, settings, window, times, kept, charged, price, max_steps)
    ):
        return None
    # At each new step observe drops the points before the last one at or before
    # now - window; the times only grow, so the drop at the last step covers them all.
    dropped = bisect_right(times, times[-1] - settings.rate_window_s) - 1
    return Taken(clock[-1], gpu_s, unknown_s, points, max(dropped, 0))


def projection_holds(
    state: CostState,
    settings: CostOverrunConfig,
    window: list[tuple[float, int]],
    times: list[float],
    kept: int,
    charged: list[float],
    price: float,
    max_steps: int,
) -> bool:
    """Whether the projection at each new step (``window[kept:]``, with the GPU-seconds
    ``charged`` then) leaves ``state.projection_open`` as it is: the rule's own float
    operations, a column at a time."""
    budget, gpus = settings.budget, state.gpus
    if budget is None or gpus is None:
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
    started_s, started_step = state.first or window[kept]
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
    if state.projection_open:
        return not any(map(le, projected, repeat(budget)))
    return not any(map(gt, projected, repeat(budget * (1 + settings.projected_margin))))


__all__ = [
    "CostOverrunConfig",
    "CostState",
    "Taken",
    "projection_holds",
    "reached_levels",
    "taken",
]
