"""divergence's settings and its decision: the bars a shift must clear, and one metric's
history and candidate shift.

Apart from the rule so that each reads in one sitting. The decision is written once:
``opens_shift`` is what ``observe`` asks of each value, and ``never_opens``, replay's proof
that a block holds no such value, bounds it with ``rise_bar``, the least bar
``opens_shift`` can use.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import partial

from pydantic import Field, model_validator

from sentinel.model.records import Severity
from sentinel.rules.base import MetricNames, MetricRuleConfig
from sentinel.rules.noise import robust_sigma
from sentinel.rules.series import Rolling, never_above, sorted_median


class DivergenceConfig(MetricRuleConfig):
    """``[rules.divergence]``: a shift of the loss up that does not recover."""

    #: Metrics judged, each on its own (the first that confirms raises the incident).
    metrics: MetricNames = Field(default_factory=lambda: ["loss"], min_length=1)
    severity: Severity = Severity.CRITICAL
    #: Values (not part of a shift) the noise and envelope are taken over.
    window: int = Field(default=50, ge=10, le=10_000)
    #: The latest of those whose median is the level before a shift.
    level_window: int = Field(default=10, ge=3)
    #: Values the history needs before anything is judged.
    min_history: int = Field(default=20, ge=3)
    #: A shift is above this multiple of the level...
    rise: float = Field(default=1.3, gt=1.0)
    #: ...and above the level plus this many robust standard deviations of the history...
    noise_sigmas: float = Field(default=4.0, gt=0)
    #: ...and above this quantile of the history (the top of the run's normal wobble).
    envelope: float = Field(default=0.9, ge=0.5, le=1.0)
    #: The noise is at least this fraction of the level (a flat loss has a MAD of 0).
    noise_floor: float = Field(default=0.01, ge=0)
    #: A value at most this multiple of the level (or the level plus one noise) is back.
    recover: float = Field(default=1.1, gt=1.0)
    #: Values since the onset, still above the bar at their median, that confirm a shift.
    patience: int = Field(default=10, ge=2)

    @model_validator(mode="after")
    def _coherent(self) -> DivergenceConfig:
        if not self.level_window <= self.min_history <= self.window:
            raise ValueError("need level_window <= min_history <= window")
        if self.patience >= self.window:
            raise ValueError("patience must be less than window")
        if self.recover >= self.rise:
            raise ValueError("recover must be less than rise")
        return self


@dataclass(frozen=True, slots=True)
class Bars:
    """Where a metric stands before a shift: its level, noise and the two bars."""

    level: float
    noise: float
    shift: float
    back: float


def quantile(ordered: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of sorted values (nearest rank below)."""
    return ordered[int(fraction * (len(ordered) - 1))]


def rise_bar(level: float, rise: float) -> float:
    """The least a shift bar can be over ``level``: ``rise`` x it (rising with the level)."""
    return rise * level


def bars(history: Rolling, recent: list[float], settings: DivergenceConfig) -> Bars:
    """The level (median of ``recent``), the noise of ``history``, the shift and recovery bars."""
    level = sorted_median(sorted(recent))
    ordered = history.ordered()
    noise = robust_sigma(ordered, level, settings.noise_floor)
    shift = max(
        settings.rise * level,
        level + settings.noise_sigmas * noise,
        quantile(ordered, settings.envelope),
    )
    back = max(settings.recover * level, level + noise)
    return Bars(level, noise, shift, back)


def opens_shift(
    value: float, history: Rolling, recent: list[float], settings: DivergenceConfig
) -> Bars | None:
    """The bars ``value`` clears (it opens a candidate shift), or None when it is under
    them: a level <= 0 means nothing, and a value under ``rise_bar`` of the level is
    under every bar (the cheap test, before the noise is taken)."""
    level = sorted_median(sorted(recent))
    if level <= 0 or value <= rise_bar(level, settings.rise):
        return None
    current = bars(history, recent, settings)
    return current if value > current.shift else None


def never_opens(values: list[float], least: float, start: int, settings: DivergenceConfig) -> bool:
    """Block path: no value from ``start`` on can open a shift, ``least`` the least of the
    values the level is taken over before them (``never_above`` with ``opens_shift``'s
    least bar, ``rise_bar``: a level is never under the least of its values); False for a
    ``least`` <= 0, where ``opens_shift`` judges nothing by a ratio."""
    return least > 0 and never_above(values, partial(rise_bar, rise=settings.rise), least, start)


@dataclass(slots=True)
class Shift:
    """A candidate shift: where it started and what came since."""

    bars: Bars
    onset_step: int | None
    before: list[tuple[int | None, float]]
    since: list[tuple[int | None, float]] = field(default_factory=list)
    confirmed: bool = False


class ShiftSeries:
    """One metric: its history and its candidate shift."""

    __slots__ = ("history", "recent", "resumed", "shift", "steps")

    def __init__(self, settings: DivergenceConfig) -> None:
        self.history = Rolling(settings.window)
        #: The step of each value in ``history``, in the same order.
        self.steps: deque[int | None] = deque(maxlen=settings.window)
        #: The latest values not part of a shift, with their steps.
        self.recent: deque[tuple[int | None, float]] = deque(maxlen=settings.level_window)
        self.shift: Shift | None = None
        #: A new attempt began: its first step says how much of the history still holds.
        self.resumed = False

    def learn(self, step: int | None, value: float) -> None:
        self.history.add(value)
        self.steps.append(step)
        self.recent.append((step, value))

    def learn_all(self, values: list[float], steps: list[int]) -> None:
        """``learn`` each of a block's values, in order."""
        self.history.extend(values)
        self.steps.extend(steps)
        kept = self.recent.maxlen or len(values)
        self.recent.extend(zip(steps[-kept:], values[-kept:], strict=True))

    def forget_shift(self) -> None:
        """The candidate shift is over: its values are the run's own, learned."""
        shift, self.shift = self.shift, None
        if shift is not None:
            for step, value in shift.since:
                self.learn(step, value)

    def resume_at(self, step: int | None) -> None:
        """Keep the history from before ``step``, where the new attempt resumed (a rollback
        to a clean checkpoint: the level it had then); a restart from scratch keeps none."""
        kept = [
            (before, value)
            for before, value in zip(self.steps, self.history.values, strict=True)
            if step is not None and before is not None and before < step
        ]
        self.history.clear()
        self.steps.clear()
        self.recent.clear()
        for before, value in kept:
            self.learn(before, value)
        self.resumed = False
