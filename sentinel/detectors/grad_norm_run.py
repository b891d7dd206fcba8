"""grad_norm_run: grad-norm above a bar for several logged steps in a row.

Placeholder until the rule lands: registered, configurable, raises nothing.
"""

from __future__ import annotations

from sentinel.detectors import BaseDetector, MetricRuleConfig


class GradNormRunConfig(MetricRuleConfig):
    """``[rules.grad_norm_run]``."""


class GradNormRunDetector(BaseDetector):
    rule = "grad_norm_run"
    config_model = GradNormRunConfig
