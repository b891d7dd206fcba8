"""The registry: each rule's id (its ``[rules.<id>]`` table) and its detector class.

Adding a rule is one new module in this package and one line here.
"""

from __future__ import annotations

from sentinel.rules.base import BaseDetector
from sentinel.rules.cost_overrun import CostOverrunDetector
from sentinel.rules.divergence import DivergenceDetector
from sentinel.rules.eval_loss_rise import EvalLossRiseDetector
from sentinel.rules.gpu_health import GpuHealthDetector
from sentinel.rules.gpu_idle import GpuIdleDetector
from sentinel.rules.gpu_memory_creep import GpuMemoryCreepDetector
from sentinel.rules.grad_norm_run import GradNormRunDetector
from sentinel.rules.job_crash import JobCrashDetector
from sentinel.rules.loss_frozen import LossFrozenDetector
from sentinel.rules.loss_plateau import LossPlateauDetector
from sentinel.rules.loss_scale import LossScaleDetector
from sentinel.rules.loss_spike import LossSpikeDetector
from sentinel.rules.lr_jump import LrJumpDetector
from sentinel.rules.nan_inf import NanInfDetector
from sentinel.rules.recovery import RecoveryDetector
from sentinel.rules.reference import ReferenceDetector
from sentinel.rules.stall import StallDetector
from sentinel.rules.throughput_drop import ThroughputDropDetector

DETECTORS: dict[str, type[BaseDetector]] = {
    "nan_inf": NanInfDetector,
    "loss_scale": LossScaleDetector,
    "grad_norm_run": GradNormRunDetector,
    "loss_spike": LossSpikeDetector,
    "divergence": DivergenceDetector,
    "lr_jump": LrJumpDetector,
    "reference": ReferenceDetector,
    "recovery": RecoveryDetector,
    "throughput_drop": ThroughputDropDetector,
    "eval_loss_rise": EvalLossRiseDetector,
    "loss_plateau": LossPlateauDetector,
    "loss_frozen": LossFrozenDetector,
    "gpu_memory_creep": GpuMemoryCreepDetector,
    "gpu_health": GpuHealthDetector,
    "gpu_idle": GpuIdleDetector,
    "cost_overrun": CostOverrunDetector,
    "stall": StallDetector,
    "job_crash": JobCrashDetector,
}

#: Each rule's story (``BaseDetector.story``), for the incident tracker: the episodes of
#: the rules of one story share an incident.
STORIES: dict[str, str] = {
    rule: detector.story for rule, detector in DETECTORS.items() if detector.story is not None
}
