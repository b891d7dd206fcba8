"""Rules (detectors): samples, output lines, clock ticks and job events in; alerts out.

A detector is pure: it does no I/O and reads no clock, it is handed ``now``.
That is what lets ``replay`` and live mode run the very same code.

Adding a rule is one new module here plus one line in ``registry.DETECTORS``:
the module defines a config model (a ``RuleConfig`` subclass, which becomes
the ``[rules.<rule>]`` table of the config file) and a ``BaseDetector``
subclass, both from ``base``. The package re-exports both modules' names for
callers; a rule module imports ``base``, never the package.

Pure: it imports only the model (and no library that does I/O, nor the store).
"""

from __future__ import annotations

from sentinel.rules.base import (
    REMOVED_IN,
    BaseDetector,
    Detector,
    MetricNames,
    MetricRuleConfig,
    Reading,
    Recent,
    RuleConfig,
)
from sentinel.rules.registry import DETECTORS, STORIES

__all__ = [
    "DETECTORS",
    "REMOVED_IN",
    "STORIES",
    "BaseDetector",
    "Detector",
    "MetricNames",
    "MetricRuleConfig",
    "Reading",
    "Recent",
    "RuleConfig",
]
