"""nan_inf's words: which metric a name is (a loss, the grad-norm, the loss scale, another),
its settings (``[rules.nan_inf]``) and what a climb before a non-finite value is."""

from __future__ import annotations

import re
import statistics
from collections import deque
from typing import Literal

from pydantic import Field

from sentinel.rules.base import MetricNames, RuleConfig

#: Words that make a name with "loss" in it a tracker or a setting, not a loss.
_NOT_A_LOSS = frozenset({"best", "min", "max", "lowest", "highest", "scale", "scaler", "weight"})
_WORDS = re.compile(r"[a-z0-9]+")
#: Finite values of the train loss and the grad-norm kept to tell a climb.
KEPT = 20
#: A last grad-norm this many times the median before it is a climb. Far above the noise:
#: a real fp16 run's loss at a skipped step was 2.3x its median, and acting kills the job.
GRAD_CLIMB = 10.0
#: A last loss this many times the median before it (and above every value) is a climb.
LOSS_CLIMB = 10.0
#: A last grad-norm this many times the run's first values is a runaway, however long ago
#: it began (the window's median has long since climbed with it).
GRAD_RUNAWAY = 100.0
#: Finite grad-norms at the start whose least is the run's first level (a run can blow up
#: at its second step).
EARLY = 3

Kind = Literal["loss", "grad_norm", "loss_scale", "other"]

#: A job's own count of the iterations its loss scaler skipped (Megatron's, per interval).
SKIP_COUNTERS = frozenset({"skipped_iterations", "number_of_skipped_iterations"})


def kind_of(name: str, stop_metrics: frozenset[str]) -> Kind:
    """What a non-finite value of metric ``name`` means (see the module docstring)."""
    if name in stop_metrics:
        return "loss"
    if name == "grad_norm":
        return "grad_norm"
    if name == "loss_scale":
        return "loss_scale"
    words = _WORDS.findall(name)
    if any(word.endswith("loss") for word in words) and _NOT_A_LOSS.isdisjoint(words):
        return "loss"
    return "other"


class NanInfConfig(RuleConfig):
    """``[rules.nan_inf]``."""

    #: Metrics to watch; empty means every metric the job logs. Watching all of
    #: them matters: the HF Trainer's default ``logging_nan_inf_filter=True``
    #: hides a NaN loss but not the NaN grad-norm beside it.
    metrics: MetricNames = Field(default_factory=list)
    #: Metrics never watched, e.g. a loss-scale that is legitimately inf at times.
    ignore: MetricNames = Field(default_factory=list)
    #: Metrics whose non-finite value stops the job, besides every loss (only a warning
    #: by default: eval scores, perplexities, best-so-far trackers, settings).
    stop_metrics: MetricNames = Field(default_factory=list)
    #: ``none``: the run trains without loss scaling (bf16, fp32), so a non-finite
    #: grad-norm is never a skipped step; ``auto``: it may be one.
    loss_scaling: Literal["auto", "none"] = "auto"
    #: Consecutive logged non-finite grad-norms (with a finite loss) that are a failure.
    persist: int = Field(default=3, ge=1)
    #: The same before the first finite grad-norm: the scaler calibrating at the start
    #: halves its scale (65536) on each overflow.
    calibration: int = Field(default=20, ge=1)
    #: A logged loss scale at or below this is at its minimum (fairseq runs healthily at
    #: 0.5 and calibrates down to 0.004; its floor is 1e-4), as ``[rules.loss_scale]``.
    min_loss_scale: float = Field(default=1e-3, ge=0)
    #: Skipped steps among the last ``skip_window`` logged grad-norms that warn.
    skip_cluster: int = Field(default=5, ge=1)
    skip_window: int = Field(default=50, ge=1)
    #: Consecutive finite values of every offending metric that end the episode.
    resolve_after: int = Field(default=10, ge=1)


def climbed(values: deque[float], factor: float, *, last: int, above_all: bool = False) -> bool:
    """Whether the ``last`` newest values top ``factor`` times the median of those before
    (and, ``above_all``, every one of them)."""
    if len(values) < last + 4:
        return False
    kept = list(values)
    earlier, newest = kept[:-last], max(kept[-last:])
    baseline = statistics.median(earlier)
    if above_all and newest <= max(earlier):
        return False
    return baseline > 0 and newest > factor * baseline
