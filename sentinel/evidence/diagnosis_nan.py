"""What a non-finite value and the learning rate before it say: the readings of ``nan_inf``
incidents, and a jump or a warmup in the logged learning rate (``sentinel.evidence.diagnosis``).

- a jump in the logged learning rate, or a warmup still rising, before a blow-up: the
  schedule, named with the step where the LR changed, next to the grad-norm evidence;
- a grad-norm run or spike just before a NaN: an optimisation blow-up;
- a NaN in the first steps with no divergence before it: the data. "First" is judged by
  where the log says the run is (its step, its epoch), not by how many values the excerpt
  sentinel holds shows before the NaN: a log that begins late is no start;
- a NaN out of the blue after a healthy stretch: a bad batch at that step, an fp16
  overflow or a numerics edge case (the step or epoch, and its samples, to inspect: the
  consumed samples of that step where the job logs them, as Megatron does); a
  run whose loss scale is 1.0 throughout has no dynamic loss scaling (bf16 or fp32), so
  no fp16 overflow is suspected.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from itertools import pairwise

from sentinel.model.incidents import Incident
from sentinel.model.records import Sample

#: A NaN with at most this many finite values of its metric before it is "in the first steps".
FIRST_STEPS = 5
#: A logged epoch at most this far in is the first steps (when no step is known).
EARLY_EPOCH = 0.05
#: A last grad-norm this many times its earlier median before a NaN is a blow-up.
BLOW_UP_FACTOR = 5.0
#: A rise of the logged learning rate between two logged values that is a jump.
LR_JUMP = 3.0


def nan_reading(
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
    where = _position(step, recent.get(metric or "", ()), recent)
    evidence = nan_alert.details.get("evidence") or []
    unscaled = _no_loss_scaling(recent, step)
    if not unscaled and any("loss scale" in str(item) for item in evidence):
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
    flat = (
        "NaN with a flat grad-norm before it"
        if _finite_before(recent.get("grad_norm", ()), step)
        else "NaN"
    )
    data = _consumed(step, recent)
    epoch = _last_epoch(recent)
    placed = step is not None or (epoch is not None and epoch > EARLY_EPOCH)
    if before > FIRST_STEPS:
        seen = f"after a healthy stretch ({before} finite values seen)"
    elif placed:
        seen = (
            "after a healthy stretch (long past the start, though the log shows only"
            f" {before} finite values before it)"
        )
    else:  # an excerpt that names no step and no epoch past the start: nothing says healthy
        seen = f"with only {before} finite values before it in the log (too few to judge the run)"
    if unscaled:
        return (
            f"{flat}, out of the blue{where} {seen}: a bad batch or"
            " a numerics edge case; the loss scale is 1.0 throughout, so the run has no"
            " dynamic loss scaling (bf16 or fp32): not an fp16 overflow",
            f"inspect the batch{where}{data} (the samples below); rerun that step under"
            " torch.autograd.detect_anomaly() to find the layer; if the batch is fine, look"
            " for a log(0), a division by zero or an overflow in a custom kernel",
            metric,
        )
    return (
        f"{flat}, out of the blue{where} {seen}: a bad batch, an"
        " fp16 overflow or a numerics edge case",
        f"inspect the batch{where}{data} (the samples below); rerun that step under"
        " torch.autograd.detect_anomaly() to find the layer; if the batch is fine, suspect an"
        " fp16 overflow (bf16, or a lower initial loss scale) or a log(0) or division by zero",
        metric,
    )


def _position(
    step: int | None, samples: Sequence[Sample], recent: Mapping[str, Sequence[Sample]]
) -> str:
    """Where the log says the NaN came: " at step N", else " at epoch E", else nothing.

    With no step, the epoch is the one logged beside the first non-finite value of
    ``samples`` where the two series line up from their ends (one line logs both: HF's
    dicts, ``epoch: 3451 loss: nan``), else the last logged epoch."""
    if step is not None:
        return f" at step {step}"
    epochs = [sample.value for sample in recent.get("epoch", ()) if math.isfinite(sample.value)]
    if not epochs:
        return ""
    first_bad = next(
        (index for index, sample in enumerate(samples) if not math.isfinite(sample.value)), None
    )
    at = None if first_bad is None else len(epochs) - len(samples) + first_bad
    epoch = epochs[at] if at is not None and 0 <= at < len(epochs) else epochs[-1]
    return f" at epoch {epoch:g}"


def _consumed(step: int | None, recent: Mapping[str, Sequence[Sample]]) -> str:
    """The data position the job logged for ``step``: Megatron's consumed samples after it
    (with its global batch size, the batch's own samples), else nothing."""
    if step is None:
        return ""
    consumed = [
        sample.value for sample in recent.get("consumed_samples", ()) if sample.step == step
    ]
    batch = [sample.value for sample in recent.get("global_batch_size", ()) if sample.step == step]
    if not consumed or not math.isfinite(consumed[0]):
        return ""
    after = int(consumed[0])
    if batch and math.isfinite(batch[0]) and 0 < batch[0] <= after:
        return f", consumed samples {after - int(batch[0])}-{after - 1}"
    return f", the batch before consumed sample {after}"


def _last_epoch(recent: Mapping[str, Sequence[Sample]]) -> float | None:
    epochs = [sample.value for sample in recent.get("epoch", ()) if math.isfinite(sample.value)]
    return epochs[-1] if epochs else None


def _no_loss_scaling(recent: Mapping[str, Sequence[Sample]], step: int | None) -> bool:
    """Whether the logged loss scale says the run has no dynamic loss scaling: 1.0 on every
    value up to ``step`` (Megatron logs 1.0 under bf16 and fp32; a dynamic fp16 scaler
    starts at 2**16 and moves)."""
    scales = [
        sample.value
        for sample in recent.get("loss_scale", ())
        if step is None or sample.step is None or sample.step <= step
    ]
    return bool(scales) and all(scale == 1.0 for scale in scales)


def lr_evidence(
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
    logging intervals from the start, and no logged epoch past the start. A log that begins
    late (an excerpt, a resumed run) shows few values before a NaN at step 1655, which is
    no first step. With no step, the logged epoch tells (its first 5%); with neither,
    nothing says it came first."""
    epoch = _last_epoch(recent)
    # A fraction (HF's 0.02); a whole number counts epochs (0 is all of the first one, and
    # 1 may be too: a count from 1), so only one past that is surely no start.
    if step is None:
        return epoch is not None and epoch <= EARLY_EPOCH and not epoch.is_integer()
    if epoch is not None and (epoch >= 2 or (epoch > EARLY_EPOCH and not epoch.is_integer())):
        return False
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
