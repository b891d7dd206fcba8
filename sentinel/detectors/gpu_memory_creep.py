"""gpu_memory_creep: logged GPU memory climbing, or near capacity.

Placeholder until the rule lands: registered, configurable, raises nothing.
"""

from __future__ import annotations

from sentinel.detectors import BaseDetector, MetricRuleConfig


class GpuMemoryCreepConfig(MetricRuleConfig):
    """``[rules.gpu_memory_creep]``."""


class GpuMemoryCreepDetector(BaseDetector):
    rule = "gpu_memory_creep"
    config_model = GpuMemoryCreepConfig
