"""divergence: the loss shifted up and did not come back.

A spike that recovers is ``loss_spike``'s warning; a loss that climbs and then stays
above where it was (a learning rate raised by mistake, a bad resume, a run that
blew up and settled on a worse level) wastes the rest of the run while looking
calm. This rule makes that its own critical incident, whose onset is the first
value of the shift, so the rollback goes back to a checkpoint before it.

Per watched metric (``metrics``, default the train loss):

- ``history``: the last ``window`` values that were not part of a shift (long enough
  to hold a per-epoch rhythm); ``level``: the median of the last ``level_window`` of them
  (while the run still falls through them, the median of the last ``FALLING``: where the
  run is now, not where it was);
  ``settled``: the history from its first value at or under the level on (a descent
  before it, early in a run, is neither noise nor envelope); ``noise``: 1.4826 x the
  median absolute deviation of ``settled`` (a robust standard deviation), at least
  ``noise_floor`` x the level.
- A value opens a candidate shift when it is above the bar: the highest of ``rise`` x the
  level, the level plus ``noise_sigmas`` x the noise, the ``envelope`` quantile of
  ``settled`` (what the run shows at the top of its normal wobble or rhythm), and the level
  plus ``SCALE_FLOOR`` of where the run began (``scale_floor``: ratios to a level near 0
  mean little).
- The candidate recovers (is forgotten, its values learned as normal) at the first value
  at most the recovery bar: ``recover`` x the level, or the level plus the noise.
- It is confirmed, critical, once ``patience`` values have come since its onset and the
  median of the last ``patience`` is still above the bar. A candidate that neither
  recovers nor confirms for a whole ``window`` is a new normal: learned.

Judged from few values too (a run that logs six values in all, a watcher attached just
before the failure): once the history holds ``early_history`` values and until it holds
``min_history``, the level is the least of the last ``early_level`` values (a loss early
in a run still falls fast: a median of them lags above it), the noise is taken from one
value to the next (the trend left out), the envelope is not used, and a value that
continues a climb (the last ``early_level`` values each above the one before: a
rhythm's rising half) opens no shift: a few values show no rhythm, only steps; unless it
rises past the highest value before the climb by ``rise`` (with ``early_history`` values
or more before it), where no rhythm is coming back, or the values before it were a run
learning (``DESCENT`` or more, falling ever slower: a rhythm's falling half does not slow
so), when it is judged from its trough. With so
little known such a shift is ``early_severity`` (a warning) unless the logged learning
rate jumped within its evidence to above anything it had been (no schedule's restart or
cycle does), or its values stay ``DECADE`` (10) times the median before it or more, floored at
``SCALE_FLOOR`` of where the run began (no healthy loss does), when it is ``severity``; it
is confirmed by ``early_patience`` values (a run that logs a few values in all has few after
the onset), or by ``CORROBORATED`` when an
evaluation since the onset shows the eval loss rose with it (``eval_signal``). After a
descent (``DESCENT`` values or more before the onset, each under the one before) the
shifted run keeps falling as the run did, and its median sinks under the shift bar: there
``early_patience`` values that none came back to the level confirm it.

During warmup (configured steps, or the logged LR still rising: the loss may wobble up
as the rate climbs) a shift is judged as from few values, a warning. With fewer than
``early_history`` values, from ``SCANT_HISTORY``, only a value ``SCANT_RISE`` x the least of
them opens a shift (confirmed, a warning, by ``early_patience`` values above ``rise`` x
that least); nothing is judged with
fewer, or while the level is <= 0 (a ratio to it means nothing). Non-finite values are
``nan_inf``'s business and are skipped. A confirmed shift resolves (info) when the metric
comes back under the recovery bar. A replayed log that ends while a shift is open, not yet
confirmed, warns when ``CORROBORATED`` values or more since its onset stay above its bar
at their median (``log_ended``): an excerpt that ends two values after the loss doubled;
values ``ORDERS_OF_MAGNITUDE`` (100) times the level are ``severity`` there too.

``details``: ``kind`` (``"unrecovered"`` or ``"recovered"``), ``metric``, ``level``,
``early`` (judged from fewer than ``min_history`` values),
``noise``, ``threshold`` (the bar), ``recover_threshold``, ``onset_step``, ``ratio``
(median since onset / level), ``values``/``steps`` (the last ``level_window`` values
before the onset and those since), ``lr_jump`` (``[step, before, after]`` of a jump of
the logged learning rate within that evidence, else None), ``changed_after`` (the step of
the rate logged before that jump: the diagnosis moves the incident's onset back to it).

The settings and the decision (``opens_shift``, and ``never_opens``, replay's proof that a
block holds no value it would open a shift on) are in ``divergence_shift``; the learning
rate's jumps in ``lr_jumps``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import islice, pairwise
from typing import Any

from pydantic import Field, model_validator

from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricNames, MetricRuleConfig, Reading, Recent
from sentinel.rules.eval_signal import EVAL_METRIC, EvalSignal
from sentinel.rules.lr_jumps import LrJumps
from sentinel.rules.noise import bend, how_far_above, robust_sigma, wobble
from sentinel.rules.series import (
    Rolling,
    Warmup,
    finite_values,
    finite_with_steps,
    never_above,
    sorted_median,
)


class DivergenceConfig(MetricRuleConfig):
    """``[rules.divergence]``: a shift of the loss up that does not recover."""

    #: Metrics judged, each on its own (the first that confirms raises the incident).
    metrics: MetricNames = Field(default_factory=lambda: ["loss"], min_length=1)
    severity: Severity = Severity.CRITICAL
    #: Values (not part of a shift) the noise and envelope are taken over.
    window: int = Field(default=50, ge=10, le=10_000)
    #: The latest of those whose median is the level before a shift.
    level_window: int = Field(default=10, ge=3)
    #: Values the history needs before it is judged with its noise and envelope...
    min_history: int = Field(default=20, ge=3)
    #: ...and before anything is judged: from here to ``min_history`` by ``early_level``.
    early_history: int = Field(default=3, ge=2)
    #: With fewer than ``min_history`` values, the latest of them whose least is the level.
    early_level: int = Field(default=3, ge=1)
    #: Severity of a shift judged from fewer than ``min_history`` values, unless the logged
    #: learning rate jumped within its evidence.
    early_severity: Severity = Severity.WARNING
    #: Values since the onset, at their median above the bar, that confirm such a shift (a
    #: run that logs a few values in all has few after the onset).
    early_patience: int = Field(default=3, ge=2)
    #: A shift is above this multiple of the level...
    rise: float = Field(default=1.3, gt=1.0)
    #: ...and above the level plus this many robust standard deviations of the history
    #: since it settled at its level (from its first value at or under it)...
    noise_sigmas: float = Field(default=4.0, gt=0)
    #: ...and above this quantile of that history (the top of the run's normal wobble).
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
        if self.early_history > self.min_history:
            raise ValueError("early_history must not exceed min_history")
        if self.early_level > self.level_window:
            raise ValueError("early_level must not exceed level_window")
        if self.early_patience > self.patience:
            raise ValueError("early_patience must not exceed patience")
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


#: From this many values known, before ``early_history``: a value ``SCANT_RISE`` x the least
#: of them opens a shift judged from them alone (a LoRA run logging every 25 iterations whose
#: loss more than doubles after its second value). So little known shows no noise: only a
#: ratio that needs none says anything, and a smaller one is learned.
SCANT_HISTORY = 2
SCANT_RISE = 2.0

#: The least a shift rises above its level, as a fraction of where the run began
#: (``scale_floor``): ratios to a level near 0 mean little (a P-Tuning run's 0.0077 ->
#: 0.012, +0.004 after a fall from 4.26, came back by itself, and was a critical).
SCALE_FLOOR = 0.01
#: The first values learned whose median is where the run began.
START_VALUES = 3

#: A shift judged from few values whose values stay this many times the level is critical:
#: no healthy run's loss stays two orders of magnitude above where it was (a run that logs
#: every 50 steps went from 4.9 to 1e27 and stayed, and only warned).
ORDERS_OF_MAGNITUDE = 100.0
#: A shift judged from few values and confirmed, whose values stay this many times the median
#: of the values before it (floored at ``SCALE_FLOOR`` of where the run began) is critical
#: too: a Keras run's loss went 0.74 -> 13.4 -> 26.6 and stayed there, dead, and only warned
#: from 5 values before. The median, not the level (the least of the last 3): a noisy loss's
#: one low batch (a ViT's 0.0039 amid 0.03-0.06) is no yardstick for a tenfold.
DECADE = 10.0
#: Values since the onset, each ``ORDERS_OF_MAGNITUDE`` times the level, that confirm a shift
#: before its patience: a loss that stays two orders of magnitude up for a second value is
#: no spike (a real MindYOLO run's 8.85 -> 8,713 -> 15,806, logged every 100 steps).
ORDERS_CONFIRM = 2

#: Values before the onset, each under the one before, after which a shift judged from few
#: values is confirmed by not coming back (``Shift.after_descent``): three falls in a row.
DESCENT = 4

#: Values since the onset that confirm a shift judged from few values when the eval loss
#: rose with it (a run that logs six values in all has two after a failure at its fourth).
CORROBORATED = 2


def quantile(ordered: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of sorted values (nearest rank below)."""
    return ordered[int(fraction * (len(ordered) - 1))]


def rise_bar(level: float, rise: float) -> float:
    """The least a shift bar can be over ``level``: ``rise`` x it (rising with the level)."""
    return rise * level


#: The latest values of ``recent`` that are the level while the run still falls through it.
FALLING = 3


def level_of(recent: list[float]) -> float:
    """The level of a history judged with its noise: the median of ``recent``; while the run
    still falls through it (the last ``FALLING`` values each under every one before them),
    the median of those last ones, where the run now is (the median of all lags above it,
    and a step back up to it would pass for the level)."""
    level = sorted_median(sorted(recent))
    latest = recent[-FALLING:]
    if len(recent) > FALLING and max(latest) < min(recent[:-FALLING]):
        return sorted_median(sorted(latest))
    return level


def bars(
    history: Sequence[float], recent: list[float], settings: DivergenceConfig, floor: float = 0.0
) -> Bars:
    """The level (``level_of`` ``recent``), the noise and envelope of the history ``settled``
    at the median of ``recent`` (a run still falling settles where it was: a rhythm's whole
    swing stays in its envelope), the shift and recovery bars; the shift bar at least
    ``floor`` above the level (``scale_floor``)."""
    level = level_of(recent)
    ordered = sorted(settled(history, sorted_median(sorted(recent))))
    noise = robust_sigma(ordered, level, settings.noise_floor)
    shift = max(
        settings.rise * level,
        level + settings.noise_sigmas * noise,
        quantile(ordered, settings.envelope),
        level + floor,
    )
    back = max(settings.recover * level, level + noise)
    return Bars(level, noise, shift, back)


def scale_floor(start: list[float]) -> float:
    """How far above its level a shift must go, whatever its ratio: ``SCALE_FLOOR`` of where
    the run began (the median of its first values, ``start``). A loss that fell 500x, to
    0.0077, wobbles by ratios (1.56x: +0.004) that are no shift of a run that began at
    4.26."""
    if not start:
        return 0.0
    began = sorted_median(sorted(start))
    return SCALE_FLOOR * began if began > 0 else 0.0


def settled(values: Sequence[float], level: float) -> list[float]:
    """``values`` from the first at or under ``level`` on: the run at its level, with its
    wobble and rhythm. The descent before it is no part of them: a loss still falling
    when the history began (early in a run) would put the envelope at its first values,
    and its spread would pass for noise; a rhythm or a noisy loss comes back under its
    level each time round, and keeps its whole history."""
    start = next((index for index, value in enumerate(values) if value <= level), 0)
    return list(islice(values, start, None))


def early_noise(values: Sequence[float]) -> float:
    """The noise of a few values, from one value to the next: past the descent they open
    with (from its trough, the last value before the first that rises, when 3 or more are
    left), the root mean square of their steps over sqrt 2 (2 to 4 steps give a median
    absolute deviation of nothing, or of one step), where less than ``wobble``. A loss falling fast
    in its first values is learning, not noise: a real run's 0.855, 0.448, 0.332, 0.376,
    0.329 wobbles by 0.05, not by the 0.4 of its first step (``wobble`` 0.085 put it, doubled
    to 0.65 and staying there, under a bar of four)."""
    noise = wobble(values)
    trough = next((index for index, (a, b) in enumerate(pairwise(values)) if b > a), None)
    if trough is None or trough == 0 or len(values) - trough < 3:
        return noise
    steps = [b - a for a, b in pairwise(islice(values, trough, None))]
    return min(noise, math.sqrt(math.fsum(step * step for step in steps) / len(steps) / 2))


def early_bars(
    history: Sequence[float], recent: list[float], settings: DivergenceConfig, floor: float = 0.0
) -> Bars:
    """``bars`` from fewer than ``min_history`` values: the level is the least of the last
    ``early_level``, the noise is taken from one value to the next (``early_noise``), or, for a
    history of 5 values or more each under the one before, where less, from how those
    steps change (``bend``: a loss falling fast and ever slower early in a run, whose
    shrinking steps ``wobble`` takes for noise), no envelope."""
    level = min(recent[-settings.early_level :])
    noise = max(early_noise(history), settings.noise_floor * abs(level))
    if falling(history, 5):
        noise = max(min(noise, bend(history)), settings.noise_floor * abs(level))
    shift = max(settings.rise * level, level + settings.noise_sigmas * noise, level + floor)
    back = max(settings.recover * level, level + noise)
    return Bars(level, noise, shift, back)


def opens_shift(
    value: float,
    history: Rolling,
    recent: list[float],
    settings: DivergenceConfig,
    *,
    early: bool = False,
    floor: float = 0.0,
) -> Bars | None:
    """The bars ``value`` clears (it opens a candidate shift), or None when it is under
    them: a level <= 0 means nothing, and a value under ``rise_bar`` of the level is
    under every bar (the cheap test, before the noise is taken). With fewer than
    ``min_history`` values, or ``early`` (in warmup), ``early_bars``."""
    early = early or len(history) < settings.min_history
    latest = recent[-settings.early_level :] if early else recent
    if early and len(latest) > 1 and all(climbs(a, b, settings) for a, b in pairwise(latest)):
        # A climb under way (a rhythm's rising half), not a step up; but one past anything
        # the run showed before the climb by the rise is no rhythm coming back: judged from
        # where the climb began too (its own values are no level: it rose through them).
        values = list(history.values)
        start = _climb_start(values, settings)
        if start < settings.early_history:
            return None
        if not _learning(values[: start + 1]) and value <= rise_bar(
            max(values[:start]), settings.rise
        ):
            return None
        trough = values[: start + 1]
        if min(trough) > 0:
            current = early_bars(trough, trough[-1:], settings, floor)
            if value > current.shift:
                return current
        # Or above the bars of the values it has, as any value.
    level = min(latest) if early else level_of(latest)
    if level <= 0:
        return None if early else below_zero_shift(value, history, recent, settings)
    if value <= rise_bar(level, settings.rise):
        return None
    current = (early_bars if early else bars)(history.values, recent, settings, floor)
    return current if value > current.shift else None


def below_zero_shift(
    value: float, history: Rolling, recent: list[float], settings: DivergenceConfig
) -> Bars | None:
    """``opens_shift`` for a level at or below 0 (a Gaussian or flow NLL, an RL or GAN
    objective): no ratio means anything there, so the bars are the run's noise and
    envelope alone (``bars``: ``rise`` x a level <= 0 is under it). Judged with
    ``min_history`` values or more only (a few values show no noise), and never where
    the history is flat (no noise: a loss stuck at exactly 0 is ``nan_inf``'s finding)."""
    current = bars(history.values, recent, settings)
    return current if current.noise > 0 and value > current.shift else None


def scant_shift(
    value: float, history: Rolling, steps: Sequence[int | None], settings: DivergenceConfig
) -> Bars | None:
    """The bars of a shift ``value`` opens with fewer than ``early_history`` values known
    (from ``SCANT_HISTORY``): it is above ``SCANT_RISE`` x the least of them, and stays a
    shift while above ``rise`` x it (the shift bar its values are confirmed against, as
    any shift's); None under it, with a least <= 0 (a ratio to it means nothing), or when
    two of them share a step (``steps``, theirs): not a run's course but two runs' values,
    as ranks that print to one stream unlabelled show before they are told apart."""
    if len(history) < SCANT_HISTORY:
        return None
    known = [step for step in steps if step is not None]
    if len(set(known)) < len(known):
        return None
    level = min(history.values)
    if level <= 0 or value <= SCANT_RISE * level:
        return None
    return Bars(level, 0.0, rise_bar(level, settings.rise), settings.recover * level)


def _trailing_above(values: Sequence[float], bar: float) -> int:
    """How many of the last ``values`` are above ``bar``, one after another up to the last."""
    count = 0
    for value in reversed(values):
        if value <= bar:
            break
        count += 1
    return count


def falling(values: Sequence[float], least: int = DESCENT) -> bool:
    """Whether ``values`` are ``least`` or more, each under the one before."""
    return len(values) >= least and all(b < a for a, b in pairwise(values))


def _learning(values: Sequence[float]) -> bool:
    """Whether ``values`` are a run learning: ``falling``, each by no more than the one
    before it fell (ever slower, as a loss early in a run does). A rhythm's falling half
    does not slow so (its steps are alike, or grow): a climb after it is its rising half,
    coming back."""
    steps = [b - a for a, b in pairwise(values)]
    return falling(values) and all(b >= a for a, b in pairwise(steps))


def climbs(before: float, after: float, settings: DivergenceConfig) -> bool:
    """Whether ``after`` is a step of a climb from ``before``: above it by more than
    ``noise_floor`` of it. A Keras loss's 0.0471 -> 0.0472 is flat, no climb's start: taken
    for one, the jump to 0.0958 two values on was a climb's rising half, and judged not."""
    return after - before > settings.noise_floor * abs(before)


def _climb_start(values: Sequence[float], settings: DivergenceConfig) -> int:
    """The index where the climb ``values`` end on began: the first of the values that rise
    (``climbs``) one after another up to the last."""
    start = len(values) - 1
    while start > 0 and climbs(values[start - 1], values[start], settings):
        start -= 1
    return start


def crept(
    history: Sequence[float], settings: DivergenceConfig, floor: float = 0.0
) -> tuple[Bars, int] | None:
    """The bars the level crept past and the values since the run's best (the climb, its
    onset the first of them), or None: the median of the last ``level_window``
    values of ``history``, and the last of them, above the shift bar of the run at its
    best before them (the window of ``level_window`` values with the least level, of those
    with ``min_history`` values up to its end), its noise and envelope taken over the
    values before them where the run settled at it (a rhythm's peaks, before the best or
    after it, are in its envelope; so is a climb's start, which only delays the bar).

    A climb of a few per cent a value never puts one value above the bar of a level that
    follows it (each value is learned, the level with it); the run at its best, a moment
    ago, has a bar the climb passes. A rhythm's rising half stays under it: its envelope
    holds the rhythm's peaks before. Nothing is judged where a value before is <= 0 (a
    ratio means nothing), nor when the last value is back under the bar (a spike's end,
    not a climb)."""
    size, count = settings.level_window, len(history)
    if count < settings.min_history + size:
        return None
    values = list(history)
    before, latest = values[:-size], values[-size:]
    least = min(before)
    bar = rise_bar(least, settings.rise)
    if least <= 0 or latest[-1] <= bar:
        return None  # the cheap test, on the last value alone (most values end here)
    now = min(sorted_median(sorted(latest)), latest[-1])
    if now <= bar:
        return None  # under every bar: a level is never under its least
    ends = range(max(size, settings.min_history), len(before) + 1)
    end = min(ends, key=lambda end: level_of(before[end - size : end]))
    current = bars(before, before[end - size : end], settings, floor)
    return (current, count - end) if now > current.shift else None


def never_creeps(history: Sequence[float], values: list[float], settings: DivergenceConfig) -> bool:
    """Block path: no value of a block ``values`` coming after ``history`` (the values
    ``crept`` is given, ``window`` at most) ends a window ``crept`` judges: at each, its
    cheap test (the median of the last ``level_window`` values, or the last, at most
    ``rise`` x the least value before them in the history then, or that least <= 0)."""
    size, window = settings.level_window, settings.window
    tail = [*history, *values]
    if not values or max(values) <= rise_bar(min(tail), settings.rise):
        return True  # each window's last value is the block's, each least at least this
    for end in range(len(tail) - len(values) + 1, len(tail) + 1):
        start = max(0, end - window)  # the history as ``crept`` would be given it
        if end - start < settings.min_history + size:
            continue
        least = min(tail[start : end - size])
        latest = tail[end - size : end]
        bar = rise_bar(least, settings.rise)
        if least > 0 and latest[-1] > bar and sorted_median(sorted(latest)) > bar:
            return False
    return True


def never_opens(values: list[float], least: float, start: int, settings: DivergenceConfig) -> bool:
    """Block path: no value from ``start`` on can open a shift, ``least`` the least of the
    values the level is taken over before them (``never_above`` with ``opens_shift``'s
    least bar, ``rise_bar``: a level, early or not, is never under the least of the recent
    values it is the median of); False for a
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
    #: Opened with fewer than ``min_history`` values known.
    early: bool = False
    #: Seen in hindsight: the level crept past the bar of the level before it (``crept``).
    crept: bool = False
    #: Where its values were read (the log its alert names).
    source: str = ""
    #: A non-finite value came since its onset: ``nan_inf``'s story from there on.
    broke: bool = False

    @property
    def after_descent(self) -> bool:
        """Opened from few values on a run that was falling through all of them (at least
        ``DESCENT`` values before the onset, each under the one before): its values keep
        falling as the run does, so that it stays shows by their never coming back to the
        level, not by their staying above the shift bar."""
        return self.early and falling([value for _, value in self.before])


class ShiftSeries:
    """One metric: its history and its candidate shift."""

    __slots__ = ("history", "recent", "resumed", "shift", "start", "steps")

    def __init__(self, settings: DivergenceConfig) -> None:
        self.history = Rolling(settings.window)
        #: The step of each value in ``history``, in the same order.
        self.steps: deque[int | None] = deque(maxlen=settings.window)
        #: The latest values not part of a shift, with their steps.
        self.recent: deque[tuple[int | None, float]] = deque(maxlen=settings.level_window)
        self.shift: Shift | None = None
        #: A new attempt began: its first step says how much of the history still holds.
        self.resumed = False
        #: The first ``START_VALUES`` values learned: where the run began, its scale
        #: (``scale_floor``; a median of them, so one transient at the start is none).
        self.start: list[float] = []

    def learn(self, step: int | None, value: float) -> None:
        if len(self.start) < START_VALUES:
            self.start.append(value)
        self.history.add(value)
        self.steps.append(step)
        self.recent.append((step, value))

    def learn_all(self, values: list[float], steps: list[int]) -> None:
        """``learn`` each of a block's values, in order."""
        if len(self.start) < START_VALUES:
            self.start.extend(values[: START_VALUES - len(self.start)])
        self.history.extend(values)
        self.steps.extend(steps)
        kept = self.recent.maxlen or len(values)
        self.recent.extend(zip(steps[-kept:], values[-kept:], strict=True))

    def take_back(self, count: int) -> list[tuple[int | None, float]]:
        """The last ``count`` values learned, out of the history again (a shift seen in
        hindsight: they are its values, not the run's)."""
        values, steps = list(self.history.values), list(self.steps)
        taken = list(zip(steps[-count:], values[-count:], strict=True))
        self.history.clear()
        self.steps.clear()
        self.recent.clear()
        for step, value in zip(steps[:-count], values[:-count], strict=True):
            self.learn(step, value)
        return taken

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


class DivergenceDetector(BaseDetector):
    """Critical when the loss shifts up and stays there; resolves when it comes back."""

    rule = "divergence"
    config_model = DivergenceConfig
    divergent = True
    incident_reading = 20  # after a learning-rate jump's reading, before a blow-up's

    @classmethod
    def read_incident(
        cls,
        incident: Incident,
        recent: Recent,
        lr: tuple[str, str] | None,
        divergent: frozenset[str],
    ) -> Reading | None:
        return (
            "divergence: the loss moved up and did not come back",
            "roll back to the checkpoint before the onset; lower the learning rate, check the"
            " schedule and the data order around the onset step",
            incident.worst.metric,
        )

    def __init__(self, config: DivergenceConfig) -> None:
        super().__init__(config)
        self.settings = config
        self.watches = frozenset({*config.metrics, "lr", EVAL_METRIC})
        self._warmup = Warmup(config.warmup_steps)
        #: The evaluations: a shift judged from few values that the eval loss rose with
        #: is confirmed by ``CORROBORATED`` values.
        self._evals = EvalSignal()
        self._series: dict[str, ShiftSeries] = {}
        #: The logged learning rate's last jump, which the diagnosis names.
        self._lr = LrJumps()
        self.job_started(0.0)

    def job_started(self, now: float) -> None:
        """A new attempt: its episode is forgotten; the history is trimmed to before the
        step it resumes at (its first value's), so a run rolled back and diverging again at
        the same step is caught again, at once."""
        self._warmup.reset()
        self._lr.reset()
        self._evals.reset()
        for name in self.settings.metrics:
            series = self._series.setdefault(name, ShiftSeries(self.settings))
            series.shift = None
            series.resumed = len(series.history) > 0

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        if sample.name == "lr":
            self._warmup.observe(sample)
            self._lr.note(sample.step, sample.value)
            return []
        alerts: list[Alert] = []
        if sample.name == EVAL_METRIC:
            self._evals.observe(sample.step, sample.value)
            time = sample.time if sample.time is not None else now
            for name, judged in self._series.items():
                if judged.shift is not None:
                    alerts += self._confirmed_by_eval(name, judged.shift, source, time)
        series = self._series.get(sample.name)
        if series is None:
            return alerts
        if not math.isfinite(sample.value):
            if series.shift is not None:
                series.shift.broke = True
            return alerts
        return alerts + self._judge(series, sample, source, now)

    def _confirmed_by_eval(self, name: str, shift: Shift, source: str, time: float) -> list[Alert]:
        """A shift judged from few values, ``CORROBORATED`` values or more since its onset
        and their median above the bar, that the eval loss rose with: confirmed."""
        if shift.confirmed or not shift.early or len(shift.since) < CORROBORATED:
            return []
        latest = sorted_median(sorted(value for _, value in shift.since))
        rose = self._evals.rose_since(shift.onset_step)
        if rose is None or latest <= shift.bars.shift:
            return []
        shift.confirmed = True
        step, value = shift.since[-1]
        last = Sample(name, value, step)
        return [self._alert(shift, latest, last, source, time, corroboration=rose)]

    def _judge(self, series: ShiftSeries, sample: Sample, source: str, now: float) -> list[Alert]:
        _, value, step, stamp = sample[:4]
        if series.resumed:
            series.resume_at(step)
        shift = series.shift
        if shift is None:
            settings = self.settings
            if len(series.history) < settings.early_history:
                scant = scant_shift(value, series.history, series.steps, settings)
                if scant is None:
                    series.learn(step, value)
                    return []
                # The values before it up there too are the shift's (a loss 11.23 -> 87.3 at
                # a run's second value, learned then with one value known): its onset.
                bar = SCANT_RISE * scant.level
                back = _trailing_above(series.history.values, bar)
                taken = series.take_back(back) if back else []
                onset = taken[0][0] if taken else step
                since = [*taken, (step, value)]
                series.shift = Shift(
                    scant, onset, list(series.recent), since, early=True, source=source
                )
                return []
            # In warmup the loss may wobble up as the rate climbs: judged as from few values.
            early = len(series.history) < settings.min_history or self._warmup.active(step)
            recent = [value for _, value in series.recent]
            floor = scale_floor(series.start)
            current = opens_shift(value, series.history, recent, settings, early=early, floor=floor)
            if current is None:
                series.learn(step, value)
                return [] if early else self._crept(series, sample, source, now)
            series.shift = Shift(
                current, step, list(series.recent), [(step, value)], early=early, source=source
            )
            return []
        time = stamp if stamp is not None else now
        if value <= shift.bars.back:
            return self._recovered(series, shift, sample, source, time)
        shift.since.append((step, value))
        if shift.confirmed:
            if len(shift.since) > self.settings.window:
                del shift.since[0]  # a run that goes on up there: its latest are enough
            return []
        patience = self.settings.early_patience if shift.early else self.settings.patience
        if len(shift.since) < patience:
            if not _orders_up(shift, series.history):
                return self._confirmed_by_eval(sample.name, shift, source, time)
            shift.confirmed = True
            latest = sorted_median(sorted(value for _, value in shift.since))
            return [self._alert(shift, latest, sample, source, time)]
        latest = sorted_median(sorted(value for _, value in shift.since[-patience:]))
        if latest > shift.bars.shift or shift.after_descent:
            shift.confirmed = True
            return [self._alert(shift, latest, sample, source, time)]
        if len(shift.since) >= self.settings.window:
            series.forget_shift()  # neither back nor up: the run's new normal
        return []

    def log_ended(self, now: float, tail: Sequence[str]) -> list[Alert]:
        """A replayed log that ends while a shift is open, unconfirmed: a warning when
        ``CORROBORATED`` values or more since its onset stay above its bar at their median
        (or, after a descent, none came back to the level), none back under the recovery
        bar, and none non-finite (then ``nan_inf`` told the story). An excerpt that ends two
        values after the loss doubled (a Keras run's 0.047 -> 0.096 -> 0.088 at its last
        epochs) holds no more evidence than that, and said nothing."""
        del tail
        alerts: list[Alert] = []
        for name, series in self._series.items():
            shift = series.shift
            if shift is None or shift.confirmed or shift.broke or len(shift.since) < CORROBORATED:
                continue
            latest = sorted_median(sorted(value for _, value in shift.since))
            if latest <= shift.bars.shift and not shift.after_descent:
                continue
            step, value = shift.since[-1]
            last = Sample(name, value, step)
            alert = self._alert(shift, latest, last, shift.source, now, ended=True)
            alerts.append(alert)
        return alerts

    def _crept(self, series: ShiftSeries, sample: Sample, source: str, now: float) -> list[Alert]:
        """The level crept past the bar of the run at its best (``crept``): a shift seen in
        hindsight, its onset the first value after that best, confirmed."""
        found = crept(series.history.values, self.settings, scale_floor(series.start))
        if found is None:
            return []
        current, climb = found
        since = series.take_back(climb)
        before = list(series.recent)
        shift = Shift(current, since[0][0], before, since, confirmed=True, crept=True)
        series.shift = shift
        judged = since[-self.settings.level_window :]
        latest = sorted_median(sorted(value for _, value in judged))
        time = sample.time if sample.time is not None else now
        return [self._alert(shift, latest, sample, source, time)]

    def _recovered(
        self, series: ShiftSeries, shift: Shift, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        series.forget_shift()
        series.learn(sample.step, sample.value)
        if not shift.confirmed:
            return []
        message = (
            f"{sample.name} back to {sample.value:.4g} at step {sample.step}, near its level"
            f" {shift.bars.level:.4g} from before step {shift.onset_step}"
        )
        return [
            self.sample_alert(
                sample,
                severity=Severity.INFO,
                message=message,
                time=time,
                source=source,
                onset_step=shift.onset_step,
                resolves=True,
                details=self._details("recovered", shift, sample),
            )
        ]

    def _alert(
        self,
        shift: Shift,
        latest: float,
        sample: Sample,
        source: str,
        time: float,
        *,
        corroboration: str | None = None,
        ended: bool = False,
    ) -> Alert:
        """The confirmed shift's alert; ``corroboration``: the eval loss's rise with it, by
        which a shift judged from few values is confirmed sooner; ``ended``: the log ended
        before the shift was confirmed (a warning, whatever else is known)."""
        level = shift.bars.level
        count = len(shift.since)
        details = self._details("unrecovered", shift, sample, latest)
        severity = self.settings.severity
        known = ""
        evidence = [*shift.before, *shift.since]
        first = evidence[0][0] if evidence else None
        unexplained = self._lr.unexplained_within(first, shift.onset_step)
        # Against the median of the values before the shift, not its level (the least of
        # the last 3): a noisy loss's one low batch (a LeNet's 0.00058 amid 0.005-0.03, a
        # ViT's 0.0039 amid 0.03-0.06) is no yardstick for orders of magnitude.
        series = self._series.get(sample.name)
        floor = scale_floor(series.start) if series is not None else 0.0
        values = sorted(value for _, value in shift.before)
        typical = max(sorted_median(values), floor) if values else level
        orders = typical > 0 and latest >= ORDERS_OF_MAGNITUDE * typical
        # A tenfold needs a few values before it: after one, the first value may be that
        # low batch.
        decade = (
            len(values) >= self.settings.early_history
            and typical > 0
            and latest >= DECADE * typical
        )
        if shift.early and not unexplained and not orders and not decade:
            severity = self.settings.early_severity
            known = f" (judged from {len(shift.before)} values before it)"
        elif shift.early:
            known = f" (judged from {len(shift.before)} values before it)"
        elif shift.crept and not unexplained:
            severity = self.settings.early_severity  # a climb: no cause known to stop it for
        if ended and not orders:
            severity = min(severity, Severity.WARNING)
        act = (
            f"; rolling back to before step {shift.onset_step}"
            if severity == Severity.CRITICAL
            else ""
        )
        judged = self.settings.early_patience if shift.early else self.settings.patience
        if shift.crept:
            judged = self.settings.level_window
        moved = "crept up from" if shift.crept else "shifted up at"
        message = (
            f"{sample.name} {moved} step {shift.onset_step} and has not recovered:"
            f" median {latest:.4g} over the last {min(judged, count)} values"
            f" ({how_far_above(latest, level, shift.bars.noise)} its level {level:.4g}"
            f" before the shift{known}, above"
            f" {shift.bars.shift:.4g}) for {count} values"
            f"{' ' + corroboration if corroboration else ''}{act}"
        )
        if ended:
            message = (
                f"{sample.name} shifted up at step {shift.onset_step} and the log ended"
                f" {count} values later, none back near its level: median {latest:.4g},"
                f" {how_far_above(latest, level, shift.bars.noise)} its level {level:.4g}"
                f" before the shift and above its bar {shift.bars.shift:.4g}"
                f" ({len(shift.before)} values before it; {judged} confirm a shift)"
            )
        return self.sample_alert(
            sample,
            severity=severity,
            message=message,
            time=time,
            source=source,
            onset_step=shift.onset_step,
            details=details,
        )

    def _details(
        self, kind: str, shift: Shift, sample: Sample, latest: float | None = None
    ) -> dict[str, Any]:
        latest = sample.value if latest is None else latest
        evidence = [*shift.before, *shift.since]
        bars_ = shift.bars
        first = evidence[0][0] if evidence else None
        jump = self._lr.within(first, shift.onset_step)
        return {
            "lr_jump": jump,
            "changed_after": None if jump is None else self._lr.changed_after,
            "kind": kind,
            "metric": sample.name,
            "level": bars_.level,
            "noise": bars_.noise,
            "threshold": bars_.shift,
            "recover_threshold": bars_.back,
            "onset_step": shift.onset_step,
            "ratio": round(latest / bars_.level, 3) if bars_.level > 0 else None,
            "early": shift.early,
            "crept": shift.crept,
            "values": [value for _, value in evidence],
            "steps": [step for step, _ in evidence],
        }

    def can_absorb(self, block: Block) -> bool:
        """Uneventful: no candidate shift, and no value that could open one
        (``never_opens``), in warmup or not; evaluations while no shift is open (one that
        is may be confirmed by them)."""
        columns = block.columns
        if EVAL_METRIC in columns and any(series.shift for series in self._series.values()):
            return False
        judged = [name for name in self._series if name in columns]
        if not judged:
            return True  # only learning rates and evaluations
        if any(self._series[name].shift or self._series[name].resumed for name in judged):
            return False
        settings = self.settings
        for name in judged:
            series = self._series[name]
            values = finite_values(columns[name])
            # A climb in the early phase is judged from its trough, which may be older
            # than ``recent``: the proof's least is then the whole history's.
            early = self._may_judge_early(series, block)
            pool = series.history.values if early else [value for _, value in series.recent]
            least = min(pool, default=math.inf)
            filling = max(0, SCANT_HISTORY - len(series.history))
            if not never_opens(values, least, filling, settings):
                return False
            if not never_creeps(series.history.values, values, settings):
                return False
        return True

    def _may_judge_early(self, series: ShiftSeries, block: Block) -> bool:
        """Whether a value of ``block`` may be judged as from few values (``opens_shift``'s
        ``early``): too little history, or a warmup that may be on (configured steps, or a
        learning rate that rises or is not known yet to have stopped)."""
        settings = self.settings
        if len(series.history) < settings.min_history or self._warmup.lr_rising:
            return True
        if self._warmup.lr_rising is None and "lr" in block.columns:
            return True
        first = block.steps[0] if block.steps else None
        return first is None or first < settings.warmup_steps

    def absorb(self, block: Block) -> None:
        """What ``observe`` does with values under every bar: learn them."""
        columns = block.columns
        self._warmup.extend(columns.get("lr"))
        self._lr.note_all(columns.get("lr"), block.steps)
        self._evals.extend(columns.get(EVAL_METRIC), block.steps)
        for name, series in self._series.items():
            column = columns.get(name)
            if column is not None:
                series.learn_all(*finite_with_steps(column, block.steps))


def _orders_up(shift: Shift, history: Rolling) -> bool:
    """Whether every value since the onset, ``ORDERS_CONFIRM`` or more, is
    ``ORDERS_OF_MAGNITUDE`` times the level before the shift or more, and above anything in
    the ``history`` before it: a floor of scale (a BERT-tiny classifier whose loss fell
    1,000x to 0.0005 had two hard batches in a row at 0.07, 136x its level and a tenth of
    where it began, averaged over 100 steps; it finished healthy)."""
    level = shift.bars.level
    if level <= 0 or len(shift.since) < ORDERS_CONFIRM:
        return False
    floor = max(ORDERS_OF_MAGNITUDE * level, max(history.values, default=0.0))
    return all(value >= floor and value > level for _, value in shift.since)
