"""gpu_idle: GPUs attributed to the job idle for a window while its process lives."""

from __future__ import annotations

from sentinel.detectors import BaseDetector, RuleConfig


class GpuIdleConfig(RuleConfig):
    """``[rules.gpu_idle]``."""


class GpuIdleDetector(BaseDetector):
    rule = "gpu_idle"
    config_model = GpuIdleConfig
    watches = frozenset()
