"""Steps the fp16 loss scaler skipped this attempt, as the rules counted them.

``nan_inf`` counts a lone non-finite grad-norm beside a finite loss (the HF Trainer's and
torch AMP's sign of a skipped step); ``loss_scale`` counts the overflow lines of DeepSpeed,
fairseq and apex and Megatron's skipped-iteration counter. A job shows one or the other, or
both for the same steps (HF with DeepSpeed), so the count is the larger of the two, not
their sum. Not a rule: it reads the two rules' counters for ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Iterable

from sentinel.rules.base import BaseDetector
from sentinel.rules.loss_scale import LossScaleDetector
from sentinel.rules.nan_inf import NanInfDetector


def skipped_steps(rules: Iterable[BaseDetector]) -> int:
    """The steps the loss scaler skipped this attempt: the most any enabled rule counted."""
    counted = [0]
    for rule in rules:
        if isinstance(rule, NanInfDetector):
            counted.append(rule.skipped_steps)
        elif isinstance(rule, LossScaleDetector):
            counted.append(rule.overflows)
    return max(counted)
