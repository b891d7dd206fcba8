"""stall: no new step and no new output for too long."""

from __future__ import annotations

from pydantic import Field, model_validator

from sentinel.detectors import BaseDetector, RuleConfig
from sentinel.records import Alert, Line, Sample, Severity


class StallConfig(RuleConfig):
    """``[rules.stall]``.

    The defaults follow torch.distributed: its NCCL watchdog gives up on a hung
    collective after 10 minutes, so 10 minutes of silence is worth a warning;
    30 minutes outlasts the slowest checkpoint save or evaluation of a typical
    fine-tune, so silence that long is a hang and is acted on.
    """

    soft_timeout_s: float = Field(default=600.0, gt=0)
    hard_timeout_s: float = Field(default=1800.0, gt=0)

    @model_validator(mode="after")
    def _hard_after_soft(self) -> StallConfig:
        if self.hard_timeout_s <= self.soft_timeout_s:
            raise ValueError("hard_timeout_s must be greater than soft_timeout_s")
        return self


class StallDetector(BaseDetector):
    """Warns after the soft timeout of silence, goes critical after the hard one."""

    rule = "stall"
    config_model = StallConfig

    def __init__(self, config: StallConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._last_progress: float | None = None
        self._last_step: int | None = None
        self._level: Severity | None = None

    def job_started(self, now: float) -> None:
        self._last_progress = now
        self._last_step = None
        self._level = None

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        new_step = sample.step is not None and (
            self._last_step is None or sample.step > self._last_step
        )
        if new_step:
            self._last_step = sample.step
        if not new_step and sample.time is None:
            return []
        # A timestamped sample is new output even without a step (replay's only evidence).
        return self._progress(sample.time if sample.time is not None else now, source)

    def output(self, line: Line) -> list[Alert]:
        return self._progress(line.time, line.source)

    def _progress(self, now: float, source: str) -> list[Alert]:
        if self._last_progress is None:
            return []  # not started: no clock to measure silence against
        self._last_progress = max(self._last_progress, now)
        if self._level is None:
            return []
        self._level = None
        return [
            Alert(
                rule=self.rule,
                severity=Severity.INFO,
                message=f"progress resumed at step {self._last_step}",
                time=now,
                source=source,
                step=self._last_step,
                resolves=True,
            )
        ]

    def tick(self, now: float) -> list[Alert]:
        if self._last_progress is None:
            # Nothing seen yet (replay before its first timestamp): no baseline to measure from.
            return []
        silent_s = now - self._last_progress
        if silent_s >= self.settings.hard_timeout_s:
            level = Severity.CRITICAL
        elif silent_s >= self.settings.soft_timeout_s:
            level = Severity.WARNING
        else:
            return []
        if self._level is not None and level <= self._level:
            return []
        self._level = level
        after = "no step" if self._last_step is None else f"no step after {self._last_step}"
        next_step = None if self._last_step is None else self._last_step + 1
        return [
            Alert(
                rule=self.rule,
                severity=level,
                message=f"{after} and no output for {silent_s:.0f} s",
                time=now,
                step=self._last_step,
                metric="silence_s",
                value=round(silent_s, 3),
                onset_step=next_step,
            )
        ]
