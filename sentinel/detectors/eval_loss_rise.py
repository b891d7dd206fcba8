"""eval_loss_rise: eval loss rising while train loss falls (overfitting).

Placeholder until the rule lands: registered, configurable, raises nothing.
"""

from __future__ import annotations

from sentinel.detectors import BaseDetector, MetricRuleConfig


class EvalLossRiseConfig(MetricRuleConfig):
    """``[rules.eval_loss_rise]``."""


class EvalLossRiseDetector(BaseDetector):
    rule = "eval_loss_rise"
    config_model = EvalLossRiseConfig
