"""The registry: each rule's id (its ``[rules.<id>]`` table) and its detector class.

Adding a rule is one new module in this package and one line here.
"""

from __future__ import annotations

from sentinel.detectors.base import BaseDetector
from sentinel.detectors.cost_overrun import CostOverrunDetector
from sentinel.detectors.divergence import DivergenceDetector
from sentinel.detectors.eval_loss_rise import EvalLossRiseDetector
from sentinel.detectors.gpu_health import GpuHealthDetector
from sentinel.detectors.gpu_idle import GpuIdleDetector
from sentinel.detectors.gpu_memory_creep import GpuMemoryCreepDetector
from sentinel.detectors.grad_norm_run import GradNormRunDetector
from sentinel.detectors.job_crash import JobCrashDetector
from sentinel.detectors.loss_plateau import LossPlateauDetector
from sentinel.detectors.loss_scale import LossScaleDetector
from sentinel.detectors.loss_spike import LossSpikeDetector
from sentinel.detectors.nan_inf import NanInfDetector
from sentinel.detectors.stall import StallDetector
from sentinel.detectors.throughput_drop import ThroughputDropDetector

DETECTORS: dict[str, type[BaseDetector]] = {
    "nan_inf": NanInfDetector,
    "loss_scale": LossScaleDetector,
    "grad_norm_run": GradNormRunDetector,
    "loss_spike": LossSpikeDetector,
    "divergence": DivergenceDetector,
    "throughput_drop": ThroughputDropDetector,
    "eval_loss_rise": EvalLossRiseDetector,
    "loss_plateau": LossPlateauDetector,
    "gpu_memory_creep": GpuMemoryCreepDetector,
    "gpu_health": GpuHealthDetector,
    "gpu_idle": GpuIdleDetector,
    "cost_overrun": CostOverrunDetector,
    "stall": StallDetector,
    "job_crash": JobCrashDetector,
}
