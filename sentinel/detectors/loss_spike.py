"""loss_spike: loss far above its recent level.

Placeholder until the rule lands: registered, configurable, raises nothing.
"""

from __future__ import annotations

from sentinel.detectors import BaseDetector, MetricRuleConfig


class LossSpikeConfig(MetricRuleConfig):
    """``[rules.loss_spike]``."""


class LossSpikeDetector(BaseDetector):
    rule = "loss_spike"
    config_model = LossSpikeConfig
