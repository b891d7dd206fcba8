"""grad_norm_run's settings and decisions: which grad-norm is high, clipped, or far above
the run's early values in warmup. ``grad_norm_run`` re-exports the config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field, model_validator

from sentinel.rules.base import MetricRuleConfig
from sentinel.rules.noise import robust_sigma
from sentinel.rules.series import Rolling


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


def is_clipped(value: float, max_grad_norm: float) -> bool:
    """Whether a logged (pre-clipping) grad-norm means the trainer clipped it."""
    return value >= max_grad_norm


def clips_needed(settings: GradNormRunConfig) -> int:
    """Clipped values among the last ``clip_window`` that make clipping the rule."""
    return math.ceil(round(settings.clip_fraction * settings.clip_window, 9))
