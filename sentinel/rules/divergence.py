"""divergence: the loss shifted up and did not come back.

A spike that recovers is ``loss_spike``'s warning; a loss that climbs and then stays
above where it was (a learning rate raised by mistake, a bad resume, a run that
blew up and settled on a worse level) wastes the rest of the run while looking
calm. This rule makes that its own critical incident, whose onset is the first
value of the shift, so the rollback goes back to a checkpoint before it.

Per watched metric (``metrics``, default the train loss):

- ``history``: the last ``window`` values that were not part of a shift (long enough
  to hold a per-epoch rhythm); ``level``: the median of the last ``level_window`` of them;
  ``noise``: 1.4826 x the median absolute deviation of ``history`` (a robust standard
  deviation), at least ``noise_floor`` x the level.
- A value opens a candidate shift when it is above the bar: the highest of ``rise`` x the
  level, the level plus ``noise_sigmas`` x the noise, and the ``envelope`` quantile of the
  history (what the run shows at the top of its normal wobble or rhythm).
- The candidate recovers (is forgotten, its values learned as normal) at the first value
  at most the recovery bar: ``recover`` x the level, or the level plus the noise.
- It is confirmed, critical, once ``patience`` values have come since its onset and the
  median of the last ``patience`` is still above the bar. A candidate that neither
  recovers nor confirms for a whole ``window`` is a new normal: learned.

Nothing is judged during warmup (configured steps, or the logged LR still rising: the
loss may wobble up as the rate climbs; ``loss_spike`` watches the warmup), before the
history holds ``min_history`` values, or while the level is <= 0 (a ratio to it means
nothing). Non-finite values are ``nan_inf``'s business and are skipped. A confirmed
shift resolves (info) when the metric comes back under the recovery bar.

``details``: ``kind`` (``"unrecovered"`` or ``"recovered"``), ``metric``, ``level``,
``noise``, ``threshold`` (the bar), ``recover_threshold``, ``onset_step``, ``ratio``
(median since onset / level), ``values``/``steps`` (the last ``level_window`` values
before the onset and those since), ``lr_jump`` (``[step, before, after]`` of a jump of
the logged learning rate within that evidence, else None).

The settings and the decision (``opens_shift``, and ``never_opens``, replay's proof that a
block holds no value it would open a shift on) are in ``divergence_shift``; the learning
rate's jumps in ``lr_jumps``.
"""

from __future__ import annotations

import math
from typing import Any

from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector
from sentinel.rules.divergence_shift import (
    DivergenceConfig,
    Shift,
    ShiftSeries,
    never_opens,
    opens_shift,
)
from sentinel.rules.lr_jumps import LrJumps
from sentinel.rules.series import Warmup, finite_values, finite_with_steps, sorted_median


class DivergenceDetector(BaseDetector):
    """Critical when the loss shifts up and stays there; resolves when it comes back."""

    rule = "divergence"
    config_model = DivergenceConfig

    def __init__(self, config: DivergenceConfig) -> None:
        super().__init__(config)
        self.settings = config
        self.watches = frozenset({*config.metrics, "lr"})
        self._warmup = Warmup(config.warmup_steps)
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
        for name in self.settings.metrics:
            series = self._series.setdefault(name, ShiftSeries(self.settings))
            series.shift = None
            series.resumed = len(series.history) > 0

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        if sample.name == "lr":
            self._warmup.observe(sample)
            self._lr.note(sample.step, sample.value)
            return []
        series = self._series.get(sample.name)
        if series is None or not math.isfinite(sample.value):
            return []
        return self._judge(series, sample, source, now)

    def _judge(self, series: ShiftSeries, sample: Sample, source: str, now: float) -> list[Alert]:
        _, value, step, stamp = sample[:4]
        if series.resumed:
            series.resume_at(step)
        shift = series.shift
        if shift is None:
            settings = self.settings
            if self._warmup.active(step) or len(series.history) < settings.min_history:
                series.learn(step, value)
                return []
            recent = [value for _, value in series.recent]
            current = opens_shift(value, series.history, recent, settings)
            if current is None:
                series.learn(step, value)
                return []
            series.shift = Shift(current, step, list(series.recent), [(step, value)])
            return []
        time = stamp if stamp is not None else now
        if value <= shift.bars.back:
            return self._recovered(series, shift, sample, source, time)
        shift.since.append((step, value))
        if shift.confirmed:
            return []
        patience = self.settings.patience
        if len(shift.since) < patience:
            return []
        latest = sorted_median(sorted(value for _, value in shift.since[-patience:]))
        if latest > shift.bars.shift:
            shift.confirmed = True
            return [self._alert(shift, latest, sample, source, time)]
        if len(shift.since) >= self.settings.window:
            series.forget_shift()  # neither back nor up: the run's new normal
        return []

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
        self, shift: Shift, latest: float, sample: Sample, source: str, time: float
    ) -> Alert:
        level = shift.bars.level
        count = len(shift.since)
        message = (
            f"{sample.name} shifted up at step {shift.onset_step} and has not recovered:"
            f" median {latest:.4g} over the last {self.settings.patience} values"
            f" ({latest / level:.2f}x its level {level:.4g} before the shift, above"
            f" {shift.bars.shift:.4g}) for {count} values; rolling back to before step"
            f" {shift.onset_step}"
        )
        return self.sample_alert(
            sample,
            severity=self.settings.severity,
            message=message,
            time=time,
            source=source,
            onset_step=shift.onset_step,
            details=self._details("unrecovered", shift, sample, latest),
        )

    def _details(
        self, kind: str, shift: Shift, sample: Sample, latest: float | None = None
    ) -> dict[str, Any]:
        latest = sample.value if latest is None else latest
        evidence = [*shift.before, *shift.since]
        bars_ = shift.bars
        first = evidence[0][0] if evidence else None
        return {
            "lr_jump": self._lr.within(first, shift.onset_step),
            "kind": kind,
            "metric": sample.name,
            "level": bars_.level,
            "noise": bars_.noise,
            "threshold": bars_.shift,
            "recover_threshold": bars_.back,
            "onset_step": shift.onset_step,
            "ratio": round(latest / bars_.level, 3),
            "values": [value for _, value in evidence],
            "steps": [step for step, _ in evidence],
        }

    def can_absorb(self, block: Block) -> bool:
        """Uneventful: no candidate shift, and every line in warmup or no value that could
        open one (``never_opens``)."""
        columns = block.columns
        judged = [name for name in self._series if name in columns]
        if not judged:
            return True  # only learning rates
        if any(self._series[name].shift or self._series[name].resumed for name in judged):
            return False
        if self._warmup.block_phase(block.step_range(), columns.get("lr")):
            return True
        settings = self.settings
        for name in judged:
            series = self._series[name]
            values = finite_values(columns[name])
            least = min((value for _, value in series.recent), default=math.inf)
            filling = max(0, settings.min_history - len(series.history))
            if not never_opens(values, least, filling, settings):
                return False
        return True

    def absorb(self, block: Block) -> None:
        """What ``observe`` does with values under every bar: learn them."""
        columns = block.columns
        self._warmup.extend(columns.get("lr"))
        self._lr.note_all(columns.get("lr"), block.steps)
        for name, series in self._series.items():
            column = columns.get(name)
            if column is not None:
                series.learn_all(*finite_with_steps(column, block.steps))
