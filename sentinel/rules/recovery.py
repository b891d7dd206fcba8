"""recovery: a restart after a rollback is judged, not assumed, to have restored health.

A rollback resumes from the checkpoint before the onset; that checkpoint may already hold
the cause (the Trainer saves after ``lr_scheduler.step()``, so a checkpoint at a learning
rate's jump holds the new rate), and the resumed run fails as before, only later or more
slowly. The run's level before the onset is what the resumed attempt must get back to: the
least of the loss's last ``level_values`` values before the onset (a loss still falling
lags above its least), with the noise of those values; the highest of its last
``2 x level_values`` is the top of its band. A resume without optimizer state
may bump and settle, so nothing is judged before the onset step.

From the onset step on, once ``confirm`` values of the resumed attempt are in (fewer when
the attempt ends first: a run that logs six values in all), their median is judged: at or
under ``rise`` (1.5) times the level and the level plus ``noise_sigmas`` robust standard
deviations of the values before, or under the top of the band, the restart restored
health, said once (``info``: "attempt 2 passed step 110 at loss 1.31: recovered"); above
all three, it did not: a critical alert whose onset is the step the attempt resumed from,
so the rollback goes further back, to a checkpoint before the one that held the cause. It
counts as a failure like any other: the same one again at the same step gives up (exit
90), and each rollback spends the restart budget. A loss at or below 0 is not judged by a
ratio.

The level is taken from what the rule saw of the attempts before (its ``memory`` keeps it
across a restart of sentinel beside the same job); ``RunFacts.resumed`` says where the
attempt resumed and the onset it resumed from.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from sentinel.model.facts import Resumed
from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricRuleConfig
from sentinel.rules.noise import wobble
from sentinel.rules.series import finite_with_steps, sorted_median


class RecoveryConfig(MetricRuleConfig):
    """``[rules.recovery]``: after a rollback, the resumed attempt must get back to the
    level the run had before the onset."""

    #: A restart that did not restore health is critical: roll back further, or give up.
    severity: Severity = Severity.CRITICAL
    #: The loss the resumed attempt is judged on.
    metric: str = "loss"
    #: The loss's values before the onset whose least is the level to get back to.
    level_values: int = Field(default=5, ge=1)
    #: Values from the onset step on whose median is judged.
    confirm: int = Field(default=2, ge=1)
    #: Not recovered: above this multiple of the level...
    rise: float = Field(default=1.5, gt=1.0)
    #: ...and above the level plus this many robust standard deviations of the values before.
    noise_sigmas: float = Field(default=4.0, ge=0)


#: Loss values kept from each attempt (the level before an onset is read off their end).
_KEPT = 64
#: The values before the onset whose wobble is its noise.
_NOISE_VALUES = 20


@dataclass(slots=True)
class Expectation:
    """What the resumed attempt must get back to, and what it has shown since the onset."""

    attempt: int
    onset_step: int
    resumed_at: int | None
    level: float
    noise: float
    #: Above this, not recovered: ``rise`` x the level, and the level plus its noise.
    bar: float
    cause: str
    since: list[tuple[int | None, float]]


class RecoveryDetector(BaseDetector):
    """Judges whether a restart after a rollback restored the run's health."""

    rule = "recovery"
    config_model = RecoveryConfig

    def __init__(self, config: RecoveryConfig) -> None:
        super().__init__(config)
        self.settings = config
        self.watches = frozenset({config.metric})
        #: The loss's last finite values, (step, value), across attempts until an onset.
        self._values: deque[tuple[int | None, float]] = deque(maxlen=_KEPT)
        #: The values the run showed before the last onset it was rolled back from.
        self._healthy: list[tuple[int, float]] = []
        self._expected: Expectation | None = None

    def job_started(self, now: float) -> None:
        """A new attempt: after a rollback, what it must get back to, from the values
        before the onset it resumed from; the values of the attempt start afresh."""
        resumed = self.facts.resumed
        self._expected = None
        if resumed is not None and resumed.onset_step is not None:
            onset = resumed.onset_step
            # What the run showed before this onset: the attempts' values before it, those of
            # an earlier attempt where the last one resumed past it (a rollback further back).
            known = [(step, value) for step, value in self._healthy if step < onset]
            last = known[-1][0] if known else None
            known += [
                (step, value) for step, value in self._values
                if step is not None and step < onset and (last is None or step > last)
            ]  # fmt: skip
            self._healthy = known[-_KEPT:]
            self._expected = self._expectation(resumed, [value for _, value in self._healthy])
        self._values.clear()

    def _expectation(self, resumed: Resumed, before: list[float]) -> Expectation | None:
        settings = self.settings
        if not before or resumed.onset_step is None:
            return None
        level = min(before[-settings.level_values :])
        if level <= 0:
            return None  # not judged by a ratio
        noise = wobble(before[-_NOISE_VALUES:])
        # The top of the band the run showed: a per-batch loss swinging 0.16-0.34 came back
        # at 0.26, under its own top, and was called unrecovered against 1.5 x its least.
        top = max(before[-2 * settings.level_values :])
        return Expectation(
            attempt=resumed.attempt,
            onset_step=resumed.onset_step,
            resumed_at=resumed.step,
            level=level,
            noise=noise,
            bar=max(self._bar(level, noise), top),
            cause=resumed.cause,
            since=[],
        )

    def _bar(self, level: float, noise: float) -> float:
        return max(level * self.settings.rise, level + self.settings.noise_sigmas * noise)

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        value = sample.value
        if not math.isfinite(value):
            return []  # nan_inf's
        self._values.append((sample.step, value))
        expected = self._expected
        if expected is None or sample.step is None or sample.step < expected.onset_step:
            return []
        expected.since.append((sample.step, value))
        if len(expected.since) < self.settings.confirm:
            return []
        return self._judge(sample, source, now)

    def job_exited(self, exit_code: int | None, now: float, *, expected: bool) -> list[Alert]:
        """An attempt that ends before ``confirm`` values past the onset is judged on those
        it logged: a run that logs rarely is judged all the same."""
        pending = self._expected
        if pending is None or not pending.since or expected:
            return []
        step, value = pending.since[-1]
        last = Sample(self.settings.metric, value, step)
        return self._judge(last, "recovery", now)

    def _judge(self, sample: Sample, source: str, now: float) -> list[Alert]:
        expected = self._expected
        assert expected is not None
        self._expected = None  # judged once
        values = sorted(value for _, value in expected.since)
        median = sorted_median(values)
        metric = self.settings.metric
        at = f"step {sample.step}" if sample.step is not None else "its onset"
        details = {
            "level": expected.level,
            "bar": expected.bar,
            "median": median,
            "onset_step": expected.onset_step,
            "resumed_at": expected.resumed_at,
            "cause": expected.cause,
            "values": len(values),
        }
        if median <= expected.bar:
            return [
                self.sample_alert(
                    sample,
                    severity=Severity.INFO,
                    message=f"attempt {expected.attempt} passed {at} at {metric}"
                    f" {median:.4g} (the run had {expected.level:.4g} before the"
                    f" {expected.cause} onset at step {expected.onset_step}): recovered",
                    time=now,
                    source=source,
                    details={**details, "recovered": True},
                )
            ]
        checkpoint = (
            f"the checkpoint of step {expected.resumed_at}"
            if expected.resumed_at is not None
            else "the checkpoint"
        )
        return [
            self.sample_alert(
                sample,
                severity=self.settings.severity,
                message=f"the restart did not restore health: {metric} {median:.4g} at {at}"
                f" against {expected.level:.4g} before the {expected.cause} onset"
                f" (step {expected.onset_step}); {checkpoint} may already hold the cause",
                time=now,
                source=source,
                # Roll back further: the checkpoint resumed from is at or after this onset.
                onset_step=expected.resumed_at,
                details={**details, "recovered": False},
            )
        ]

    def can_absorb(self, block: Block) -> bool:
        """Uneventful while no restart waits to be judged: the values are only kept."""
        return self._expected is None

    def absorb(self, block: Block) -> None:
        column = block.columns.get(self.settings.metric)
        if column is None:
            return
        values, steps = finite_with_steps(column, block.steps)
        self._values.extend(zip(steps, values, strict=True))

    def memory(self, now: float) -> dict[str, Any] | None:
        """The judgement still to come survives a restart of sentinel beside the job."""
        expected = self._expected
        if expected is None:
            return None
        return {
            "attempt": expected.attempt,
            "onset_step": expected.onset_step,
            "resumed_at": expected.resumed_at,
            "level": expected.level,
            "noise": expected.noise,
            "cause": expected.cause,
            "since": expected.since,
        }

    def remember(self, memory: dict[str, Any], *, same_job: bool) -> None:
        if not same_job:
            return
        level, noise = float(memory["level"]), float(memory["noise"])
        self._expected = Expectation(
            attempt=int(memory["attempt"]),
            onset_step=int(memory["onset_step"]),
            resumed_at=memory["resumed_at"],
            level=level,
            noise=noise,
            bar=self._bar(level, noise),
            cause=str(memory["cause"]),
            since=[(step, float(value)) for step, value in memory["since"]],
        )
