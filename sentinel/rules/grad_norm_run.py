"""grad_norm_run: grad-norm above a bar for several logged steps in a row.

The smoke before the NaN: a divergence shows in the gradient norm a few steps
before the loss turns NaN, so this rule is what lets sentinel stop (and roll back)
a job before its checkpoints are poisoned. Three kinds, one rule, one episode
(``details["kind"]``):

- ``"absolute"``: grad-norm above ``threshold`` on ``sustain`` consecutive
  logged steps;
- ``"relative"``: above ``factor`` x its own rolling median (the last
  ``window`` values that were not in a run; judged once it holds ``min_history``)
  and more than ``noise_sigmas`` robust standard deviations of that window above
  it (a change inside the run's own wobble is none, whatever its ratio), on
  ``sustain`` consecutive steps, some of them under ``threshold``;
- ``"leap"``: a high value ``LEAP`` (1,000) times the run's level (its rolling median, or
  the highest value seen before the median is judged), on its own value: orders of
  magnitude in one logged value, where ``sustain`` values may be thousands of steps;
- ``"clipping"``: when ``max_grad_norm`` is known, at least ``clip_fraction`` of
  the last ``clip_window`` logged grad-norms are >= it. Trainers log the norm
  before clipping (``clip_grad_norm_`` returns it), so that is clipping engaged
  on most steps: the learning rate is likely too high.

During warmup (configured steps, or the logged LR still rising) a high grad-norm
is normal, so the rule relaxes, it does not switch off: it learns the median, and
warns once (``"warmup"``) when the grad-norm stays above ``warmup_factor`` x the
least it has been in this attempt (``lower_least``: a value that far under it is a batch
with no gradient) for ``sustain`` consecutive steps: far above the run's own early values,
whatever the learning rate does. Non-finite values are
``nan_inf``'s business and are skipped. The episode resolves after
``resolve_after`` consecutive values under every bar (not in a run, and clipping
under ``clip_fraction``). ``onset_step`` is the first step of the run (of the
clipped values, for ``"clipping"``).

``details``: ``kind``, ``threshold`` (the bar crossed), ``median`` (None before
``min_history``), ``run_length``, ``onset_step``, ``max_grad_norm``, and
``values``/``steps``: the values before the run and the run itself (the clip
window, for ``"clipping"``), plus ``clipped`` and ``clip_window`` for clipping.

The decisions are written once, ``is_high`` and ``is_clipped``: ``observe`` judges
each value with them, and replay's blocks (``can_absorb``) are taken whole when every
line is in warmup (and none far above the least seen, unless that warning was given),
or none is, no episode is open, the block's largest value is not
high against no median (the absolute bar), no value is above ``relative_bar`` of the
least value the median could be taken over (the bar rises with the median), and no
clip window ending in the block reaches ``clip_fraction``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from functools import partial
from itertools import accumulate, islice, repeat
from operator import sub
from typing import Any, ClassVar

from pydantic import Field, model_validator

from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricRuleConfig, Reading, Recent
from sentinel.rules.noise import robust_sigma
from sentinel.rules.series import (
    Rolling,
    Warmup,
    finite_values,
    never_above,
    sorted_median,
    warmup_and_values,
)


class GradNormRunConfig(MetricRuleConfig):
    """``[rules.grad_norm_run]``.

    The defaults are the runbooks': a grad-norm above 10 for 3 consecutive logged
    steps, or far above its own median, is the usual prelude to a NaN loss; a
    trainer that clips on most steps (HF's ``max_grad_norm`` is 1.0) is running
    with too high a learning rate.
    """

    renamed: ClassVar[Mapping[str, str]] = {"run_length": "sustain", "relative_factor": "factor"}

    #: A grad-norm above this is high whatever the run's history.
    threshold: float = Field(default=10.0, gt=0)
    #: Consecutive logged steps above a bar that make a run.
    sustain: int = Field(default=3, ge=1, le=1000)
    #: A grad-norm above this multiple of its rolling median is high.
    factor: float = Field(default=5.0, gt=1.0)
    #: Values (not in a run) whose median is the relative baseline.
    window: int = Field(default=50, ge=1, le=100_000)
    #: Values the median needs before the relative test is made.
    min_history: int = Field(default=10, ge=1)
    #: The job's gradient clipping norm; None (unknown) turns the clipping test off.
    max_grad_norm: float | None = Field(default=None, gt=0)
    #: Fraction of the last ``clip_window`` grad-norms at or above ``max_grad_norm`` that warns.
    clip_fraction: float = Field(default=0.9, gt=0, le=1)
    #: Logged grad-norms the clipping fraction is taken over.
    clip_window: int = Field(default=20, ge=1, le=100_000)
    #: Consecutive values under every bar that end the episode.
    resolve_after: int = Field(default=5, ge=1)
    #: The relative bar also needs this many robust standard deviations above the median.
    noise_sigmas: float = Field(default=3.0, ge=0)
    #: The noise is at least this fraction of the median (a flat series has a MAD of 0).
    noise_floor: float = Field(default=0.01, ge=0)
    #: In warmup, a run above this multiple of the least grad-norm seen warns once.
    warmup_factor: float = Field(default=10.0, gt=1.0)

    @model_validator(mode="after")
    def _history_fits(self) -> GradNormRunConfig:
        if self.min_history > self.window:
            raise ValueError("min_history must not exceed window")
        return self


def relative_bar(median: float, factor: float) -> float:
    """The relative bar: ``factor`` x the rolling median, rising with it."""
    return factor * median


def is_high(
    value: float,
    median: float | None,
    settings: GradNormRunConfig,
    window: Rolling | None = None,
    least: float = 0.0,
    level: float | None = None,
) -> bool:
    """Whether a grad-norm is high: above ``threshold`` in a run that has been under it
    (``least``, the least grad-norm of the attempt: a run whose norm was never under the
    bar, as an fp16 run logging scaled norms, has a normal of its own), or above the
    relative bar of the rolling ``median`` (None before ``min_history``; a median of 0 sets
    no bar) and the noise of its ``window`` (None: the ratio alone, an upper bound used by
    ``can_absorb``; so are the defaults of ``least`` and ``level``, see ``absolute_applies``)."""
    if value > settings.threshold and absolute_applies(level, least, settings):
        return True
    if not median or value <= relative_bar(median, settings.factor):
        return False
    if window is None:
        return True
    noise = robust_sigma(window.ordered(), median, settings.noise_floor)
    return value - median > settings.noise_sigmas * noise


def absolute_applies(level: float | None, least: float, settings: GradNormRunConfig) -> bool:
    """Whether the absolute bar means anything for this run: it has been under it (its
    ``least``), and its recent level (the median of its latest judged values), when known,
    is under half of it. A run whose normal sits near the bar (a grad-norm wobbling 5-15
    all along) is judged against its own median and noise instead."""
    if least > settings.threshold:
        return False
    return level is None or level <= settings.threshold / 2


def warmup_bar(least: float, settings: GradNormRunConfig) -> float:
    """In warmup, a grad-norm above this is far above the ``least`` seen (rising with it)."""
    return settings.warmup_factor * least


def lower_least(least: float, value: float, settings: GradNormRunConfig) -> float:
    """The least grad-norm of the attempt after ``value``: it falls by ``warmup_factor`` at
    most a value. A grad-norm that much under the least before it is a batch with no
    gradient, no yardstick: a GRPO run whose groups all had one reward logged 2.8e-05 amid
    0.37-0.9, and its ordinary values after were "far above the run's own early values"."""
    if value >= least or (value * settings.warmup_factor < least and least < math.inf):
        return least
    return value


def is_clipped(value: float, max_grad_norm: float) -> bool:
    """Whether a logged (pre-clipping) grad-norm means the trainer clipped it."""
    return value >= max_grad_norm


def clips_needed(settings: GradNormRunConfig) -> int:
    """Clipped values among the last ``clip_window`` that make clipping the rule."""
    return math.ceil(round(settings.clip_fraction * settings.clip_window, 9))


METRIC = "grad_norm"
#: Values before a run's onset kept as evidence.
CONTEXT = 10
#: A high grad-norm this many times the run's level (its rolling median, or before it has
#: ``min_history`` values the highest seen) is a leap of orders of magnitude: it warns on
#: its own value, without waiting for ``sustain`` (a real fairseq run's went 2.75 ->
#: 100,616 in one logged value, its loss exploding the next; at 1,000 steps a value).
LEAP = 1000.0
#: Values a leap is judged against, at least.
LEAP_HISTORY = 3


class GradNormRunDetector(BaseDetector):
    """Warns when grad-norm stays high for a run of steps, or clipping is the rule."""

    rule = "grad_norm_run"
    config_model = GradNormRunConfig
    story = "blow_up"
    divergent = True
    incident_reading = 30  # with the loss rising too: a blow-up, whichever alert is worst

    @classmethod
    def read_incident(
        cls,
        incident: Incident,
        recent: Recent,
        lr: tuple[str, str] | None,
        divergent: frozenset[str],
    ) -> Reading | None:
        if not divergent - {cls.rule}:
            return None
        return (
            "optimisation blow-up (grad-norm and loss rising together)",
            "lower the learning rate, add or lengthen warmup, clip gradients at 1.0,"
            " use bf16 rather than fp16",
            "grad_norm",
        )

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        if alert.details.get("kind") == "clipping":
            return (
                "gradient clipping engaged on most steps",
                "the learning rate is likely too high: lower it or add warmup",
                "grad_norm",
            )
        return (
            "grad-norm running high: the usual smoke before a NaN",
            "lower the learning rate, clip gradients at 1.0, check fp16 loss scaling;"
            " roll back to the last checkpoint before the run if it does not settle",
            "grad_norm",
        )

    watches = frozenset({METRIC, "lr"})

    def __init__(self, config: GradNormRunConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._warmup = Warmup(config.warmup_steps)
        self._median = Rolling(config.window)
        self._clips: deque[bool] = deque(maxlen=config.clip_window)
        self._recent: deque[tuple[int | None, float]] = deque(
            maxlen=max(config.clip_window, config.sustain + CONTEXT)
        )
        #: The current run of high values, as (step, value), and whether one value under
        #: the bar came inside it (a dip: the run goes on past one).
        self._run: list[tuple[int | None, float]] = []
        self._dipped = False
        self._open = False
        self._onset_step: int | None = None
        self._calm = 0
        #: The least grad-norm of the attempt, and the run above the warmup bar.
        self._least = math.inf
        #: The warmup's yardstick: the least, falling by ``warmup_factor`` at most a value.
        self._warmup_least = math.inf
        self._warmup_run: list[tuple[int | None, float]] = []
        self._warmup_warned = False

    def job_started(self, now: float) -> None:
        self._warmup.reset()
        self._median.clear()
        self._clips.clear()
        self._recent.clear()
        self._run.clear()
        self._dipped = False
        self._open = False
        self._onset_step = None
        self._calm = 0
        self._least = math.inf
        self._warmup_least = math.inf
        self._warmup_run.clear()
        self._warmup_warned = False

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        name, value, step, stamp = sample[:4]
        if name == "lr":
            self._warmup.observe(sample)
            return []
        if name != METRIC or not math.isfinite(value):
            return []
        rolling = self._median
        settings = self.settings
        if self._warmup.active(step):
            rolling.add(value)
            alerts = [] if self._warmup_warned else self._in_warmup(sample, source, now)
            self._least = min(self._least, value)
            self._warmup_least = lower_least(self._warmup_least, value, settings)
            return alerts
        self._least = min(self._least, value)
        self._warmup_least = lower_least(self._warmup_least, value, settings)
        median = rolling.median() if len(rolling) >= settings.min_history else None
        level = self._recent_level() if value > settings.threshold else None
        high = is_high(value, median, settings, rolling, self._least, level)
        if high:
            self._run.append((step, value))
        else:
            if self._run and not self._dipped:
                # One value under the bar inside a run is a dip, not its end: a real
                # explosion's grad-norm went 17, 7.1, 22, 23, 3.8, 14 (after 0.27).
                self._dipped = True
            else:
                self._run.clear()
                self._dipped = False
            rolling.add(value)
        self._recent.append((step, value))
        clipping = False
        if settings.max_grad_norm is not None:
            self._clips.append(is_clipped(value, settings.max_grad_norm))
            clipping = self._clipping()
        time = stamp if stamp is not None else now
        if self._open:
            return self._count_calm(high or clipping, sample, source, time)
        if len(self._run) >= settings.sustain:
            return [self._open_run(median, sample, source, time)]
        if len(self._run) == 1 and (base := self._leap_base(median)) and value >= LEAP * base:
            return [self._open_leap(base, median, sample, source, time)]
        if clipping:
            return [self._open_clipping(sample, source, time)]
        return []

    def _in_warmup(self, sample: Sample, source: str, now: float) -> list[Alert]:
        """A grad-norm in warmup: part of a run far above the least seen, or not."""
        name, value, step, stamp = sample[:4]
        settings = self.settings
        least = self._warmup_least
        if not (least > 0 and value > warmup_bar(least, settings)):
            self._warmup_run.clear()
            return []
        self._warmup_run.append((step, value))
        if len(self._warmup_run) < settings.sustain:
            return []
        self._warmup_warned = True
        onset = self._warmup_run[0][0]
        message = (
            f"{name} above {warmup_bar(least, settings):.4g} ({settings.warmup_factor:g}x the"
            f" least it has been, {least:.4g}) for {len(self._warmup_run)} consecutive steps"
            f" since step {onset} during warmup (now {value:.4g}): far above the run's own"
            " early values"
        )
        evidence = [*list(self._recent)[-CONTEXT:], *self._warmup_run]
        details = self._details("warmup", warmup_bar(least, settings), None, onset, evidence)
        details["run_length"] = len(self._warmup_run)
        return [
            self._warn(sample, message, stamp if stamp is not None else now, source, onset, details)
        ]

    def can_absorb(self, block: Block) -> bool:
        """Uneventful: every line in warmup, or no episode, no value high by either bar
        (the relative one bounded by the least value its median could hold) and no full
        clip window at the fraction."""
        columns = block.columns
        column = columns.get(METRIC)
        if column is None:
            return True  # only learning rates
        phase = self._warmup.block_phase(block.step_range(), columns.get("lr"))
        if phase is None:
            return False
        values = finite_values(column)
        settings = self.settings
        if phase:
            # In warmup every value is only learned, unless it is far above the least.
            if self._warmup_warned or not values:
                return True
            if self._warmup_least <= 0:
                return not self._warmup_run  # no warning now (the least only falls)
            bar = partial(warmup_bar, settings=settings)
            return not self._warmup_run and never_above(values, bar, self._warmup_least, 0)
        if self._open:
            return False  # a calm value counts towards the resolve
        if not values:
            return True
        if is_high(max(values), None, settings):
            return False  # above the absolute bar
        rolling = self._median
        # The relative bar applies once the median has min_history values.
        judged_from = max(0, settings.min_history - len(rolling))
        bar = partial(relative_bar, factor=settings.factor)
        if not never_above(values, bar, rolling.least(), judged_from):
            return False
        max_grad_norm = settings.max_grad_norm
        return max_grad_norm is None or not self._would_clip(values, max_grad_norm)

    def _would_clip(self, values: list[float], max_grad_norm: float) -> bool:
        """Whether a full clip window ending at one of ``values`` reaches the fraction."""
        settings = self.settings
        needed = clips_needed(settings)
        hits = list(map(is_clipped, values, repeat(max_grad_norm)))
        old = list(self._clips)
        if sum(old) + sum(hits) < needed:
            return False
        size = settings.clip_window
        # totals[j]: clipped among the first j values of the old window and the block's.
        totals = list(accumulate(old + hits, initial=0))
        first_end = max(len(old) + 1, size)  # the first window that is full and new
        if first_end >= len(totals):
            return False
        most: int = max(map(sub, totals[first_end:], totals[first_end - size :]))
        return most >= needed

    def absorb(self, block: Block) -> None:
        """What ``observe`` does with values under every bar: learn them, keep them."""
        taken = warmup_and_values(self._warmup, block, METRIC)
        if taken is None:
            return
        in_warmup, values, steps = taken
        if not values:
            return
        self._least = min(self._least, *values)
        for value in values:
            self._warmup_least = lower_least(self._warmup_least, value, self.settings)
        self._median.extend(values)
        if in_warmup:
            return
        if len(values) == 1 and self._run and not self._dipped:
            self._dipped = True  # the block's one value is the run's dip, as line by line
        else:
            self._run.clear()
            self._dipped = False
        kept = self._recent.maxlen or len(values)
        self._recent.extend(zip(steps[-kept:], values[-kept:], strict=True))
        max_grad_norm = self.settings.max_grad_norm
        if max_grad_norm is not None:
            last = values[-self.settings.clip_window :]
            self._clips.extend(map(is_clipped, last, repeat(max_grad_norm)))

    def _clipping(self) -> bool:
        if self.settings.max_grad_norm is None or len(self._clips) < self.settings.clip_window:
            return False
        return sum(self._clips) >= clips_needed(self.settings)

    def _recent_level(self) -> float | None:
        """The median of the latest judged grad-norms before the current run (None: none)."""
        before = len(self._recent) - len(self._run) - self._dipped
        values = sorted(value for _, value in islice(self._recent, 0, max(0, before)))
        return sorted_median(values) if values else None

    def _open_run(self, median: float | None, sample: Sample, source: str, time: float) -> Alert:
        settings = self.settings
        onset = self._run[0][0]
        self._open, self._onset_step, self._calm = True, onset, 0
        steps = (
            f"{len(self._run)} of {len(self._run) + 1} logged steps since step {onset}"
            if self._dipped
            else f"{len(self._run)} consecutive steps since step {onset}"
        )
        absolute = absolute_applies(self._recent_level(), self._least, settings)
        if absolute and all(value > settings.threshold for _, value in self._run):
            kind, bar = "absolute", settings.threshold
            message = f"grad_norm above {bar:g} for {steps} (now {sample.value:.4g})"
        else:
            assert median is not None  # a run is relative only once there is a median
            kind, bar = "relative", relative_bar(median, settings.factor) if median else math.inf
            message = (
                f"grad_norm {sample.value:.4g} at step {sample.step} is"
                f" {sample.value / median:.1f}x its rolling median {median:.4g},"
                f" above {settings.factor:g}x for {steps}"
            )
        evidence = list(self._recent)[-(len(self._run) + CONTEXT) :]
        details = self._details(kind, bar, median, onset, evidence)
        return self._warn(sample, message, time, source, onset, details)

    def _leap_base(self, median: float | None) -> float | None:
        """What a leap is judged against: the rolling median, or before it is judged the
        highest value seen (None: fewer than ``LEAP_HISTORY`` values, or a level of 0)."""
        rolling = self._median
        if median is not None:
            return median or None
        if len(rolling) < LEAP_HISTORY:
            return None
        return max(rolling.values) or None

    def _open_leap(
        self, base: float, median: float | None, sample: Sample, source: str, time: float
    ) -> Alert:
        step, value = sample.step, sample.value
        self._open, self._onset_step, self._calm = True, step, 0
        level = "its rolling median" if median is not None else "the highest it has been"
        message = (
            f"grad_norm {value:.4g} at step {step} is {value / base:.3g}x {level} ({base:.4g})"
            " in one logged value: a leap of orders of magnitude"
        )
        evidence = list(self._recent)[-(1 + CONTEXT) :]
        details = self._details("leap", LEAP * base, median, step, evidence)
        return self._warn(sample, message, time, source, step, details)

    def _open_clipping(self, sample: Sample, source: str, time: float) -> Alert:
        settings = self.settings
        window = list(self._recent)[-settings.clip_window :]
        clipped = [step for (step, _), hit in zip(window, self._clips, strict=True) if hit]
        onset = clipped[0]
        self._open, self._onset_step, self._calm = True, onset, 0
        message = (
            f"clipping engaged on {len(clipped)} of the last {settings.clip_window} steps"
            f" (grad_norm >= max_grad_norm {settings.max_grad_norm}):"
            " the learning rate is likely too high"
        )
        median = self._median.median() if len(self._median) >= settings.min_history else None
        assert settings.max_grad_norm is not None
        details = self._details("clipping", settings.max_grad_norm, median, onset, window)
        details.update(clipped=len(clipped), clip_window=settings.clip_window)
        return self._warn(sample, message, time, source, onset, details)

    def _count_calm(self, busy: bool, sample: Sample, source: str, time: float) -> list[Alert]:
        if busy:
            self._calm = 0
            return []
        self._calm += 1
        if self._calm < self.settings.resolve_after:
            return []
        onset = self._onset_step
        self._open, self._onset_step, self._calm = False, None, 0
        message = (
            f"grad_norm under every bar for {self.settings.resolve_after} steps"
            f" (last {sample.value:.4g} at step {sample.step})"
        )
        details = {"kind": "recovered", "onset_step": onset}
        return [
            self.sample_alert(
                sample,
                severity=Severity.INFO,
                message=message,
                time=time,
                source=source,
                onset_step=onset,
                resolves=True,
                details=details,
            )
        ]

    def _warn(
        self,
        sample: Sample,
        message: str,
        time: float,
        source: str,
        onset: int | None,
        details: dict[str, Any],
    ) -> Alert:
        """The rule's alert (``severity``) on ``sample``, its episode from ``onset``."""
        return self.sample_alert(
            sample,
            severity=self.settings.severity,
            message=message,
            time=time,
            source=source,
            onset_step=onset,
            details=details,
        )

    def _details(
        self,
        kind: str,
        bar: float,
        median: float | None,
        onset: int | None,
        evidence: list[tuple[int | None, float]],
    ) -> dict[str, Any]:
        return {
            "kind": kind,
            "threshold": bar,
            "median": median,
            "run_length": len(self._run),
            "onset_step": onset,
            "max_grad_norm": self.settings.max_grad_norm,
            "values": [value for _, value in evidence],
            "steps": [step for step, _ in evidence],
        }
