"""What ``stall`` knows of the machine while a job makes no progress, and its timeouts.

Plain data for ``sentinel.detectors.stall``: the evidence the latest GPU and process
readings give (hang, busy or nothing), and the timeouts in force.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["hang", "busy", "none"]


@dataclass
class Evidence:
    """What the latest fresh readings show while the job makes no progress."""

    #: The job's GPUs: source, utilisation (percent, None if not read), power, power limit.
    gpus: list[tuple[str, float | None, float, float]] = field(default_factory=list)
    cpu_percent: float | None = None
    d_state: int | None = None
    #: Seconds since the job last printed, when it printed during this silence.
    output_age_s: float | None = None
    low_power_fraction: float = 0.3
    idle_cpu_percent: float = 5.0

    @property
    def gpus_low(self) -> bool:
        return bool(self.gpus) and all(
            power < self.low_power_fraction * limit for _, _, power, limit in self.gpus
        )

    @property
    def cpu_idle(self) -> bool:
        return self.cpu_percent is not None and self.cpu_percent < self.idle_cpu_percent

    @property
    def verdict(self) -> Verdict:
        """Hang on any hang evidence, else busy on any sign of work, else none."""
        if self.d_state or self.gpus_low or self.cpu_idle:
            return "hang"
        if self.gpus or self.cpu_percent is not None or self.output_age_s is not None:
            return "busy"
        return "none"

    def describe(self) -> str:
        """The evidence in words: "gpu:0 util 100% at 85 W of 700 W, process tree CPU 2%"."""
        parts = []
        for source, util, power, limit in self.gpus:
            at = f"util {util:.0f}% at" if util is not None else "at"
            parts.append(f"{source} {at} {power:.0f} W of {limit:.0f} W")
        if self.cpu_percent is not None:
            parts.append(f"process tree CPU {self.cpu_percent:.0f}%")
        if self.output_age_s is not None:
            parts.append(f"last output {self.output_age_s:.0f} s ago")
        if self.d_state:
            parts.append(
                f"{self.d_state} process(es) in uninterruptible sleep (D state): SIGTERM will"
                " not stop them until their I/O returns; the node may need draining"
            )
        return ", ".join(parts) if parts else "no GPU or process readings"

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [
                {"source": source, "util_percent": util, "power_w": power, "power_limit_w": limit}
                for source, util, power, limit in self.gpus
            ],
            "cpu_percent": self.cpu_percent,
            "d_state": self.d_state,
            "output_age_s": self.output_age_s,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Timeouts:
    """The timeouts in force; ``learned`` when they come from the run's own step gaps."""

    soft_s: float
    hard_s: float
    busy_s: float
    learned: bool


__all__ = ["Evidence", "Timeouts", "Verdict"]
