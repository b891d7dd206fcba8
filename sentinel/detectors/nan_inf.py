"""nan_inf: a watched metric is NaN or +/-Inf."""

from __future__ import annotations

import math

from pydantic import Field

from sentinel.detectors.base import BaseDetector, MetricNames, RuleConfig
from sentinel.records import Alert, Block, Sample, Severity


class NanInfConfig(RuleConfig):
    """``[rules.nan_inf]``."""

    #: Metrics to watch; empty means every metric the job logs. Watching all of
    #: them matters: the HF Trainer's default ``logging_nan_inf_filter=True``
    #: hides a NaN loss but not the NaN grad-norm beside it.
    metrics: MetricNames = Field(default_factory=list)
    #: Metrics never watched, e.g. a loss-scale that is legitimately inf at times.
    ignore: MetricNames = Field(default_factory=list)
    #: Consecutive finite values of every offending metric that end the episode.
    resolve_after: int = Field(default=10, ge=1)


class NanInfDetector(BaseDetector):
    """Raises a critical alert on the first non-finite value of an episode."""

    rule = "nan_inf"
    config_model = NanInfConfig

    def __init__(self, config: NanInfConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._watched = frozenset(config.metrics)
        self._ignored = frozenset(config.ignore)
        # metric -> finite values seen since it was last non-finite
        self._offending: dict[str, int] = {}

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        name = sample.name
        if name in self._ignored or (self._watched and name not in self._watched):
            return []
        if math.isfinite(sample.value):
            return self._count_finite(sample, source, now)
        first_of_episode = not self._offending
        self._offending[name] = 0
        if not first_of_episode:
            return []
        return [
            Alert(
                rule=self.rule,
                severity=Severity.CRITICAL,
                message=f"{name} is {sample.value} at step {sample.step}",
                time=sample.time if sample.time is not None else now,
                source=source,
                step=sample.step,
                metric=name,
                value=sample.value,
                onset_step=sample.step,
            )
        ]

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """Nothing to say about a line of finite values outside an episode: one pass."""
        if not self._offending:
            isfinite = math.isfinite
            for sample in samples:
                if not isfinite(sample[1]):
                    break
            else:
                return []
        return super().observe_samples(samples, source, now)

    def can_absorb(self, block: Block) -> bool:
        """Outside an episode, a block of finite values says nothing (and changes nothing)."""
        if self._offending:
            return False
        ignored, watched = self._ignored, self._watched
        for name in block.names:
            if name in ignored or (watched and name not in watched):
                continue
            # The sum of finite values is finite unless it overflows: then line by line.
            if not math.isfinite(sum(block.columns[name])):
                return False
        return True

    def absorb(self, block: Block) -> None:
        return None

    def _count_finite(self, sample: Sample, source: str, now: float) -> list[Alert]:
        if sample.name not in self._offending:
            return []
        self._offending[sample.name] += 1
        if min(self._offending.values()) < self.settings.resolve_after:
            return []
        self._offending.clear()
        return [
            Alert(
                rule=self.rule,
                severity=Severity.INFO,
                message=(
                    f"every metric finite again for {self.settings.resolve_after} values"
                    f" (last: {sample.name}={sample.value:g} at step {sample.step})"
                ),
                time=sample.time if sample.time is not None else now,
                source=source,
                step=sample.step,
                metric=sample.name,
                value=sample.value,
                resolves=True,
            )
        ]

    def job_started(self, now: float) -> None:
        self._offending.clear()
