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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sentinel.evidence.diagnosis_nan import lr_evidence, nan_reading
from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Sample, Severity

_BARS = "▁▂▃▄▅▆▇█"

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
    lr = lr_evidence(incident, recent)
    if "nan_inf" in rules:
        return nan_reading(incident, rules, recent, lr)
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
    if rule == "loss_spike" and "eval_loss rose" in str(details.get("evidence", "")):
        return (
            "a persistent loss spike that hurt the model: the eval loss rose with it",
            "roll back to the checkpoint before the onset; inspect the batches from the onset"
            " step (a bad shard, a data-order change); if it comes back, lower the learning"
            " rate or Adam's beta2 (0.95)",
            worst.metric,
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
    if rule == "loss_scale":
        if worst.severity is Severity.CRITICAL:
            return (
                "the fp16 loss scale collapsed: the gradients overflow even unscaled",
                "roll back to the checkpoint before the overflows began; train in bf16, or"
                " lower the learning rate and clip gradients at 1.0",
                "grad_norm" if "grad_norm" in recent else None,
            )
        return (
            "fp16 overflows cluster: the loss scaler skips step after step",
            "the smoke before a collapse: watch the grad-norm; lower the learning rate or"
            " move to bf16 if it goes on",
            "grad_norm" if "grad_norm" in recent else None,
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
