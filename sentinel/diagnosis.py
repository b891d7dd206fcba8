"""What the evidence suggests: the runbooks' reading of an incident.

``diagnose`` looks at which rules fired together and at the metrics just
before onset, and says, as an on-call engineer would read it at 3 AM: the
likely cause, what to do, the step (and sample range) to inspect, and a
sparkline of the metric around onset (``grad_norm ▁▁▂▃▅▇█ nan``).

The readings follow the field's runbooks:

- a jump in the logged learning rate, or a warmup still rising, before a blow-up: the
  schedule, named with the step where the LR changed, next to the grad-norm evidence;
- a grad-norm run or spike just before a NaN: an optimisation blow-up;
- a NaN in the first steps with no divergence before it: the data;
- a NaN out of the blue after a healthy stretch: a bad batch at that step, an fp16
  overflow or a numerics edge case (the step and its samples to inspect);
- a loss flat from the start: data or label masking, frozen parameters.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from sentinel.incidents import Incident
from sentinel.records import Alert, Sample

_BARS = "▁▂▃▄▅▆▇█"

#: A NaN with at most this many finite values of its metric before it is "in the first steps".
FIRST_STEPS = 5
#: A logged epoch at most this far in is the first steps (when no step is known).
EARLY_EPOCH = 0.05
#: A last grad-norm this many times its earlier median before a NaN is a blow-up.
BLOW_UP_FACTOR = 5.0
#: A rise of the logged learning rate between two logged values that is a jump.
LR_JUMP = 3.0
#: Points of the sparkline around onset.
SPARK_POINTS = 12


def sparkline(values: Sequence[float]) -> str:
    """``▁▂▄█ nan``: finite values scaled to bars, non-finite ones spelled out."""
    finite = [value for value in values if math.isfinite(value)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
    span = (high - low) or 1.0
    marks = []
    for value in values:
        if math.isfinite(value):
            marks.append(_BARS[min(len(_BARS) - 1, int((value - low) / span * len(_BARS)))])
        else:
            marks.append(f" {value} ")
    return "".join(marks).strip()


@dataclass(frozen=True)
class Diagnosis:
    """The reading of one incident."""

    cause: str
    advice: str
    #: The step whose batch to look at first (the onset of the evidence).
    inspect_step: int | None = None
    #: Global sample indices ``[first, last]`` of that step, when the batch size is known.
    sample_range: tuple[int, int] | None = None
    #: ``metric ▁▂▃▅█ nan`` around onset.
    sparkline: str = ""

    def lines(self) -> list[str]:
        """The diagnosis as a few short lines for messages and reports."""
        out = [f"{self.cause}: {self.advice}"]
        if self.inspect_step is not None:
            where = f"inspect step {self.inspect_step}"
            if self.sample_range is not None:
                first, last = self.sample_range
                where += f" (samples {first}-{last} in the order the data loader served them)"
            out.append(where)
        if self.sparkline:
            out.append(self.sparkline)
        return out

    def text(self) -> str:
        return "\n".join(self.lines())

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "advice": self.advice,
            "inspect_step": self.inspect_step,
            "sample_range": list(self.sample_range) if self.sample_range else None,
            "sparkline": self.sparkline,
        }


def diagnose(
    incident: Incident,
    recent: Mapping[str, Sequence[Sample]],
    *,
    samples_per_step: int | None = None,
) -> Diagnosis:
    """Read an incident: which rules fired together, and the metrics just before onset.

    ``recent`` holds the last samples of each metric up to the incident's latest
    step; ``samples_per_step`` (batch size x accumulation x ranks) turns the step
    to inspect into a sample range.
    """
    rules = set(incident.rules)
    worst = incident.worst
    cause, advice, metric = _reading(incident, rules, recent)
    inspect = incident.onset_step
    return Diagnosis(
        cause=cause,
        advice=advice,
        inspect_step=inspect,
        sample_range=_sample_range(inspect, samples_per_step),
        sparkline=_spark(metric or worst.metric, recent),
    )


def explain(
    incident: Incident,
    alert: Alert,
    recent: Mapping[str, Sequence[Sample]],
    *,
    samples_per_step: int | None = None,
) -> None:
    """Diagnose ``incident`` anew with ``alert`` just folded in; the alert carries it."""
    incident.diagnosis = diagnose(incident, recent, samples_per_step=samples_per_step)
    alert.details["diagnosis"] = incident.diagnosis.to_json()


def _reading(
    incident: Incident, rules: set[str], recent: Mapping[str, Sequence[Sample]]
) -> tuple[str, str, str | None]:
    """(cause, advice, metric to draw) for the incident."""
    worst = incident.worst
    lr = _lr_evidence(incident, recent)
    if "nan_inf" in rules:
        return _nan_reading(incident, rules, recent, lr)
    if lr is not None and rules & {"grad_norm_run", "loss_spike", "divergence"}:
        what, advice = lr
        when = "after" if what.startswith("the logged learning rate jumped") else "while"
        return (f"the loss or grad-norm rose {when} {what}", advice, worst.metric)
    if "divergence" in rules:
        return (
            "divergence: the loss moved up and did not come back",
            "roll back to the checkpoint before the onset; lower the learning rate, check the"
            " schedule and the data order around the onset step",
            worst.metric,
        )
    if {"grad_norm_run", "loss_spike"} <= rules:
        return (
            "optimisation blow-up (grad-norm and loss rising together)",
            "lower the learning rate, add or lengthen warmup, clip gradients at 1.0,"
            " use bf16 rather than fp16",
            "grad_norm",
        )
    rule = worst.rule
    details = worst.details
    if rule == "grad_norm_run":
        if details.get("kind") == "clipping":
            return (
                "gradient clipping engaged on most steps",
                "the learning rate is likely too high: lower it or add warmup",
                "grad_norm",
            )
        return (
            "grad-norm running high: the usual smoke before a NaN",
            "lower the learning rate, clip gradients at 1.0, check fp16 loss scaling;"
            " roll back to the last checkpoint before the run if it does not settle",
            "grad_norm",
        )
    if rule == "loss_spike":
        return (
            "loss spike: a bad batch or an optimiser instability",
            "inspect the batch at this step; if spikes repeat, lower the learning rate or"
            " Adam's beta2 (0.95), or skip the offending batches",
            worst.metric,
        )
    if rule == "loss_plateau":
        if details.get("from_start"):
            return (
                "loss flat from the start",
                "check the data and label masking (all labels -100?), frozen parameters"
                " (requires_grad), a learning rate of 0 or a scheduler stuck at 0",
                worst.metric,
            )
        return (
            "loss plateaued high (underfitting)",
            "raise the learning rate or the model's capacity; check the schedule has not"
            " decayed to 0",
            worst.metric,
        )
    if rule == "eval_loss_rise":
        best = details.get("best_step")
        keep = f"keep the checkpoint at step {best}; " if best is not None else ""
        return (
            "overfitting: eval loss rises while train loss falls",
            f"{keep}stop early, add regularisation (dropout, weight decay) or more data",
            worst.metric,
        )
    if rule == "throughput_drop":
        return (
            "throughput fell and stayed down",
            "look for data-loader starvation, GPU throttling, a straggler rank, host"
            " memory swapping, or another job on the GPUs",
            worst.metric,
        )
    if rule == "gpu_memory_creep":
        if details.get("kind") == "capacity":
            return (
                "GPU memory near capacity: an OOM is ahead",
                "lower the batch size, enable gradient checkpointing, or shard more",
                worst.metric,
            )
        return (
            "GPU memory climbs step over step: a leak",
            "look for tensors kept across steps (a loss appended without .item(), growing"
            " caches or lists of outputs)",
            worst.metric,
        )
    if rule == "stall":
        return _stall_reading(details.get("evidence") or {})
    if rule == "gpu_health":
        return (
            "a GPU hardware fault or throttling",
            "drain the node if it is an XID or ECC error (nvidia-smi -q shows the GPU's"
            " state); for throttling check the cooling and the power limit",
            worst.metric,
        )
    if rule == "gpu_idle":
        return (
            "GPUs held by the job sit idle",
            "look for a data loader that starves the GPUs, a rank waiting on another, or a"
            " job that finished its work but not its process",
            worst.metric,
        )
    if rule == "cost_overrun":
        return (
            "the run costs more than its budget",
            "check throughput (a slowdown stretches the bill), or raise the budget",
            None,
        )
    advice = str(details.get("advice") or "")
    return (rule.replace("_", " "), advice or "see the timeline", worst.metric)


def _nan_reading(
    incident: Incident,
    rules: set[str],
    recent: Mapping[str, Sequence[Sample]],
    lr: tuple[str, str] | None,
) -> tuple[str, str, str | None]:
    """What a non-finite value says, by what came before it: a learning-rate jump or a
    warmup, a blow-up, a collapsed loss scale, the first steps (the data), or nothing (a
    bad batch, an fp16 overflow or a numerics edge case at that step)."""
    nan_alert = next(alert for alert in incident.alerts if alert.rule == "nan_inf")
    metric, step = nan_alert.metric, nan_alert.step
    told = nan_alert.details.get("finite_before")
    before = (
        told if isinstance(told, int) else len(_finite_before(recent.get(metric or "", ()), step))
    )
    grad = _grad_norm_rise(recent, step)
    diverged = bool(rules & {"grad_norm_run", "loss_spike", "divergence"}) or (
        grad is not None or _loss_climbed(recent, step)
    )
    drawn = "grad_norm" if "grad_norm" in recent else metric
    beside = f"; {grad}" if grad else ""
    if lr is not None and lr[0].startswith("the logged learning rate jumped"):
        return (f"optimisation blow-up after {lr[0]}{beside}", lr[1], drawn)
    if lr is not None and diverged:
        return (f"divergence during warmup: {lr[0]}{beside}", lr[1], drawn)
    if diverged:
        return (
            f"optimisation blow-up (grad-norm rose before the NaN){beside}",
            "lower the learning rate, add or lengthen warmup, clip gradients at 1.0,"
            " use bf16 rather than fp16",
            drawn,
        )
    where = f" at step {step}" if step is not None else ""
    evidence = nan_alert.details.get("evidence") or []
    if any("loss scale" in str(item) for item in evidence):
        return (
            "fp16 overflow: the loss scale is at its minimum and the gradients still overflow",
            "train in bf16, or lower the learning rate and clip gradients; roll back to the"
            " last checkpoint before the overflows began",
            drawn,
        )
    if before <= FIRST_STEPS and _early(step, recent.get(metric or "", ()), recent):
        return (
            f"{metric} non-finite in the first steps",
            "look at the data: empty sequences, labels out of range, inf or NaN in the"
            " inputs, a bad tokenizer pad id",
            metric,
        )
    return (
        f"NaN with a flat grad-norm before it, out of the blue{where} after a healthy"
        f" stretch ({before} finite values seen): a bad batch, an fp16 overflow or a numerics"
        " edge case",
        f"inspect the batch{where} (the samples below); rerun that step under"
        " torch.autograd.detect_anomaly() to find the layer; if the batch is fine, suspect an"
        " fp16 overflow (bf16, or a lower initial loss scale) or a log(0) or division by zero",
        metric,
    )


def _lr_evidence(
    incident: Incident, recent: Mapping[str, Sequence[Sample]]
) -> tuple[str, str] | None:
    """(what the logged learning rate did, advice): a jump between two logged values (the
    step where it changed), or a warmup still rising at the latest step; None when neither.

    A rule that saw the jump long before may say so itself (``details["lr_jump"]``:
    ``[step, before, after]``); else the recent ``lr`` samples tell.
    """
    for alert in incident.alerts:
        told = alert.details.get("lr_jump")
        if isinstance(told, (list, tuple)) and len(told) == 3:
            step, before, after = told
            return _lr_jump(step, float(before), float(after))
    steps = [alert.step for alert in incident.alerts if alert.step is not None]
    latest = max(steps) if steps else None
    values = [
        (sample.step, sample.value)
        for sample in recent.get("lr", ())
        if math.isfinite(sample.value)
        and sample.value > 0
        and (latest is None or sample.step is None or sample.step <= latest)
    ]
    best: tuple[int | None, float, float] | None = None
    for index in range(1, len(values)):
        (step, after), before = values[index], values[index - 1][1]
        ratio = after / before
        # Warmup climbs by a steady factor (2x, 1.5x...): a jump is far above the step before.
        prior = before / values[index - 2][1] if index >= 2 else 1.0
        if ratio >= LR_JUMP and ratio > 2 * prior and (best is None or ratio > best[2] / best[1]):
            best = (step, before, after)
    if best is not None:
        return _lr_jump(*best)
    if len(values) >= 2 and values[-1][1] > values[-2][1] * (1 + 1e-6):
        return (
            f"the learning rate was still warming up (rising, {values[-1][1]:.3g} at step"
            f" {values[-1][0]})",
            "lower the peak learning rate or lengthen the warmup; clip gradients at 1.0;"
            " use bf16 rather than fp16",
        )
    return None


def _lr_jump(step: int | None, before: float, after: float) -> tuple[str, str]:
    at = f" at step {step}" if step is not None else ""
    return (
        f"the logged learning rate jumped {after / before:.3g}x{at} (from {before:.3g} to"
        f" {after:.3g})",
        f"look at the learning-rate schedule{at}: a scheduler restarted or resumed with other"
        " settings, a wrong multiplier or unit; roll back to the checkpoint before it",
    )


def _stall_reading(evidence: Mapping[str, object]) -> tuple[str, str, str | None]:
    """What a stall's evidence (``StallDetector``'s ``details["evidence"]``) points at."""
    if evidence.get("d_state"):
        return (
            "no progress, with processes stuck in uninterruptible sleep (D state)",
            "storage or a driver call that does not return (NFS, a GPU fallen off the bus):"
            " SIGTERM and SIGKILL wait for it; the node may need draining",
            None,
        )
    verdict = evidence.get("verdict")
    if verdict == "hang":
        return (
            "a hang: no progress and no work being done",
            "an NCCL collective waiting on a rank that died or diverged, or a data-loader"
            " deadlock; py-spy dump --pid shows where each process waits",
            None,
        )
    if verdict == "busy":
        return (
            "no progress although the job is busy",
            "an endless loop, or an evaluation or save far longer than any before;"
            " py-spy dump --pid shows what it is doing",
            None,
        )
    return (
        "no progress",
        "a hang (an NCCL collective, a data-loader deadlock) or a very long save;"
        " py-spy dump --pid shows where it waits",
        None,
    )


def _finite_before(samples: Sequence[Sample], step: int | None) -> list[float]:
    """The finite values logged before ``step``."""
    return [
        sample.value
        for sample in samples
        if math.isfinite(sample.value)
        and (step is None or sample.step is None or sample.step < step)
    ]


def _early(
    step: int | None, samples: Sequence[Sample], recent: Mapping[str, Sequence[Sample]]
) -> bool:
    """Whether ``step`` is among the run's first logged steps: at most ``FIRST_STEPS`` + 1
    logging intervals from the start. A log that begins late (an excerpt, a resumed run)
    shows few values before a NaN at step 1655, which is no first step. With no step, the
    logged epoch tells (its first 5%); with neither, nothing says it came first."""
    if step is None:
        epochs = [sample.value for sample in recent.get("epoch", ()) if math.isfinite(sample.value)]
        # A fraction (HF's 0.02); a whole number counts epochs (0 is all of the first one).
        return bool(epochs) and epochs[-1] <= EARLY_EPOCH and not epochs[-1].is_integer()
    steps = sorted({sample.step for sample in samples if sample.step is not None})
    gaps = [later - earlier for earlier, later in pairwise(steps)]
    interval = statistics.median(gaps) if gaps else 1
    return step <= (FIRST_STEPS + 1) * max(interval, 1)


def _grad_norm_rise(recent: Mapping[str, Sequence[Sample]], step: int | None) -> str | None:
    """The grad-norm evidence before ``step``: "grad-norm rose to X, N times its median"."""
    values = _finite_before(recent.get("grad_norm", ()), step)
    if len(values) < 3:
        return None
    baseline = statistics.median(values[:-2])
    top = max(values[-2:])
    if not (baseline > 0 and top > BLOW_UP_FACTOR * baseline):
        return None
    return f"the grad-norm rose to {top:.4g}, {top / baseline:.3g}x its median {baseline:.4g}"


def _loss_climbed(recent: Mapping[str, Sequence[Sample]], step: int | None) -> bool:
    """Whether the loss climbed before ``step``: its last value ``BLOW_UP_FACTOR`` times the
    first kept, or above every earlier one by half again."""
    values = _finite_before(recent.get("loss", ()), step)
    if len(values) < 3 or values[0] <= 0:
        return False
    return values[-1] > BLOW_UP_FACTOR * values[0] or values[-1] > 1.5 * max(values[:-1])


def _sample_range(step: int | None, samples_per_step: int | None) -> tuple[int, int] | None:
    """Global indices of the samples step ``step`` (1-based, as HF counts) consumed."""
    if step is None or samples_per_step is None or step < 1:
        return None
    return (step - 1) * samples_per_step, step * samples_per_step - 1


def _spark(metric: str | None, recent: Mapping[str, Sequence[Sample]]) -> str:
    if metric is None or metric not in recent:
        return ""
    values = [sample.value for sample in recent[metric]][-SPARK_POINTS:]
    return f"{metric} {sparkline(values)}" if values else ""
