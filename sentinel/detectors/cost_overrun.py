"""cost_overrun: spend or projected spend at completion passes the budget."""

from __future__ import annotations

from sentinel.detectors import BaseDetector, RuleConfig


class CostOverrunConfig(RuleConfig):
    """``[rules.cost_overrun]``."""


class CostOverrunDetector(BaseDetector):
    rule = "cost_overrun"
    config_model = CostOverrunConfig
    watches = frozenset()
