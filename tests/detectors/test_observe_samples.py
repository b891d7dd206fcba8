"""A rule's own ``observe_samples`` (one call a line) says exactly what ``observe`` per sample says.

The rules that replay calls on every line override ``observe_samples``, ``output_text``
and skip work in ``tick``; each case drives one rule through a run that makes it raise,
once through those fast hooks and once through the plain ones (``observe`` per sample,
``output`` with a ``Line``), and compares every alert, in order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from sentinel.model.records import PROGRESS, Alert, Line, Sample
from sentinel.rules import BaseDetector, RuleConfig
from sentinel.rules.eval_loss_rise import EvalLossRiseConfig, EvalLossRiseDetector
from sentinel.rules.gpu_memory_creep import GpuMemoryCreepConfig, GpuMemoryCreepDetector
from sentinel.rules.grad_norm_run import GradNormRunConfig, GradNormRunDetector
from sentinel.rules.job_crash import JobCrashConfig, JobCrashDetector
from sentinel.rules.loss_plateau import LossPlateauConfig, LossPlateauDetector
from sentinel.rules.loss_spike import LossSpikeConfig, LossSpikeDetector
from sentinel.rules.stall import StallConfig, StallDetector
from sentinel.rules.throughput_drop import ThroughputDropConfig, ThroughputDropDetector

T0 = 1_700_000_000.0
SOURCE = "train.log"
LINES = 3000

#: One line of a run: (time the line was read, its text, its samples as the engine shows them).
RunLine = tuple[float, str, list[Sample]]


def troubled_run(seed: int, *, timestamps: bool = True) -> list[RunLine]:
    """A run through every kind of trouble: LR warmup, spikes, grad-norm runs, NaNs, slow
    stretches, long silences, a plateau, creeping memory, rising eval loss, progress bars."""
    rng = random.Random(seed)
    lines: list[RunLine] = []
    now, step, loss, memory, eval_loss = T0, 0, 4.0, 1000.0, 3.0
    mode, left = "calm", 0
    for index in range(LINES):
        if left <= 0:
            mode = rng.choice(["calm"] * 4 + ["spike", "grad", "nan", "slow", "flat", "creep"])
            left = rng.randint(5, 120)
        left -= 1
        step += rng.choice([1, 1, 1, 2, 0])
        now += rng.choice([0.5, 0.5, 0.0, 3.0 if mode == "slow" else 0.5])
        if rng.random() < 0.002:
            now += rng.choice([90.0, 700.0, 2500.0])  # silences past the stall timeouts
        if mode != "flat":
            loss = max(0.5, loss * 0.999)
        value = (
            loss * (1 + 0.02 * rng.gauss(0, 1)) * (rng.choice([1, 3, 6]) if mode == "spike" else 1)
        )
        grad = (1 + 0.1 * rng.gauss(0, 1)) * (rng.choice([1, 8, 20]) if mode == "grad" else 1)
        lr = min(1e-5 * (index + 1), 5e-4) if index < 60 else 5e-4 * (1 - index / LINES)
        tokens = 15000.0 / (4 if mode == "slow" else 1) * (1 + 0.01 * rng.gauss(0, 1))
        if mode == "creep":
            memory *= 1.03
        metrics = [("loss", value), ("grad_norm", grad), ("lr", lr), ("tokens_per_sec", tokens)]
        if mode == "nan" and rng.random() < 0.3:
            name = rng.choice(["loss", "grad_norm", "lr"])
            metrics = [
                (n, rng.choice([math.nan, math.inf]) if n == name else v) for n, v in metrics
            ]
        rng.shuffle(metrics)
        if rng.random() < 0.3:
            metrics.append(("gpu_memory_mb", memory))
        if step % 40 == 0:
            eval_loss *= 1.04 if mode in ("flat", "creep") else 0.97
            metrics.append(("eval_loss", eval_loss))
        stamp = now if timestamps else None
        samples = [Sample(name, v, step, stamp) for name, v in metrics]
        if rng.random() < 0.1:
            samples.insert(0, Sample(PROGRESS, float(step + 1), step + 1, None))
        lines.append((now, f"line {index}", samples))
        if rng.random() < 0.05:
            lines.append((now, "RuntimeError: CUDA out of memory", []))
    return lines


#: How a line reaches the rule: the fast hooks or the plain ones.
Hooks = Callable[[BaseDetector, RunLine], list[tuple[int, Alert]]]


def fast(detector: BaseDetector, line: RunLine) -> list[tuple[int, Alert]]:
    now, text, samples = line
    found = [(-2, alert) for alert in detector.tick(now)]
    found += [(-1, alert) for alert in detector.output_text(text, SOURCE, now)]
    return found + (detector.observe_samples(samples, SOURCE, now) if samples else [])


def plain(detector: BaseDetector, line: RunLine) -> list[tuple[int, Alert]]:
    now, text, samples = line
    found = [(-2, alert) for alert in detector.tick(now)]
    found += [(-1, alert) for alert in detector.output(Line(SOURCE, text, now))]
    return found + BaseDetector.observe_samples(detector, samples, SOURCE, now)


def drive(detector: BaseDetector, lines: list[RunLine], path: Hooks) -> list[tuple[Any, ...]]:
    detector.job_started(lines[0][0])
    raised: list[tuple[Any, ...]] = []
    for number, line in enumerate(lines):
        for position, alert in path(detector, line):
            raised.append((number, position, alert, alert.details))
    exit_code = 1
    raised += [
        (None, None, a, a.details)
        for a in detector.job_exited(exit_code, lines[-1][0], expected=False)
    ]
    return raised


# Not nan_inf: it judges a line's grad-norm beside the line's own loss (trainer_state.json
# sorts grad_norm before loss), so its unit is the line, not the sample (test_nan_inf.py).
CASES: list[tuple[Callable[[], BaseDetector], bool]] = [
    (lambda: GradNormRunDetector(GradNormRunConfig()), True),
    (lambda: GradNormRunDetector(GradNormRunConfig(max_grad_norm=1.0, clip_window=5)), True),
    (lambda: LossSpikeDetector(LossSpikeConfig(metrics=["loss", "grad_norm"])), True),
    (lambda: ThroughputDropDetector(ThroughputDropConfig()), True),
    (lambda: ThroughputDropDetector(ThroughputDropConfig(metrics=["none"])), True),
    (lambda: EvalLossRiseDetector(EvalLossRiseConfig(rises=2)), True),
    (lambda: LossPlateauDetector(LossPlateauConfig(window=20, edge_values=5)), True),
    (lambda: LossPlateauDetector(LossPlateauConfig(window=20, edge_values=5)), False),
    (lambda: GpuMemoryCreepDetector(GpuMemoryCreepConfig(window=5, capacity=3000)), True),
    (lambda: StallDetector(StallConfig()), True),
    (
        lambda: StallDetector(StallConfig(adaptive=False, soft_timeout_s=60, hard_timeout_s=600)),
        True,
    ),
    (lambda: JobCrashDetector(JobCrashConfig()), True),
]
IDS = [
    "grad_norm_run",
    "grad_norm_run-clipping",
    "loss_spike-two-metrics",
    "throughput_drop-logged",
    "throughput_drop-derived",
    "eval_loss_rise",
    "loss_plateau",
    "loss_plateau-no-timestamps",
    "gpu_memory_creep",
    "stall-adaptive",
    "stall-fixed",
    "job_crash",
]


@pytest.mark.slow
@pytest.mark.parametrize(("make", "timestamps"), CASES, ids=IDS)
def test_fast_hooks_raise_what_the_plain_hooks_raise(
    make: Callable[[], BaseDetector], timestamps: bool
) -> None:
    lines = troubled_run(seed=7, timestamps=timestamps)
    expected = drive(make(), lines, plain)
    assert expected, "the run must make the rule raise, or the comparison proves nothing"
    assert drive(make(), lines, fast) == expected


def test_the_base_observe_samples_shows_a_rule_only_what_it_watches() -> None:
    class Recorder(BaseDetector):
        rule = "recorder"
        watches = frozenset({"loss"})

        def __init__(self) -> None:
            super().__init__(RuleConfig())
            self.seen: list[str] = []

        def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
            self.seen.append(sample.name)
            return []

    recorder = Recorder()
    samples = [Sample(PROGRESS, 3.0, 3), Sample("loss", 1.0, 3), Sample("lr", 1e-4, 3)]
    assert recorder.observe_samples(samples, SOURCE, T0) == []
    assert recorder.seen == ["loss"]
