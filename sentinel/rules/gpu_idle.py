"""gpu_idle: GPUs attributed to the job idle for ``sustain_s`` while its process lives."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from sentinel.model.cost import format_money
from sentinel.model.machine import GPU_JOB, GPU_UTIL
from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.base import BaseDetector, Reading, Recent, RuleConfig


class GpuIdleConfig(RuleConfig):
    """``[rules.gpu_idle]``.

    15 minutes outlasts loading a large model's weights, a checkpoint save and an
    evaluation on another device, each of which leaves a GPU idle for minutes on a
    healthy run; a GPU idle longer than that while the job lives is paid for nothing.
    """

    renamed: ClassVar[Mapping[str, str]] = {"window_s": "sustain_s"}

    #: Utilisation below this percent is idle. A training step keeps a GPU far above it;
    #: NVML's figure is a share of time with a kernel running, so 5% is a few stray kernels.
    idle_util_percent: float = Field(default=5.0, gt=0, le=100)
    #: How long a GPU must be idle, on every reading, before it warns.
    sustain_s: float = Field(default=900.0, gt=0)
    severity: Severity = Severity.WARNING


class GpuIdleDetector(BaseDetector):
    """Warns once per episode while any of the job's GPUs has been idle for ``sustain_s``.

    Judged only between ``job_started`` and ``job_exited``, and only on GPUs whose
    ``gpu_job`` reading is 1. A GPU's idleness begins at its first reading under
    ``idle_util_percent`` and ends at a busy reading, at its detachment from the
    job or at the job's exit. An episode opens when the first GPU has been idle for
    ``sustain_s`` (GPUs that pass it later join it) and resolves when none
    of them is idle any more. The waste counted is every idle GPU's time since its
    idleness began, times ``[cost] price_per_gpu_hour`` when it is set.
    """

    rule = "gpu_idle"
    config_model = GpuIdleConfig
    evidence_before_stop = True

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        return (
            "GPUs held by the job sit idle",
            "look for a data loader that starves the GPUs, a rank waiting on another, or a"
            " job that finished its work but not its process",
            alert.metric,
        )

    watches = frozenset({GPU_UTIL, GPU_JOB})

    def __init__(self, config: GpuIdleConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._alive = False
        self._reset()

    def _reset(self) -> None:
        #: Per GPU source: attributed to the job (its last ``gpu_job`` reading).
        self._attached: dict[str, bool] = {}
        #: Per attributed GPU that is idle: when its idleness began.
        self._idle_since: dict[str, float] = {}
        #: GPUs idle past ``sustain_s`` in the open episode (empty: no episode).
        self._flagged: set[str] = set()
        #: Idle GPU-seconds of flagged GPUs that are busy again, in the open episode.
        self._ended_s = 0.0

    def job_started(self, now: float) -> None:
        self._alive = True
        self._reset()

    def job_exited(self, exit_code: int | None, now: float, *, expected: bool) -> list[Alert]:
        self._alive = False
        alerts = []
        if self._flagged:
            wasted_s = self._ended_s + sum(now - self._idle_since[gpu] for gpu in self._flagged)
            alerts.append(self._resolve("the job exited", wasted_s, None, now))
        self._reset()
        return alerts

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        if not self._alive or not math.isfinite(sample.value):
            return []
        if sample.name == GPU_JOB:
            attached = sample.value >= 0.5
            self._attached[source] = attached
            if attached:
                return []
            return self._busy(source, "left the job", sample, now)
        if not self._attached.get(source, False) and source not in self.facts.job_gpus:
            return []  # the engine's facts know before this reading's own gpu_job comes
        if sample.value >= self.settings.idle_util_percent:
            return self._busy(source, "busy again", sample, now)
        self._idle_since.setdefault(source, now)
        sustain_s = self.settings.sustain_s
        # Every GPU whose idleness began ``sustain_s`` ago, its own reading of now not needed yet.
        past = {gpu for gpu, since in self._idle_since.items() if now - since >= sustain_s}
        if not past:
            return []
        was_open = bool(self._flagged)
        self._flagged |= past
        if was_open:
            return []
        return [self._idle_alert(sample, source=source, now=now)]

    def _busy(self, source: str, why: str, sample: Sample, now: float) -> list[Alert]:
        """GPU ``source`` is no longer idle; the resolve when it was the episode's last."""
        since = self._idle_since.pop(source, None)
        if since is None or source not in self._flagged:
            return []
        self._flagged.discard(source)
        self._ended_s += now - since
        if self._flagged:
            return []
        alert = self._resolve(f"{source} {why}", self._ended_s, sample, now, source)
        self._ended_s = 0.0
        return [alert]

    def _wasted(self, wasted_s: float) -> tuple[dict[str, float | None], str]:
        """The waste as details and as words: money when a price is known, else GPU-hours."""
        gpu_hours = wasted_s / 3600
        price = self.facts.price_per_gpu_hour
        money = None if price is None else gpu_hours * price
        words = (
            f"{gpu_hours:.2f} GPU-hours wasted"
            if money is None
            else f"{format_money(money)} wasted"
        )
        return {"gpu_hours": gpu_hours, "money": money}, words

    def _idle_alert(self, sample: Sample, *, source: str, now: float) -> Alert:
        """The episode's warning: which GPUs idle, since when, and what it cost so far."""
        flagged = sorted(self._flagged)
        onset = min(self._idle_since[gpu] for gpu in flagged)
        wasted_s = sum(now - self._idle_since[gpu] for gpu in flagged)
        wasted, words = self._wasted(wasted_s)
        price = self.facts.price_per_gpu_hour
        held = self.facts.gpu_count or sum(self._attached.values())
        message = (
            f"{len(flagged)} of {held} GPUs idle for {(now - onset) / 60:.0f} min"
            f" while the job runs ({', '.join(flagged)}): {words} so far"
        )
        if price is not None:
            message += f" (at {format_money(price)}/GPU-hour)"
        return self.sample_alert(
            sample,
            severity=self.settings.severity,
            message=message,
            time=now,
            source=source,
            details={
                "onset_time": onset,
                "idle_gpus": flagged,
                "idle_s": now - onset,
                "wasted": wasted,
            },
        )

    def _resolve(
        self,
        why: str,
        wasted_s: float,
        sample: Sample | None,
        now: float,
        source: str = "",
    ) -> Alert:
        wasted, words = self._wasted(wasted_s)
        return Alert(
            rule=self.rule,
            severity=Severity.INFO,
            message=f"{why}: no GPU of the job idle any more; {words} in all",
            time=now,
            source=source,
            step=None if sample is None else sample.step,
            metric=GPU_UTIL if sample is None else sample.name,
            value=None if sample is None else sample.value,
            resolves=True,
            details={"wasted": wasted},
        )
