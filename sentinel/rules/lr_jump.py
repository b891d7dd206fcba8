"""lr_jump: the learning rate jumps where no schedule explains it.

A logged learning rate is a jump when it is ``factor`` (10) times or more the rate logged
before it and more than ``above_seen`` (2) times the highest rate the attempt logged
before, once the attempt has logged ``min_values`` rates. A warmup climbs by small
factors once under way (its first values may be far apart, near 0: hence
``min_values``); a decay only falls; a restart, a cycle or a one-cycle schedule goes
back to rates it had before. A jump is a scheduler restarted or resumed with other
settings, a wrong multiplier or unit, a rate typed in the wrong place.

Alone it warns (``severity``): people change the rate on purpose. With the loss it acts
(``act_severity``, critical: stop, roll back, restart), judged on values, not steps, so
at any logging cadence: once ``confirm`` loss values have been logged since the jump and
their median is ``loss_rise`` (1.3) times or more the loss's level before it (the least
of its last ``level_values`` values: a loss early in a run still falls fast, and a median
of them lags above it) and above that level's noise (``noise_sigmas``
robust standard deviations of the values before, once ``noise_values`` are known),
within ``loss_window`` values of the jump. A loss at or below 0 (a Gaussian or flow
likelihood, an RL or GAN objective) is not judged by a ratio: its level's noise alone is
the bar, once ``noise_values`` are known (with fewer, or none, the jump stays a warning).

The onset is the step of the last rate logged before the jump (``changed_after``): the
rate changed after it, and a checkpoint saved at that very step may already hold the new
rate in its optimizer and scheduler state. The Trainer (transformers 4.46 on) logs the rate
a step ran at and saves after the scheduler's step: its checkpoint of step 100 holds the
rate of step 101. The rollback goes to the newest checkpoint saved before that step.

``details``: ``kind`` (``"jump"`` alone, ``"with_loss"`` when it acts), ``lr_jump``
(``[step, before, after]``, as the diagnosis reads it from any rule), ``ratio``,
``highest_before``, ``changed_after`` (the step of the last rate before it),
``loss_level``, ``loss_since`` and ``loss_ratio`` once the loss is judged.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, model_validator

from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricRuleConfig, Reading, Recent
from sentinel.rules.lr_jumps import (
    UNEXPLAINED,
    UNEXPLAINED_RATIO,
    before_change,
    unexplained_jump,
)
from sentinel.rules.noise import how_far_above, wobble
from sentinel.rules.series import finite_with_steps, sorted_median


class LrJumpConfig(MetricRuleConfig):
    """``[rules.lr_jump]``: a jump of the logged learning rate no schedule explains."""

    #: Severity of a jump alone.
    severity: Severity = Severity.WARNING
    #: A jump is at least this multiple of the rate logged before it...
    factor: float = Field(default=UNEXPLAINED_RATIO, gt=1.0)
    #: ...and more than this multiple of the highest rate logged before it in the attempt.
    above_seen: float = Field(default=UNEXPLAINED, ge=1.0)
    #: Rates the attempt must have logged before one can be a jump.
    min_values: int = Field(default=2, ge=1)
    #: The loss whose rise after a jump makes it act.
    metric: str = "loss"
    #: The loss's values before the jump whose least is its level.
    level_values: int = Field(default=3, ge=1)
    #: Loss values since the jump, at their median, that must be above the bar to act.
    confirm: int = Field(default=2, ge=1)
    #: The bar: at least this multiple of the loss's level before the jump...
    loss_rise: float = Field(default=1.3, gt=1.0)
    #: ...and the level plus this many robust standard deviations of the values before...
    noise_sigmas: float = Field(default=3.0, ge=0)
    #: ...once at least this many values before the jump are known.
    noise_values: int = Field(default=5, ge=3)
    #: Loss values after the jump within which the loss must rise for the jump to act.
    loss_window: int = Field(default=10, ge=1)
    #: Severity of a jump with the loss risen: critical stops the job and rolls back.
    act_severity: Severity = Severity.CRITICAL

    @model_validator(mode="after")
    def _coherent(self) -> LrJumpConfig:
        if self.confirm > self.loss_window:
            raise ValueError("confirm must not exceed loss_window")
        if self.act_severity < self.severity:
            raise ValueError("act_severity must not be lower than severity")
        return self


#: Loss values kept from before a jump: its level and its noise.
_BEFORE = 50


@dataclass(slots=True)
class Jump:
    """A jump the loss may still confirm: where the rate changed, and the loss since."""

    step: int | None
    before: float
    after: float
    highest: float
    changed_after: int | None
    onset_step: int | None
    level: float | None
    noise: float
    since: list[float] = field(default_factory=list)
    acted: bool = False


class LrJumpDetector(BaseDetector):
    """Warns on a learning-rate jump no schedule explains; critical when the loss rises
    with it."""

    rule = "lr_jump"
    config_model = LrJumpConfig
    divergent = True
    incident_reading = 10  # the cause the others' readings would only guess at

    @classmethod
    def read_incident(
        cls,
        incident: Incident,
        recent: Recent,
        lr: tuple[str, str] | None,
        divergent: frozenset[str],
    ) -> Reading | None:
        for alert in incident.alerts:
            if alert.rule != cls.rule:
                continue
            step, before, after = alert.details["lr_jump"]
            changed = alert.details.get("changed_after")
            at = f" at step {step}" if step is not None else ""
            return (
                f"the learning rate jumped {after / before:.3g}x{at} (from {before:.3g} to"
                f" {after:.3g}) where no warmup, decay or restart of its schedule explains it",
                f"roll back to {before_change(changed)}; look at the scheduler: restarted"
                " or resumed with other"
                " settings, a wrong multiplier or unit",
                alert.details.get("loss_metric") or "lr",
            )
        return None

    def __init__(self, config: LrJumpConfig) -> None:
        super().__init__(config)
        self.settings = config
        self.watches = frozenset({"lr", config.metric})
        #: The attempt's logged rates: how many, the highest, the last (step, value).
        self._count = 0
        self._highest = 0.0
        self._last: tuple[int | None, float] | None = None
        #: The loss's last finite values before now, (step, value).
        self._loss: deque[tuple[int | None, float]] = deque(maxlen=_BEFORE)
        #: Losses appended in all, and how many had been at the last rate: those since it
        #: are the jump's own where no step tells them apart (a log whose dicts name none).
        self._appended = 0
        self._appended_at_rate = 0
        self._jump: Jump | None = None
        #: The step of the attempt's first logged rate.
        self._first_step: int | None = None

    def job_started(self, now: float) -> None:
        """A new attempt: its rates start afresh (a resume's come from its checkpoint)."""
        self._first_step = None
        self._count = 0
        self._highest = 0.0
        self._last = None
        self._loss.clear()
        self._appended = self._appended_at_rate = 0
        self._jump = None

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        value = sample.value
        if not math.isfinite(value):
            return []
        if sample.name == "lr":
            return self._rate(sample, source, now)
        jump = self._jump
        self._loss.append((sample.step, value))
        self._appended += 1
        if jump is None or jump.acted or jump.level is None:
            return []
        jump.since.append(value)
        return self._judge_loss(jump, sample, source, now)

    def _rate(self, sample: Sample, source: str, now: float) -> list[Alert]:
        value, step = sample.value, sample.step
        if value <= 0:
            return []
        settings = self.settings
        if self._starts_again(step):
            # Another run from its start in the same log (Keras' CSVLogger(append=True)
            # appends each fit to one file): its schedule starts afresh, as a new attempt's.
            self.job_started(now)
        if self._first_step is None:
            self._first_step = step
        last, highest = self._last, self._highest
        # The losses since the last rate: the record of this one, and any between.
        fresh = min(self._appended - self._appended_at_rate, len(self._loss))
        self._appended_at_rate = self._appended
        self._count += 1
        self._last = (step, value)
        self._highest = max(highest, value)
        if (
            last is None
            or self._count <= settings.min_values
            or not unexplained_jump(
                last[1], value, highest, factor=settings.factor, above_seen=settings.above_seen
            )
        ):
            return []
        changed_after = last[0]
        onset = changed_after if changed_after is not None else step
        if changed_after is None:
            # No step tells the losses apart: those since the last rate ran on the new one
            # (the Trainer logs a record's loss and the rate it ran at together).
            losses = [v for _, v in self._loss]
            before, unstepped = losses[: len(losses) - fresh], losses[len(losses) - fresh :]
        else:
            before = [v for s, v in self._loss if s is None or s <= changed_after]
            unstepped = []
        level = None
        noise = 0.0
        if before and min(before) > 0:
            level = min(before[-settings.level_values :])
            if len(before) >= settings.noise_values:
                noise = wobble(before)
        elif len(before) >= settings.noise_values and wobble(before) > 0:
            # At or below 0 no ratio means anything: the level's noise alone is the bar.
            level, noise = min(before[-settings.level_values :]), wobble(before)
        self._jump = Jump(step, last[1], value, highest, changed_after, onset, level, noise)
        # The loss logged with the rate at its own step already ran on the new rate.
        since = [
            v
            for s, v in self._loss
            if s is not None and changed_after is not None and s > changed_after
        ]
        self._jump.since.extend(since or unstepped)
        ratio = value / last[1]
        at = f" at step {step}" if step is not None else ""
        when = f" (step {changed_after})" if changed_after is not None else ""
        message = (
            f"learning rate {value:.3g}{at} is {ratio:.3g}x the {last[1]:.3g}"
            f" logged before it{when} and above anything this attempt"
            f" logged ({highest:.3g}): no warmup, decay or restart explains it"
        )
        alert = self.sample_alert(
            sample,
            severity=settings.severity,
            message=message,
            time=sample.time if sample.time is not None else now,
            source=source,
            onset_step=onset,
            details=self._details("jump", self._jump),
        )
        if since and level is not None:
            return [alert, *self._judge_loss(self._jump, sample, source, now)]
        return [alert]

    def _judge_loss(self, jump: Jump, sample: Sample, source: str, now: float) -> list[Alert]:
        settings = self.settings
        since = jump.since[: settings.loss_window]
        if len(since) < settings.confirm or jump.level is None:
            return []
        latest = sorted_median(sorted(since[-settings.confirm :]))
        bar = max(settings.loss_rise * jump.level, jump.level + settings.noise_sigmas * jump.noise)
        if latest <= bar:
            if len(jump.since) >= settings.loss_window:
                jump.level = None  # the loss did not follow: the jump stays a warning
            return []
        jump.acted = True
        details = self._details("with_loss", jump)
        details.update(
            loss_metric=settings.metric,
            loss_since=list(since),
            loss_ratio=round(latest / jump.level, 3) if jump.level > 0 else None,
            loss_threshold=bar,
        )
        message = (
            f"the learning rate jumped {jump.after / jump.before:.3g}x"
            f"{f' at step {jump.step}' if jump.step is not None else ''}"
            f" and {settings.metric} rose with it: median {latest:.4g} over its last"
            f" {settings.confirm} values, {how_far_above(latest, jump.level, jump.noise)} its level"
            f" {jump.level:.4g} before the jump; rolling back to"
            f" {before_change(jump.changed_after)}"
        )
        return [
            self.sample_alert(
                sample,
                severity=settings.act_severity,
                message=message,
                time=sample.time if sample.time is not None else now,
                source=source,
                onset_step=jump.onset_step,
                details=details,
            )
        ]

    def _details(self, kind: str, jump: Jump) -> dict[str, Any]:
        return {
            "kind": kind,
            "lr_jump": [jump.step, jump.before, jump.after],
            "ratio": round(jump.after / jump.before, 3),
            "highest_before": jump.highest,
            "changed_after": jump.changed_after,
            "onset_step": jump.onset_step,
            "loss_level": jump.level,
        }

    def _starts_again(self, step: int | None) -> bool:
        """Whether a rate at ``step`` is another run's first: at or before the attempt's
        first rate's step, after later ones. A resume to a step in between is the same
        run's schedule going on (its rate a jump where a resume changed it)."""
        last, first = self._last, self._first_step
        return (
            step is not None
            and first is not None
            and last is not None
            and last[0] is not None
            and step < last[0]
            and step <= first
        )

    def can_absorb(self, block: Block) -> bool:
        """Uneventful: no loss for a jump it may still confirm, and no rate in the block
        can be a jump (each is at most ``above_seen`` x the highest logged before the
        block, and a jump must be above that)."""
        jump = self._jump
        pending = jump is not None and not jump.acted and jump.level is not None
        if pending and self.settings.metric in block.columns:
            return False
        column = block.columns.get("lr")
        if column is None:
            return True
        values, steps = finite_with_steps(column, block.steps)
        positive = [value for value in values if value > 0]
        if not positive:
            return True
        if any(self._starts_again(step) for step in steps) or steps != sorted(steps):
            return False  # another run from its start: line by line
        return self._highest > 0 and max(positive) <= self.settings.above_seen * self._highest

    def absorb(self, block: Block) -> None:
        """What ``observe`` does with rates that are no jump and losses with no jump
        pending (``can_absorb``)."""
        column = block.columns.get("lr")
        if column is not None:
            values, steps = finite_with_steps(column, block.steps)
            rates = [(step, value) for step, value in zip(steps, values, strict=True) if value > 0]
            if rates:
                if self._first_step is None:
                    self._first_step = rates[0][0]
                self._count += len(rates)
                self._last = rates[-1]
                self._highest = max(self._highest, max(value for _, value in rates))
        column = block.columns.get(self.settings.metric)
        if column is not None:
            values, steps = finite_with_steps(column, block.steps)
            self._loss.extend(zip(steps, values, strict=True))
            self._appended += len(values)
        if "lr" in block.columns:
            self._appended_at_rate = self._appended  # none of them after the block's rates
