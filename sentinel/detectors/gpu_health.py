"""gpu_health: XID, ECC, sustained thermal or power throttling, temperature."""

from __future__ import annotations

from sentinel.detectors import BaseDetector, RuleConfig


class GpuHealthConfig(RuleConfig):
    """``[rules.gpu_health]``."""


class GpuHealthDetector(BaseDetector):
    rule = "gpu_health"
    config_model = GpuHealthConfig
    watches = frozenset()
