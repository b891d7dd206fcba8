"""DeepSpeed's step line and the fp16 loss-scale messages, read as samples.

``[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[...]`` (``lr`` and ``skipped_steps`` at
step 10, and the pairs a script appends to it, ``loss=2.31``), its throughput timer's
``epoch=0/micro_step=100/global_step=100, ..., CurrSamplesPerSec=12.5`` (``samples_per_sec``
at step 100) and its fp16 loss-scale messages: ``OVERFLOW! ... Attempted loss scale: 65536,
reducing to 32768`` is a ``loss_scale`` of 32768, ``... but hysteresis is 2`` keeps the
attempted scale, ``Attempted loss scale: 1, reducing to 1`` (the scaler at its floor, the
step skipped all the same) is also ``loss_scale_at_floor`` 1, an overflow that lowered the
scale is also ``loss_scale_overflow`` (the new scale: a first one already far down is a
collapse, where a level alone may be a run that sets its scale there), ``Current loss scale already
at minimum`` is ``loss_scale_at_minimum`` 1 (the same words from apex and Megatron's
optimizers), fairseq's ``overflow detected, setting loss scale to: 0.5`` a ``loss_scale`` of
0.5, and apex amp's ``Gradient overflow. Skipping step, loss scaler 0 reducing loss scale to
32768.0`` one of 32768. Stateless, one line each (``ParseFn``).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import find_pairs
from sentinel.parsing.values import as_float

_DEEPSPEED_STEP = re.compile(
    r"(?:\[Rank \d+\] )?step=(\d+), skipped=(\d+), lr=\[([-+0-9.e]+)", re.IGNORECASE
)
_OLD_TIMER = re.compile(r"\]\s+\d+/(\d+), SamplesPerSec=([-+0-9.e]+|inf|nan)\b", re.I)
_TIMER = re.compile(r"/global_step=(\d+),.*?\bCurrSamplesPerSec=([-+0-9.e]+|inf|nan)", re.I)
_OVERFLOW = re.compile(
    r"Attempted loss scale: ([-+0-9.e]+),? (?:reducing to ([-+0-9.e]+)|but hysteresis)"
    r"|(?:setting|reducing) loss scale to:? ()([-+0-9.e]+)",
    re.I,
)


def parse_deepspeed(text: str) -> list[Sample] | None:
    """Samples of DeepSpeed's ``[Rank 0] step=`` line and its loss-scale messages."""
    if "loss scale" in text:
        overflow = _OVERFLOW.search(text)
        if overflow is not None:
            scale = as_float(overflow.group(2) or overflow.group(1) or overflow.group(4))
            if scale is None:
                return []
            tried = as_float(overflow.group(1)) if overflow.group(2) else None
            if tried is not None and scale >= tried:  # at the floor: the step skipped anyway
                return [Sample("loss_scale", scale), Sample("loss_scale_at_floor", scale)]
            if overflow.group(1) is not None and overflow.group(2) is None:
                return [Sample("loss_scale", scale)]  # hysteresis: the scale kept
            return [Sample("loss_scale", scale), Sample("loss_scale_overflow", scale)]
        if "already at minimum" in text:
            return [Sample("loss_scale_at_minimum", 1.0)]
        return None
    if "SamplesPerSec=" in text and "micro_step=" not in text:
        # DeepSpeed 0.3's timer: ``[timer.py:166:stop] 0/130, SamplesPerSec=29.52`` (the
        # epoch, then the step).
        old = _OLD_TIMER.search(text)
        if old is not None:
            rate = as_float(old.group(2))
            return [] if rate is None else [Sample("samples_per_sec", rate, int(old.group(1)))]
    if "step=" not in text:
        return None
    if "micro_step=" in text:
        return _timer_line(text)
    found = _DEEPSPEED_STEP.search(text)
    if found is None:
        return None
    step = int(found.group(1))
    samples = [Sample("skipped_steps", float(found.group(2)), step)]
    lr = as_float(found.group(3))
    if lr is not None:
        samples.append(Sample("lr", lr, step))
    # A script that appends its own metrics to the line (``..., mom=[...], loss=2.31``).
    rest = text[found.end() :]
    rest = rest[rest.find("]") + 1 :]
    named = {"lr", "skipped_steps", "mom"}
    for name, value in find_pairs(rest)[0]:
        if name not in named:
            samples.append(Sample(name, value, step))
    return samples


def _timer_line(text: str) -> list[Sample] | None:
    """DeepSpeed's throughput timer: ``epoch=0/micro_step=100/global_step=100,
    RunningAvgSamplesPerSec=12.3, CurrSamplesPerSec=12.5, ...``: the samples a second of the
    step just done, at its global step."""
    found = _TIMER.search(text)
    if found is None:
        return None
    rate = as_float(found.group(2))
    return [] if rate is None else [Sample("samples_per_sec", rate, int(found.group(1)))]
