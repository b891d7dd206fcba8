"""loss_plateau: loss flat and high for a long window.

Placeholder until the rule lands: registered, configurable, raises nothing.
"""

from __future__ import annotations

from sentinel.detectors import BaseDetector, MetricRuleConfig


class LossPlateauConfig(MetricRuleConfig):
    """``[rules.loss_plateau]``."""


class LossPlateauDetector(BaseDetector):
    rule = "loss_plateau"
    config_model = LossPlateauConfig
