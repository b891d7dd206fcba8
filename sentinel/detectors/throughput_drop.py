"""throughput_drop: throughput below a fraction of the run's baseline.

Placeholder until the rule lands: registered, configurable, raises nothing.
"""

from __future__ import annotations

from sentinel.detectors import BaseDetector, MetricRuleConfig


class ThroughputDropConfig(MetricRuleConfig):
    """``[rules.throughput_drop]``."""


class ThroughputDropDetector(BaseDetector):
    rule = "throughput_drop"
    config_model = ThroughputDropConfig
