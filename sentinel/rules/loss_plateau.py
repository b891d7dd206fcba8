"""loss_plateau: loss flat and high for a long window (underfitting).

Over the last ``window`` logged loss values (warmup excluded), the loss is flat
when the median of the last ``edge_values`` is not below ``1 - min_improvement``
times the median of the window's first ``edge_values`` (nor above ``max_rise`` times
it: a loss that climbed is not flat), and high when that recent
median is still at least ``high_fraction`` of the run's initial level (the median
of its first ``edge_values`` values, warmup included: a loss that fell a lot and
then flattened has converged, it is not stuck). Medians, so a noisy loss is judged
by its level, not by its last value. Nothing is judged while either level is <= 0.

One info alert per episode (``details["kind"] = "plateau"``); the episode
resolves once the recent median falls below the bar set when it opened (improved
by ``min_improvement`` on the plateau's level, or under ``high_fraction`` of the
initial level, each less twice the window's own noise: how far its medians of
``edge_values`` dipped under its median), and the window then starts empty, so a
new plateau needs a whole new window. The noise allowance is what keeps a flat but
noisy loss one open episode: without it a median of ten noisy values crossed a 1%
bar by chance, and the plateau opened and resolved once a window.
``details["from_start"]`` is True when the window holds every judged value of the
run: the loss never moved, which points at the data (labels all masked, a wrong
target) or at frozen parameters rather than at the optimizer.

The initial level belongs to the run, not to the attempt: after a restart from a
checkpoint ``job_started`` forgets the window, the warmup and the episode, but
keeps the level the run started from, so a resumed, already converged run is not
called high.

``details``: ``kind``, ``from_start``, ``window``, ``start_level``,
``recent_level``, ``initial_level``, ``improvement`` (fraction),
``threshold`` (the resolve bar), ``onset_step``, ``start_values`` and ``values``
(the window's first and last ``edge_values``).

The decisions are written once (``is_plateau``, ``still_high``, ``recovered``, and
the bars ``high_bar`` and ``resolve_bar``). Replay's blocks (``can_absorb``) are taken
whole when no line of them could judge: all in warmup, the window not full by the
end, no initial level above 0; or when every judgement is known without a median:
converged (most of each line's last ``edge_values`` not ``still_high``) or, in an
episode, most of them not ``recovered``: a median of values most of which are on one
side of a bar is on that side too.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, islice, repeat
from operator import ge, indexOf, lt, not_

from pydantic import Field, model_validator

from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricRuleConfig, Reading, Recent
from sentinel.rules.series import Warmup, finite_values, majority_in_every_window, warmup_and_values

METRIC = "loss"
#: Above this a sum of two values could overflow: a median of them is not bounded by them.
_HUGE = 1e300


class LossPlateauConfig(MetricRuleConfig):
    """``[rules.loss_plateau]``.

    The defaults follow the runbooks' underfitting check (a loss that has not
    improved by 1% over a couple of hundred logged steps while still near where
    it started), with medians of 10 values at each end to ride out batch noise.
    """

    #: Severity of the alert: a plateau is worth knowing, not worth stopping a job for.
    severity: Severity = Severity.INFO
    #: Logged loss values (after warmup) the flatness is judged over.
    window: int = Field(default=200, ge=4, le=100_000)
    #: Values whose median is the level at each end of the window, and the initial level.
    edge_values: int = Field(default=10, ge=1)
    #: The recent level must be below ``1 - min_improvement`` x the window's start level.
    min_improvement: float = Field(default=0.01, ge=0, lt=1)
    #: The loss is still high at or above this fraction of the run's initial level.
    high_fraction: float = Field(default=0.9, gt=0, le=1)
    #: A window whose recent level is above this multiple of its start level rose: no
    #: plateau (a loss that climbed is ``divergence``'s finding, not underfitting).
    max_rise: float = Field(default=1.3, gt=1.0)

    @model_validator(mode="after")
    def _edges_fit(self) -> LossPlateauConfig:
        if 2 * self.edge_values > self.window:
            raise ValueError("edge_values must be at most half of window")
        return self


def high_bar(initial: float, settings: LossPlateauConfig) -> float:
    """The "still high" bar: ``high_fraction`` of the run's initial level."""
    return settings.high_fraction * initial


#: Whether a loss level is still high: at or above the "still high" bar (``level >= bar``:
#: ``operator.ge`` itself, so the block path applies it to a column at C speed).
still_high: Callable[[float, float], bool] = ge


def is_plateau(start: float, recent: float, initial: float, settings: LossPlateauConfig) -> bool:
    """Whether a full window whose ends have the levels ``start`` and ``recent`` is a
    plateau: ``start`` above 0, not improved by ``min_improvement``, not risen past
    ``max_rise`` x ``start``, and still high."""
    if start <= 0:
        return False
    if recent < (1 - settings.min_improvement) * start:
        return False  # still improving
    if recent > settings.max_rise * start:
        return False  # climbed: not flat
    return still_high(recent, high_bar(initial, settings))  # flat, and not converged


def _moved(improvement: float) -> str:
    """How the window's level moved, in words: a negative improvement (past what its one
    decimal shows) is a rise."""
    if improvement < -0.0005:
        return f"rose {-improvement:.1%}, improved by nothing"
    return f"improved {improvement:.1%}"


def resolve_bar(
    level: float, initial: float, settings: LossPlateauConfig, noise: float = 0.0
) -> float:
    """The bar a plateau at ``level`` resolves under: improved by ``min_improvement`` on
    it, or under the "still high" bar; either less twice its window's ``noise``."""
    return max((1 - settings.min_improvement) * level, high_bar(initial, settings)) - 2 * noise


def window_level(values: Sequence[float], edge_values: int) -> tuple[float, float]:
    """The level of a window's ``values`` (their median) and its noise: how far the medians
    of ``edge_values`` consecutive values dip under that level, the scale recovery is
    judged on (0 for a constant loss)."""
    level = statistics.median(values)
    run = sorted(values[:edge_values])
    middle = ((edge_values - 1) // 2, edge_values // 2)
    lowest = (run[middle[0]] + run[middle[1]]) / 2
    for leaving, entering in zip(values, values[edge_values:], strict=False):
        del run[bisect_left(run, leaving)]
        insort(run, entering)
        lowest = min(lowest, (run[middle[0]] + run[middle[1]]) / 2)
    return level, max(0.0, level - lowest)


#: Whether the recent level ends an episode: under its resolve bar (``level < bar``,
#: ``operator.lt``).
recovered: Callable[[float, float], bool] = lt


class LossPlateauDetector(BaseDetector):
    """Raises one info alert when the loss has stayed flat and high for a whole window."""

    rule = "loss_plateau"
    config_model = LossPlateauConfig

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        if alert.details.get("from_start"):
            return (
                "loss flat from the start",
                "check the data and label masking (all labels -100?), frozen parameters"
                " (requires_grad), a learning rate of 0 or a scheduler stuck at 0",
                alert.metric,
            )
        return (
            "loss plateaued high (underfitting)",
            "raise the learning rate or the model's capacity; check the schedule has not"
            " decayed to 0",
            alert.metric,
        )

    watches = frozenset({METRIC, "lr"})

    def __init__(self, config: LossPlateauConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._warmup = Warmup(config.warmup_steps)
        #: The run's first values, whose median is its initial level.
        self._first: list[float] = []
        self._window: deque[tuple[int | None, float]] = deque(maxlen=config.window)
        #: Whether a value has left the window (or an attempt began) since the run began.
        self._moved_on = False
        #: The open episode's resolve bar, or None when none is open.
        self._bar: float | None = None
        self._onset_step: int | None = None
        #: Values appended to the window since it was last cleared, all under the "still
        #: high" bar (``high_fraction`` x the initial level), up to the newest.
        self._under_high = 0
        self._high_bar: float | None = None

    def job_started(self, now: float) -> None:
        self._warmup.reset()
        self._window.clear()
        self._under_high = 0
        self._moved_on = bool(self._first)
        self._bar = None
        self._onset_step = None

    @property
    def initial_level(self) -> float | None:
        """The median of the run's first values, once there are enough of them."""
        if len(self._first) < self.settings.edge_values:
            return None
        return statistics.median(self._first)

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        name, value, step, stamp = sample[:4]
        if name == "lr":
            self._warmup.observe(sample)
            return []
        if name != METRIC or not math.isfinite(value):
            return []
        edge_values = self.settings.edge_values
        first = self._first
        if len(first) < edge_values:
            first.append(value)
            if len(first) == edge_values:
                self._set_high_bar()
        if self._warmup.active(step):
            return []
        window = self._window
        if len(window) == window.maxlen:
            self._moved_on = True
        window.append((step, value))
        bar = self._high_bar
        if bar is None or still_high(value, bar):
            self._under_high = 0
        else:
            self._under_high += 1
            if self._bar is None and self._under_high >= edge_values:
                # The last edge_values are all under the bar, so is their median: converged.
                return []
        time = stamp if stamp is not None else now
        if self._bar is not None:
            return self._judge_recovery(sample, source, time)
        return self._judge_plateau(sample, source, time)

    def _set_high_bar(self) -> None:
        """The "still high" bar, once the initial level is known; None where a sum of
        two values under it could overflow (the shortcut would then be unsound)."""
        initial = self.initial_level
        assert initial is not None
        bar = high_bar(initial, self.settings)
        self._high_bar = bar if 0 < bar < _HUGE else None

    def can_absorb(self, block: Block) -> bool:
        """Uneventful: no line judges, or every judgement is known without a median."""
        columns = block.columns
        column = columns.get(METRIC)
        if column is None:
            return True  # only learning rates
        phase = self._warmup.block_phase(block.step_range(), columns.get("lr"))
        if phase is None:
            return False
        values = finite_values(column)
        if phase or not values:
            return True  # in warmup the values only make the initial level
        window, edge_values = self._window, self.settings.edge_values
        bar = self._bar
        if bar is not None:
            # An episode: no line's recent median may have recovered.
            return self._medians_not(recovered, bar, values, 0)
        size = self.settings.window
        # Index of the first value after which the window is full: the first judged.
        judged_from = max(0, size - len(window) - 1)
        if judged_from >= len(values):
            return True
        if len(self._first) < edge_values:
            first = self._first + values[: edge_values - len(self._first)]
            # The initial level would be set inside the block: line by line, unless none.
            return len(first) < edge_values or statistics.median(first) <= 0
        initial = self.initial_level
        assert initial is not None
        if initial <= 0:
            return True
        # Converged: no recent median still high. (Still improving would need a median
        # per line: such blocks go line by line.)
        bar = self._high_bar
        return bar is not None and self._medians_not(still_high, bar, values, judged_from)

    def _medians_not(
        self,
        decision: Callable[[float, float], bool],
        bar: float,
        values: list[float],
        judged_from: int,
    ) -> bool:
        """Whether at each judged line (from index ``judged_from`` of ``values``) the median
        of the last ``edge_values`` is not ``decision`` against ``bar`` (``still_high``,
        ``recovered``: each a side of the bar): it is not when most of them are not."""
        edge_values = self.settings.edge_values
        tail = [value for _, value in islice(reversed(self._window), edge_values - 1)]
        tail.reverse()
        flags = list(map(not_, map(decision, chain(tail, values), repeat(bar))))
        return majority_in_every_window(flags, edge_values, len(tail) + judged_from)

    def absorb(self, block: Block) -> None:
        """What ``observe`` does with values that raise nothing: the initial level, then
        the window and the count of values under the "still high" bar."""
        taken = warmup_and_values(self._warmup, block, METRIC)
        if taken is None:
            return
        in_warmup, values, steps = taken
        if not values:
            return
        first, edge_values = self._first, self.settings.edge_values
        # Index of the first value judged against the "still high" bar.
        barred_from = 0
        if len(first) < edge_values:
            barred_from = edge_values - len(first) - 1
            first += values[: barred_from + 1]
            if len(first) == edge_values:
                self._set_high_bar()
        if in_warmup:
            return
        window = self._window
        size = window.maxlen or len(values)
        if len(window) + len(values) > size:
            self._moved_on = True  # a value was appended to a full window
        window.extend(zip(steps[-size:], values[-size:], strict=True))
        bar = self._high_bar
        if bar is None or barred_from >= len(values):
            self._under_high = 0
            return
        barred = values[barred_from:]
        try:
            # The values not still high at the end, back to the last one that was.
            self._under_high = indexOf(map(still_high, reversed(barred), repeat(bar)), True)
        except ValueError:
            self._under_high = len(barred) + (self._under_high if barred_from == 0 else 0)

    def _edge(self, values: Iterable[tuple[int | None, float]]) -> list[float]:
        """The values of the first ``edge_values`` entries."""
        return [value for _, value in islice(values, self.settings.edge_values)]

    def _judge_plateau(self, sample: Sample, source: str, time: float) -> list[Alert]:
        settings = self.settings
        initial = self.initial_level
        if initial is None or initial <= 0 or len(self._window) < settings.window:
            return []
        start_values = self._edge(self._window)
        recent_values = self._edge(reversed(self._window))[::-1]
        start = statistics.median(start_values)
        recent = statistics.median(recent_values)
        if not is_plateau(start, recent, initial, settings):
            return []
        level, noise = window_level([value for _, value in self._window], settings.edge_values)
        self._bar = resolve_bar(level, initial, settings, noise)
        self._onset_step = self._window[0][0]
        from_start = not self._moved_on
        improvement = 1 - recent / start
        since = f"step {self._onset_step}" + (", the start of the run" if from_start else "")
        message = (
            f"loss flat at {recent:.4g} over {settings.window} logged values since {since}"
            f" ({_moved(improvement)}, less than {settings.min_improvement:.0%};"
            f" {recent / initial:.0%} of its initial {initial:.4g})"
        )
        details = {
            "kind": "plateau",
            "from_start": from_start,
            "window": settings.window,
            "start_level": start,
            "recent_level": recent,
            "initial_level": initial,
            "improvement": improvement,
            "threshold": self._bar,
            "onset_step": self._onset_step,
            "start_values": start_values,
            "values": recent_values,
        }
        return [
            self.sample_alert(
                sample,
                severity=settings.severity,
                message=message,
                time=time,
                source=source,
                onset_step=self._onset_step,
                details=details,
            )
        ]

    def _judge_recovery(self, sample: Sample, source: str, time: float) -> list[Alert]:
        assert self._bar is not None
        recent_values = self._edge(reversed(self._window))[::-1]
        recent = statistics.median(recent_values)
        if not recovered(recent, self._bar):
            return []
        message = f"loss improved to {recent:.4g} at step {sample.step} (under {self._bar:.4g})"
        details = {"kind": "recovered", "threshold": self._bar, "recent_level": recent}
        alert = self.sample_alert(
            sample,
            severity=Severity.INFO,
            message=message,
            time=time,
            source=source,
            onset_step=self._onset_step,
            resolves=True,
            details=details,
        )
        self._bar = None
        self._onset_step = None
        self._window.clear()
        self._under_high = 0
        self._moved_on = True
        return [alert]
