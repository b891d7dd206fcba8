"""loss_scale: the fp16 loss scale collapsed (a critical), or its overflows cluster (a warning).

Dynamic loss scaling halves the scale on each overflowing step and skips that step. At the
start of an fp16 run the scaler calibrates (a few overflows from 65536 down): counted, not
alarmed. Later, a lone overflow every thousand steps is the scaler probing upwards. What is
a failure:

- the frameworks' own fatal errors: fairseq's ``FloatingPointError: Minimum loss scale
  reached (0.0001)``, DeepSpeed's ``Current loss scale already at minimum``;
- an overflow that sets the scale at or below ``min_loss_scale`` (1e-3: fairseq's floor is
  1e-4, and its healthy runs calibrate down to 4e-3), or a logged scale that falls there, or
  falls further while there (a log that begins amid the cascade: a run that sets its scale
  that low keeps it, it does not halve it);
- Megatron's ``number of skipped iterations`` above 0 on ``skipped_intervals`` logged
  intervals in a row after a clean one (long after the start).

Overflow events are read from the job's output (DeepSpeed's ``OVERFLOW! ... reducing to``,
fairseq's ``setting loss scale to``, apex's ``reducing loss scale to``), the scale's level
from those lines and from ``loss_scale`` samples, the skipped count from its samples.
"""

from __future__ import annotations

import re
from collections import deque

from pydantic import Field

from sentinel.model.records import PROGRESS, Alert, Block, Sample, Severity
from sentinel.model.untrusted import clipped
from sentinel.rules.base import BaseDetector, MetricNames, Reading, Recent, RuleConfig

#: Lines of the frameworks' fatal errors: the scale is at its minimum and the run ends.
#: The sample a parser makes of a framework's "loss scale already at minimum" (DeepSpeed):
#: read where output lines are not shown to the rules (replay before any timestamp).
AT_MINIMUM = "loss_scale_at_minimum"
FATAL = re.compile(r"Minimum loss scale reached|loss scale already at minimum", re.IGNORECASE)
#: An overflow that lowered the scale, and the new scale where the line gives it.
OVERFLOW = re.compile(
    r"(?:overflow|skipping step).*?(?:reducing(?: loss scale)? to|setting loss scale to:?)"
    r"\s*(?P<scale>[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)?",
    re.IGNORECASE,
)
#: The sample a parser makes of an overflow that could not lower the scale (DeepSpeed's
#: ``Attempted loss scale: 1, reducing to 1``): its value is the scale.
AT_FLOOR = "loss_scale_at_floor"
#: The sample a parser makes of an overflow that lowered the scale (apex's ``reducing loss
#: scale to``, fairseq's ``setting loss scale to``, DeepSpeed's ``reducing to``): its value
#: is the new scale. Read where output lines are not shown to the rules (replay before any
#: timestamp): an overflow that sets the scale at or below ``min_loss_scale`` collapses it
#: there too, from the first such line (a level alone, that low from its first reading, may
#: be a run that sets it there).
OVERFLOWED = "loss_scale_overflow"
#: Overflows in a row that could not lower the scale (at the scaler's floor) that collapse
#: it: no step is applied any more.
STUCK_OVERFLOWS = 3
#: A level in a progress line: Megatron's ``loss scale: 65536.0``.
LEVEL = re.compile(r"loss scale:\s*(?P<scale>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)", re.IGNORECASE)
#: Megatron's count of the interval's skipped iterations, on the same line.
SKIPPED = re.compile(r"number of skipped iterations:\s*(?P<count>\d+)", re.IGNORECASE)
#: What an output line must contain to concern this rule (a cheap test on every line).
_MARK = "oss scale"


class LossScaleConfig(RuleConfig):
    """``[rules.loss_scale]``."""

    #: Metrics that carry the scale's level.
    scale_metrics: MetricNames = Field(default_factory=lambda: ["loss_scale"])
    #: Metrics that count the iterations skipped in each logged interval (Megatron).
    skipped_metrics: MetricNames = Field(
        default_factory=lambda: ["skipped_iterations", "number_of_skipped_iterations"]
    )
    #: A scale at or below this is collapsed. fairseq runs healthily at 0.5 and calibrates
    #: down to 0.004; its floor (1e-4) ends the run with its own error, as DeepSpeed's (1)
    #: does, so the bar sits a few halvings above fairseq's floor.
    min_loss_scale: float = Field(default=1e-3, ge=0)
    #: Logged intervals in a row with skipped iterations, after a clean one, that are a collapse.
    skipped_intervals: int = Field(default=5, ge=2)
    #: Overflows within ``window_steps`` steps (after calibration) that warn.
    cluster: int = Field(default=5, ge=2)
    window_steps: int = Field(default=200, ge=1)


class LossScaleDetector(BaseDetector):
    """Critical when the loss scale collapses; warns when overflows cluster."""

    rule = "loss_scale"
    config_model = LossScaleConfig
    story = "blow_up"

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        drawn = "grad_norm" if "grad_norm" in recent else None
        if alert.severity is Severity.CRITICAL:
            return (
                "the fp16 loss scale collapsed: the gradients overflow even unscaled",
                "roll back to the checkpoint before the overflows began; train in bf16, or"
                " lower the learning rate and clip gradients at 1.0",
                drawn,
            )
        return (
            "fp16 overflows cluster: the loss scaler skips step after step",
            "the smoke before a collapse: watch the grad-norm; lower the learning rate or"
            " move to bf16 if it goes on",
            drawn,
        )

    def __init__(self, config: LossScaleConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._scale_names = frozenset(config.scale_metrics)
        self._skipped_names = frozenset(config.skipped_metrics)
        self._reset()

    def _reset(self) -> None:
        #: Overflows seen this attempt (the scaler's skipped steps), calibration included.
        self.overflows = 0
        self._step: int | None = None
        self._scale: float | None = None
        self._highest: float | None = None
        # Calibrated once a step passes without an overflow (or an interval without skips).
        self._calibrated = False
        self._overflow_steps: deque[int] = deque()
        self._last_overflow: int | None = None
        self._skipping = 0  # logged intervals in a row with skipped iterations
        self._skipping_since: int | None = None
        self._skips_in_text = False
        self._clean_interval = False  # a logged interval with no skipped iteration
        # Overflows with no new step between them, and the step before the first of them.
        self._run_of_overflows = False
        self._cascade_from: int | None = None
        self._warned = False
        self._critical = False
        # Overflows in a row that left the scale where it was (at its floor), and the step
        # of the first of them.
        self._stuck = 0
        self._stuck_from: int | None = None
        self._floor_at: int | None = None  # the step of the last of them

    def job_started(self, now: float) -> None:
        self._reset()

    # -- output lines --------------------------------------------------------------

    def output_text(self, text: str, source: str, now: float) -> list[Alert]:
        if _MARK not in text:
            return []
        fatal = FATAL.search(text)
        if fatal is not None:
            return self._collapse(
                "the fp16 loss scale is at its minimum and the job says so:"
                f" {clipped(text.strip(), 200)}",
                self._scale,
                source,
                now,
                onset=self._last_overflow,
            )
        overflow = OVERFLOW.search(text)
        if overflow is not None:
            scale = overflow.group("scale")
            return self._overflow(float(scale) if scale else None, source, now)
        alerts = []
        level = LEVEL.search(text)
        if level is not None:
            alerts += self._level(float(level.group("scale")), source, now)
        skipped = SKIPPED.search(text)
        if skipped is not None:
            # The line's own samples may carry the same count: the line's is the one counted.
            self._skips_in_text = True
            alerts += self._skipped(float(skipped.group("count")), source, now)
        return alerts

    # -- samples -------------------------------------------------------------------

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        found: list[tuple[int, Alert]] = []
        for index, sample in enumerate(samples):
            name, value, step = sample[0], sample[1], sample[2]
            if name == PROGRESS:
                continue
            if step is not None:
                self._new_step(step)
            if name in self._scale_names:
                found += [(index, alert) for alert in self._level(value, source, now)]
            elif name in self._skipped_names and not self._skips_in_text:
                found += [(index, alert) for alert in self._skipped(value, source, now)]
            elif name == AT_FLOOR:
                found += [(index, alert) for alert in self._at_floor(value, source, now)]
            elif name == OVERFLOWED and value <= self.settings.min_loss_scale:
                alerts = self._collapse(
                    f"an fp16 overflow set the loss scale to {value:g}, at or below"
                    f" {self.settings.min_loss_scale:g}: the gradients overflow even unscaled",
                    value,
                    source,
                    now,
                    onset=self._step,
                )
                found += [(index, alert) for alert in alerts]
            elif name == AT_MINIMUM and value > 0:
                alerts = self._collapse(
                    "the fp16 loss scale is at its minimum and the job says so",
                    self._scale,
                    source,
                    now,
                    onset=self._last_overflow,
                )
                found += [(index, alert) for alert in alerts]
        return found

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        return [alert for _, alert in self.observe_samples([sample], source, now)]

    def _new_step(self, step: int) -> None:
        """A new step: past the last overflow (or past the first step, with none yet), the
        scaler has calibrated."""
        previous = self._step
        if previous is None or step > previous:
            self._step = step
            self._run_of_overflows = False
            last = self._last_overflow
            if (last is None and previous is not None) or (last is not None and step > last):
                self._calibrated = True
            floor = self._floor_at
            if previous is not None and (floor is None or floor < previous):
                self._stuck = 0  # a step passed with no overflow at the floor: it trained

    # -- judging -------------------------------------------------------------------

    def _at_floor(self, scale: float, source: str, now: float) -> list[Alert]:
        """An overflow that could not lower the scale (DeepSpeed's ``Attempted loss scale:
        1, reducing to 1``): at the scaler's floor, the step is skipped all the same.
        ``STUCK_OVERFLOWS`` in a row: no step is applied any more. A real T5-11B fp16 run
        skipped every step at scale 1 and raised nothing, DeepSpeed's floor (1) being far
        above ``min_loss_scale``."""
        if self._stuck == 0:
            self._stuck_from = self._step
        self._stuck += 1
        self._floor_at = self._step
        if self._stuck < STUCK_OVERFLOWS or self._critical:
            return []
        return self._collapse(
            f"{self._stuck} fp16 overflows in a row with the loss scale at its floor ({scale:g}):"
            " the scaler cannot lower it, so every step is skipped and nothing trains",
            scale,
            source,
            now,
            onset=self._stuck_from,
        )

    def _overflow(self, scale: float | None, source: str, now: float) -> list[Alert]:
        self.overflows += 1
        step = self._step if self._step is not None else 0
        if self._last_overflow is None or not self._run_of_overflows:
            self._cascade_from = self._step
        self._last_overflow = step
        self._run_of_overflows = True
        if scale is not None and scale <= self.settings.min_loss_scale:
            return self._collapse(
                f"an fp16 overflow set the loss scale to {scale:g}, at or below"
                f" {self.settings.min_loss_scale:g}: the gradients overflow even unscaled",
                scale,
                source,
                now,
                onset=self._cascade_from,
            )
        alerts = [] if scale is None else self._level(scale, source, now)
        if not self._calibrated or self._critical:
            return alerts  # the scaler calibrating at the start: counted, not alarmed
        window = self._overflow_steps
        window.append(step)
        while window and window[0] <= step - self.settings.window_steps:
            window.popleft()
        if self._warned or len(window) < self.settings.cluster:
            return alerts
        self._warned = True
        return [
            *alerts,
            Alert(
                rule=self.rule,
                severity=Severity.WARNING,
                message=(
                    f"{len(window)} fp16 overflows (skipped steps) within"
                    f" {self.settings.window_steps} steps, up to step {step}; {self.overflows}"
                    " this attempt"
                ),
                time=now,
                source=source,
                step=self._step,
                metric="loss_scale",
                value=self._scale,
                onset_step=window[0],
                details={"overflows": self.overflows},
            ),
        ]

    def _level(self, scale: float, source: str, now: float) -> list[Alert]:
        previous, self._scale = self._scale, scale
        highest = self._highest
        if highest is None or scale > highest:
            self._highest = scale
        if scale > self.settings.min_loss_scale:
            return []
        if highest is None or highest <= self.settings.min_loss_scale:
            if previous is None or not scale < previous:
                return []  # never above the minimum, and not falling: a run that sets it there
            # Still halving down there (a log that begins amid the cascade): collapsed.
            return self._collapse(
                f"the fp16 loss scale fell to {scale:g} from {previous:g} (at or below"
                f" {self.settings.min_loss_scale:g}): the gradients overflow even unscaled",
                scale,
                source,
                now,
                onset=self._last_overflow,
            )
        return self._collapse(
            f"the fp16 loss scale fell to {scale:g} (at or below {self.settings.min_loss_scale:g},"
            f" from {highest:g})",
            scale,
            source,
            now,
            onset=self._last_overflow,
        )

    def _skipped(self, count: float, source: str, now: float) -> list[Alert]:
        if not count > 0:
            self._clean_interval = True
            self._skipping = 0
            return []
        self.overflows += int(count)
        if self._skipping == 0:
            self._skipping_since = self._step
        self._skipping += 1
        if not self._clean_interval or self._skipping < self.settings.skipped_intervals:
            return []
        return self._collapse(
            f"iterations skipped on {self._skipping} logged intervals in a row"
            f" (since step {self._skipping_since}), long after the start: the loss scale"
            " cannot hold",
            self._scale,
            source,
            now,
            onset=self._skipping_since,
        )

    def _collapse(
        self, message: str, value: float | None, source: str, now: float, *, onset: int | None
    ) -> list[Alert]:
        if self._critical:
            return []
        self._critical = True
        return [
            Alert(
                rule=self.rule,
                severity=Severity.CRITICAL,
                message=message,
                time=now,
                source=source,
                step=self._step,
                metric="loss_scale",
                value=value,
                onset_step=onset if onset is not None else self._step,
                details={"overflows": self.overflows, "kind": "collapse"},
            )
        ]

    # -- replay blocks -------------------------------------------------------------

    def can_absorb(self, block: Block) -> bool:
        """A block with no line about the loss scale and none of its metrics: only the step
        moves (and, past the last overflow, calibration ends), as ``absorb`` does."""
        names = block.names
        if not self._scale_names.isdisjoint(names) or not self._skipped_names.isdisjoint(names):
            return False
        if AT_MINIMUM in names or AT_FLOOR in names or OVERFLOWED in names:
            return False
        # One search in C over the joined block, not a Python test per line (replay's speed).
        return not (block.output and _MARK in "\n".join(block.texts))

    def absorb(self, block: Block) -> None:
        if block.names and block.steps:
            # The first step, then the last: past a second step the scaler has calibrated,
            # as it has line by line.
            self._new_step(min(block.steps))
            self._new_step(max(block.steps))
