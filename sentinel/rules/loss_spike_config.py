"""loss_spike's settings and decisions: what a spike is, against what, and one metric's state.

The decision is written here once: ``spikes`` (past warmup) and ``grows`` (in warmup)
judge one value, and the block path's proofs (``never_spikes``, ``never_grows``) bound a
column with the same bar functions, so no value they pass could be judged otherwise.
Apart from the rule so that each reads in one sitting; ``loss_spike`` re-exports the config.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from functools import partial
from typing import ClassVar

from pydantic import Field, model_validator

from sentinel.model.records import Severity
from sentinel.rules.base import MetricNames, MetricRuleConfig
from sentinel.rules.noise import above_noise
from sentinel.rules.series import LazyRolling, Rolling, never_above


class LossSpikeConfig(MetricRuleConfig):
    """``[rules.loss_spike]``.

    The defaults follow Lightning's ``SpikeDetection`` callback (a value over 2x the
    mean of the last 10 is a spike; the median here, so one spike does not raise the
    bar) and llm-foundry's ``KillLossSpike`` (act once a spike persists for 4 steps).
    """

    renamed: ClassVar[Mapping[str, str]] = {
        "persist_steps": "sustain",
        "persist_severity": "sustain_severity",
    }

    #: Metrics judged, each against its own baseline; they share one episode.
    metrics: MetricNames = Field(default_factory=lambda: ["loss"], min_length=1)
    #: Non-spike values whose median is the baseline; judging starts once it is full.
    window: int = Field(default=10, ge=3, le=10_000)
    #: A value above ``factor`` x the baseline is a spike.
    factor: float = Field(default=2.0, gt=1.0)
    #: Consecutive logged spikes that escalate the episode to ``sustain_severity``.
    sustain: int = Field(default=4, ge=1)
    #: Severity of that escalation (critical: stop, roll back before the onset).
    sustain_severity: Severity = Severity.CRITICAL
    #: Consecutive values under the bar that end the episode.
    resolve_after: int = Field(default=3, ge=1)
    #: A spike is also more than this many robust standard deviations above the baseline.
    noise_sigmas: float = Field(default=3.0, ge=0)
    #: Non-spike values the noise is taken over (long enough to hold a per-epoch rhythm);
    #: until it is full a spike must be ``extreme_factor`` x ``noise_sigmas`` above it.
    noise_window: int = Field(default=50, ge=3, le=10_000)
    #: The noise is at least this fraction of the baseline (a flat series has a MAD of 0).
    noise_floor: float = Field(default=0.01, ge=0)
    #: Alone, a run escalates only past this multiple of the highest non-spike value seen.
    extreme_factor: float = Field(default=3.0, gt=1.0)
    #: Metrics whose spike (judged the same way) corroborates a run of the judged ones.
    corroborate: MetricNames = Field(default_factory=lambda: ["grad_norm"])
    #: In warmup, a value above this multiple of the least seen in the attempt warns.
    warmup_factor: float = Field(default=10.0, gt=1.0)

    @model_validator(mode="after")
    def _coherent(self) -> LossSpikeConfig:
        if self.sustain >= self.window:
            raise ValueError("sustain must be less than window (a longer run is a level shift)")
        if self.sustain_severity < self.severity:
            raise ValueError("sustain_severity must not be lower than severity")
        return self


def spike_bar(baseline: float, factor: float) -> float:
    """The value above which a sample is a spike against ``baseline``: ``factor`` x it.

    Rises with ``baseline`` (``factor`` > 1): a value at most the bar of the least value
    a median can be is no spike against that median.
    """
    return factor * baseline


def is_spike(value: float, baseline: float, factor: float) -> bool:
    """Whether ``value`` passes the ratio test against the median ``baseline``: above its
    bar, with a baseline above 0 (a ratio to a level <= 0 means nothing). The rule also
    asks the noise test (``above_noise``) of a value that passes this one."""
    return baseline > 0 and value > spike_bar(baseline, factor)


def growth_bar(least: float, settings: LossSpikeConfig) -> float:
    """In warmup, a value above this is growth far past the ``least`` seen (rising with it)."""
    return settings.warmup_factor * least


def spikes(value: float, baseline: float, noise: deque[float], settings: LossSpikeConfig) -> bool:
    """The rule's decision on a value past warmup: a spike against the median ``baseline``
    (``is_spike``) and above the run's own ``noise`` (``above_noise``).

    Until the noise window is full the run has not shown its whole rhythm (the first
    epoch has no earlier one to compare with): a spike must then be far beyond its noise,
    ``extreme_factor`` times as many robust standard deviations.
    """
    sigmas = settings.noise_sigmas
    if len(noise) < settings.noise_window:
        sigmas *= settings.extreme_factor
    return is_spike(value, baseline, settings.factor) and above_noise(
        value, baseline, noise, sigmas, settings.noise_floor
    )


def grows(value: float, least: float, noise: deque[float], settings: LossSpikeConfig) -> bool:
    """The rule's decision on a value in warmup: past the growth bar of the ``least`` seen
    (above 0: a ratio to a level <= 0 means nothing) and above the run's own ``noise``."""
    return (
        least > 0
        and value > growth_bar(least, settings)
        and above_noise(value, least, noise, settings.noise_sigmas, settings.noise_floor)
    )


def never_spikes(values: list[float], least: float, start: int, settings: LossSpikeConfig) -> bool:
    """Block path: no value from ``start`` on can be judged a spike, ``least`` the least of
    the baseline before them (``never_above`` with ``spikes``' own bar)."""
    return never_above(values, partial(spike_bar, factor=settings.factor), least, start)


def never_grows(values: list[float], least: float, settings: LossSpikeConfig) -> bool:
    """Block path: no value can be judged growth, ``least`` the least seen before them."""
    return never_above(values, partial(growth_bar, settings=settings), least, 0)


class SpikeSeries:
    """One metric's baseline and its current run of spikes."""

    __slots__ = (
        "baseline",
        "calm",
        "episode",
        "least",
        "noise",
        "offending",
        "recent",
        "run",
        "spiked_at",
    )

    def __init__(self, window: int, noise_window: int) -> None:
        self.baseline = Rolling(window)
        #: The last non-spike values, whose spread is the run's own noise.
        self.noise = LazyRolling(noise_window)
        #: The least finite value of the attempt (the warmup's yardstick).
        self.least = math.inf
        #: The rule's count of judged values when this metric last spiked.
        self.spiked_at: int | None = None
        #: This metric's spikes in the open episode: the run's behaviour once it recovers.
        self.episode: list[float] = []
        #: Every finite value seen lately, spikes included: the evidence in ``details``.
        self.recent: deque[tuple[int | None, float]] = deque(maxlen=2 * window)
        #: The consecutive spikes up to now, as (step, value).
        self.run: list[tuple[int | None, float]] = []
        #: Consecutive values under the bar since this metric's last spike.
        self.calm = 0
        #: Whether this metric keeps the episode open.
        self.offending = False

    def learn(self, value: float) -> None:
        """A value that is no spike: part of the baseline and the noise."""
        self.baseline.add(value)
        self.noise.add(value)
        self.least = min(self.least, value)
