"""loss_plateau: loss flat and high for a long window (underfitting).

Over the last ``window`` logged loss values (warmup excluded), the loss is flat
when the median of the last ``edge_values`` is not below ``1 - min_improvement``
times the median of the window's first ``edge_values``, and high when that recent
median is still at least ``high_fraction`` of the run's initial level (the median
of its first ``edge_values`` values, warmup included: a loss that fell a lot and
then flattened has converged, it is not stuck). Medians, so a noisy loss is judged
by its level, not by its last value. Nothing is judged while either level is <= 0.

One info alert per episode (``details["kind"] = "plateau"``); the episode
resolves once the recent median falls below the bar set when it opened (improved
by ``min_improvement`` on the plateau's level, or under ``high_fraction`` of the
initial level), and the window then starts empty, so a new plateau needs a whole
new window. ``details["from_start"]`` is True when the window holds every judged
value of the run: the loss never moved, which points at the data (labels all
masked, a wrong target) or at frozen parameters rather than at the optimizer.

The initial level belongs to the run, not to the attempt: after a restart from a
checkpoint ``job_started`` forgets the window, the warmup and the episode, but
keeps the level the run started from, so a resumed, already converged run is not
called high.

``details``: ``kind``, ``from_start``, ``window``, ``start_level``,
``recent_level``, ``initial_level``, ``improvement`` (fraction),
``threshold`` (the resolve bar), ``onset_step``, ``start_values`` and ``values``
(the window's first and last ``edge_values``).

Replay's blocks (``can_absorb``) are taken whole when no line of them could judge:
all in warmup, the window not full by the end, no initial level above 0; or when
every judgement is known without a median: converged (most of each line's last
``edge_values`` under the "still high" bar) or, in an episode, most of them at or
above its bar.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice, repeat
from operator import ge, indexOf, lt
from typing import Any

from pydantic import Field, model_validator

from sentinel.detectors.base import BaseDetector, MetricRuleConfig
from sentinel.detectors.series import (
    Warmup,
    finite_values,
    majority_in_every_window,
    warmup_and_values,
)
from sentinel.records import Alert, Block, Sample, Severity

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

    @model_validator(mode="after")
    def _edges_fit(self) -> LossPlateauConfig:
        if 2 * self.edge_values > self.window:
            raise ValueError("edge_values must be at most half of window")
        return self


class LossPlateauDetector(BaseDetector):
    """Raises one info alert when the loss has stayed flat and high for a whole window."""

    rule = "loss_plateau"
    config_model = LossPlateauConfig
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
        if sample.name == "lr":
            self._warmup.observe(sample)
            return []
        if sample.name != METRIC or not math.isfinite(sample.value):
            return []
        if len(self._first) < self.settings.edge_values:
            self._first.append(sample.value)
            if len(self._first) == self.settings.edge_values:
                self._set_high_bar()
        if self._warmup.active(sample.step):
            return []
        if len(self._window) == self._window.maxlen:
            self._moved_on = True
        self._window.append((sample.step, sample.value))
        if self._high_bar is not None and sample.value < self._high_bar:
            self._under_high += 1
        else:
            self._under_high = 0
        time = sample.time if sample.time is not None else now
        if self._bar is not None:
            return self._judge_recovery(sample, source, time)
        return self._judge_plateau(sample, source, time)

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """``observe`` per sample, with the common verdict found without a median.

        When the last ``edge_values`` values are all under the "still high" bar, so is
        their median: the loss has converged and ``_judge_plateau`` says nothing.
        """
        found: list[tuple[int, Alert]] = []
        warmup = self._warmup
        edge_values = self.settings.edge_values
        for index, sample in enumerate(samples):
            name, value, step, stamp = sample
            if name == "lr":
                if warmup.lr_rising is not False:
                    warmup.observe(sample)
                continue
            if name != METRIC or not math.isfinite(value):
                continue
            first = self._first
            if len(first) < edge_values:
                first.append(value)
                if len(first) == edge_values:
                    self._set_high_bar()
            if warmup.lr_rising or (step is not None and step < warmup.warmup_steps):
                continue
            window = self._window
            if len(window) == window.maxlen:
                self._moved_on = True
            window.append((step, value))
            high_bar = self._high_bar
            if high_bar is not None and value < high_bar:
                self._under_high += 1
                if self._bar is None and self._under_high >= edge_values:
                    continue  # converged: the recent median is under the bar
            else:
                self._under_high = 0
            time = stamp if stamp is not None else now
            if self._bar is not None:
                raised = self._judge_recovery(sample, source, time)
            else:
                raised = self._judge_plateau(sample, source, time)
            for alert in raised:
                found.append((index, alert))
        return found

    def _set_high_bar(self) -> None:
        """The "still high" bar, once the initial level is known; None where a sum of
        two values under it could overflow (the shortcut would then be unsound)."""
        initial = self.initial_level
        assert initial is not None
        bar = self.settings.high_fraction * initial
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
            # An episode: each line's recent median must stay at or above its bar.
            return self._medians_beside(ge, bar, values, 0)
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
        # Converged: each recent median under the "still high" bar. (Still improving
        # would need a median per line: such blocks go line by line.)
        high_bar = self._high_bar
        return high_bar is not None and self._medians_beside(lt, high_bar, values, judged_from)

    def _medians_beside(
        self,
        side: Callable[[float, float], bool],
        bar: float,
        values: list[float],
        judged_from: int,
    ) -> bool:
        """Whether at each judged line (from index ``judged_from`` of ``values``) the median
        of the last ``edge_values`` is ``side`` of ``bar`` (``ge``: at or above, ``lt``:
        under): it is when most of them are."""
        edge_values = self.settings.edge_values
        tail = [value for _, value in islice(reversed(self._window), edge_values - 1)]
        tail.reverse()
        flags = list(map(side, tail, repeat(bar)))
        flags += map(side, values, repeat(bar))
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
        high_bar = self._high_bar
        if high_bar is None or barred_from >= len(values):
            self._under_high = 0
            return
        barred = values[barred_from:]
        try:
            # The values under the bar at the end, back to the last one that was not.
            self._under_high = indexOf(map(lt, reversed(barred), repeat(high_bar)), False)
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
        if start <= 0:
            return []
        if recent < (1 - settings.min_improvement) * start:
            return []  # still improving
        if recent < settings.high_fraction * initial:
            return []  # flat, but low: converged
        self._bar = max((1 - settings.min_improvement) * recent, settings.high_fraction * initial)
        self._onset_step = self._window[0][0]
        from_start = not self._moved_on
        improvement = 1 - recent / start
        since = f"step {self._onset_step}" + (", the start of the run" if from_start else "")
        message = (
            f"loss flat at {recent:.4g} over {settings.window} logged values since {since}"
            f" (improved {improvement:.1%}, less than {settings.min_improvement:.0%};"
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
        return [self._alert(settings.severity, message, sample, source, time, details)]

    def _judge_recovery(self, sample: Sample, source: str, time: float) -> list[Alert]:
        assert self._bar is not None
        recent_values = self._edge(reversed(self._window))[::-1]
        recent = statistics.median(recent_values)
        if recent >= self._bar:
            return []
        message = f"loss improved to {recent:.4g} at step {sample.step} (under {self._bar:.4g})"
        details = {"kind": "recovered", "threshold": self._bar, "recent_level": recent}
        alert = self._alert(Severity.INFO, message, sample, source, time, details, resolves=True)
        self._bar = None
        self._onset_step = None
        self._window.clear()
        self._under_high = 0
        self._moved_on = True
        return [alert]

    def _alert(
        self,
        severity: Severity,
        message: str,
        sample: Sample,
        source: str,
        time: float,
        details: dict[str, Any],
        *,
        resolves: bool = False,
    ) -> Alert:
        return Alert(
            rule=self.rule,
            severity=severity,
            message=message,
            time=time,
            source=source,
            step=sample.step,
            metric=METRIC,
            value=sample.value,
            onset_step=self._onset_step,
            resolves=resolves,
            details=details,
        )
