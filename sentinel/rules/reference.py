"""reference: the run has left the band a healthy run of the same recipe followed.

Given ``--reference`` (``[reference] path``: a finished run's ``trainer_state.json``,
metrics file, log or run folder), each logged value of a watched metric is compared with
the reference at the same step, from the first value on, whatever the cadence of either
run: the reference's values within ``band_values`` logged values either side of the step
give its level (their median) and its own noise (their robust standard deviation, at
least ``noise_floor`` of the level). The band's top is the higher of ``rise`` x the
level and the level plus ``noise_sigmas`` noises (a level at or below 0 is judged by the
noise alone). A step more than one of the reference's logging intervals outside its
steps is not judged: the reference says nothing there.

When the median of the last ``confirm`` values is above the band's top, the run has left
it: a warning (``severity``), or ``act_severity`` (critical) when ``[reference] act`` is
set; people re-run a recipe on purpose with changes, so by default it only warns and
leaves acting to the rules that judge the run by itself. The onset is the first value of
the stretch above the band. The episode resolves (info) when the median of the last
``confirm`` values is back half way from the band's top to the reference's level.

``details``: ``kind`` (``"left_band"`` or ``"back"``), ``metric``, ``reference`` (where it
was read from), ``reference_level``, ``band_top``, ``ratio`` (the median over the
reference's level), ``since_step``, ``values``/``steps`` (the stretch above the band).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from typing import Any

from pydantic import Field

from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricNames, MetricRuleConfig
from sentinel.rules.noise import robust_sigma
from sentinel.rules.series import sorted_median


class ReferenceConfig(MetricRuleConfig):
    """``[rules.reference]``: how far from a healthy run of the same recipe is too far."""

    #: Metrics compared with the reference's, each with its own.
    metrics: MetricNames = Field(default_factory=lambda: ["loss"], min_length=1)
    #: The reference's logged values either side of a step that give its level and noise.
    band_values: int = Field(default=5, ge=1, le=1000)
    #: The band's top is at least this multiple of the reference's level...
    rise: float = Field(default=1.3, gt=1.0)
    #: ...and at least its level plus this many of its robust standard deviations.
    noise_sigmas: float = Field(default=4.0, ge=0)
    #: The reference's noise is at least this fraction of its level.
    noise_floor: float = Field(default=0.02, ge=0)
    #: The last values whose median above the band's top means the run has left it.
    confirm: int = Field(default=2, ge=1, le=100)
    #: Severity when ``[reference] act`` is set.
    act_severity: Severity = Severity.CRITICAL


class ReferenceDetector(BaseDetector):
    """Warns when the run leaves the band of a healthy run of the same recipe."""

    rule = "reference"
    config_model = ReferenceConfig
    divergent = True

    def __init__(self, config: ReferenceConfig) -> None:
        super().__init__(config)
        self.settings = config
        self.watches = frozenset(config.metrics)
        #: Per metric: the last ``confirm`` judged values, (step, value, band top, level).
        self._recent: dict[str, deque[tuple[int, float, float, float]]] = {}
        #: Per metric: the stretch above the band, (step, value), while there is one.
        self._above: dict[str, list[tuple[int, float]]] = {}
        self._open: set[str] = set()
        #: Per metric: (the reference's points, their steps), listed once.
        self._curve_steps: dict[str, tuple[tuple[tuple[int, float], ...], list[int]]] = {}

    def _steps(self, name: str, points: tuple[tuple[int, float], ...]) -> list[int]:
        """The reference's steps of ``name``, listed once per curve."""
        known = self._curve_steps.get(name)
        if known is None or known[0] is not points:
            known = self._curve_steps[name] = (points, [at for at, _ in points])
        return known[1]

    def job_started(self, now: float) -> None:
        """A new attempt: judged afresh from its first value."""
        self._recent.clear()
        self._above.clear()
        self._open.clear()

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        curve = self.facts.reference
        step = sample.step
        if curve is None or step is None or not math.isfinite(sample.value):
            return []
        points = curve.series.get(sample.name)
        if not points:
            return []
        band = _band(points, self._steps(sample.name, points), step, self.settings)
        if band is None:
            return []
        level, top = band
        name = sample.name
        recent = self._recent.setdefault(name, deque(maxlen=self.settings.confirm))
        recent.append((step, sample.value, top, level))
        above = self._above.setdefault(name, [])
        time = sample.time if sample.time is not None else now
        if sample.value <= top:
            above.clear()
            if name not in self._open:
                return []
            # Back only well inside (half way from the level to the top): the band's top
            # moves with the reference's own noise, and a run on its edge would flap.
            latest = sorted_median(sorted(value for _, value, _, _ in recent))
            if latest > level + (top - level) / 2:
                return []
            self._open.discard(name)
            return [self._back(sample, level, top, source, time, curve.source)]
        above.append((step, sample.value))
        if name in self._open or len(recent) < self.settings.confirm:
            return []
        latest = sorted_median(sorted(value for _, value, _, _ in recent))
        if latest <= max(top for _, _, top, _ in recent):
            return []
        self._open.add(name)
        return [self._left(sample, latest, level, top, above, source, time, curve.source)]

    def _left(
        self,
        sample: Sample,
        latest: float,
        level: float,
        top: float,
        above: list[tuple[int, float]],
        source: str,
        time: float,
        reference: str,
    ) -> Alert:
        acts = self.facts.reference_acts
        severity = self.settings.act_severity if acts else self.settings.severity
        since = above[0][0]
        ratio = latest / level if level > 0 else None
        how_far = f"{ratio:.2f}x" if ratio is not None else f"{latest - level:+.4g} from"
        message = (
            f"{sample.name} {latest:.4g} (median of the last {self.settings.confirm} values)"
            f" at step {sample.step} is {how_far} the reference's {level:.4g} at that step"
            f" (its band reaches {top:.4g}), outside it since step {since}"
            + ("; acting ([reference] act)" if acts else "")
        )
        details: dict[str, Any] = {
            "kind": "left_band",
            "metric": sample.name,
            "reference": reference,
            "reference_level": level,
            "band_top": top,
            "ratio": None if ratio is None else round(ratio, 3),
            "since_step": since,
            "values": [value for _, value in above],
            "steps": [step for step, _ in above],
        }
        return self.sample_alert(
            sample,
            severity=severity,
            message=message,
            time=time,
            source=source,
            onset_step=since,
            details=details,
        )

    def _back(
        self, sample: Sample, level: float, top: float, source: str, time: float, reference: str
    ) -> Alert:
        message = (
            f"{sample.name} {sample.value:.4g} at step {sample.step} is back within the"
            f" reference's band (level {level:.4g}, top {top:.4g})"
        )
        return self.sample_alert(
            sample,
            severity=Severity.INFO,
            message=message,
            time=time,
            source=source,
            resolves=True,
            details={"kind": "back", "metric": sample.name, "reference": reference},
        )

    def can_absorb(self, block: Block) -> bool:
        """Uneventful only without a reference for the block's metrics: each value is
        judged against the reference at its own step, line by line."""
        curve = self.facts.reference
        return curve is None or not any(name in curve.series for name in self.settings.metrics)

    def absorb(self, block: Block) -> None:
        """Nothing to keep: there is no reference for these metrics."""
        return None


def _band(
    points: tuple[tuple[int, float], ...], steps: list[int], step: int, settings: ReferenceConfig
) -> tuple[float, float] | None:
    """(the reference's level at ``step``, the band's top), or None outside its steps."""
    interval = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else 0
    if step < steps[0] - interval or step > steps[-1] + interval:
        return None
    index = bisect_left(steps, step)
    low = max(0, index - settings.band_values)
    values = sorted(value for _, value in points[low : index + settings.band_values])
    level = sorted_median(values)
    noise = robust_sigma(values, level, settings.noise_floor)
    top = level + settings.noise_sigmas * noise
    if level > 0:
        top = max(top, settings.rise * level)
    return level, top
