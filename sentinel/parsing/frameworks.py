"""Training frameworks' own console lines, each read at the step it names.

Stateless, one line each (``ParseFn``):

- Megatron-LM and Megatron-DeepSpeed: `` iteration  200/ 1000 | consumed samples: 800 |
  ... | lm loss: 7.399415E+00 | loss scale: 16384.0 | grad norm: 2.918 | number of
  skipped iterations:   0 | number of nan iterations:   0 |``; multi-word names read as
  ``loss``, ``lr``, ``grad_norm``, ``loss_scale``, ``skipped_iterations``,
  ``nan_iterations``, the rest lower-cased with ``_`` (``consumed_samples``);
- mmengine (OpenMMLab): ``Epoch(train)  [1][ 240/735]  lr: 1.0000e-02  eta: 0:37:40
  ... loss: 0.8937`` at step ``(epoch - 1) x 735 + 240``, ``Iter(train) [ 240/80000]`` at
  240; a ``val``/``test`` line's metrics as ``eval_`` ones, at no step of their own;
- DeepSpeed: ``[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[...]`` (``lr`` and
  ``skipped_steps`` at step 10) and its fp16 loss-scale messages: ``OVERFLOW! ... Attempted
  loss scale: 65536, reducing to 32768`` is a ``loss_scale`` of 32768, ``... but hysteresis
  is 2`` keeps the attempted scale, ``Current loss scale already at minimum`` is
  ``loss_scale_at_minimum`` 1 (the same words from apex and Megatron's optimizers), and
  fairseq's ``overflow detected, setting loss scale to: 0.5`` a ``loss_scale`` of 0.5;
- Composer's ``FileLogger``: ``[metric][batch=16]: loss/train/total: 2.3011``.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import find_pairs
from sentinel.parsing.values import as_float, iso_to_epoch_seconds, normalise_name

_MEGATRON_STEP = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEGATRON_FIELD = re.compile(
    r"([A-Za-z][^|:]*?)\s*:\s*([-+]?(?:[\d.]+(?:e[-+]?\d+)?|nan|inf))\b", re.I
)
_STAMP = re.compile(
    r"\[(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:[+-]\d{2}:?\d{2})?)\]"
)
#: Megatron's multi-word names, lower-cased, to sentinel's.
MEGATRON_NAMES: dict[str, str] = {
    "lm loss": "loss",
    "learning rate": "lr",
    "grad norm": "grad_norm",
    "loss scale": "loss_scale",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
    "elapsed time per iteration (ms)": "iteration_time_ms",
    "elapsed time per iteration (s)": "iteration_time_s",
}
_NAME_JUNK = re.compile(r"[^a-z0-9/._]+")

_MMENGINE = re.compile(
    r"\b(?:Epoch\((?P<emode>train|val|test)\)\s*\[(?P<epoch>\d+)\]\s*\[\s*(?P<ebatch>\d+)\s*/\s*(?P<eper>\d+)\]"
    r"|Iter\((?P<imode>train|val|test)\)\s*\[\s*(?P<iter>\d+)\s*/\s*\d+\]"
    # MMCV / mmdet 2.x's training lines: ``Epoch [1][150/5808]\tlr: ..., loss: ...``.
    r"|Epoch\s+\[(?P<epoch2>\d+)\]\s*\[\s*(?P<ebatch2>\d+)\s*/\s*(?P<eper2>\d+)\])"
)
_DEEPSPEED_STEP = re.compile(
    r"(?:\[Rank \d+\] )?step=(\d+), skipped=(\d+), lr=\[([-+0-9.e]+)", re.IGNORECASE
)
_OVERFLOW = re.compile(
    r"Attempted loss scale: ([-+0-9.e]+),? (?:reducing to ([-+0-9.e]+)|but hysteresis)"
    r"|setting loss scale to: ()([-+0-9.e]+)",
    re.I,
)
_COMPOSER_METRIC = re.compile(r"^\[metric\]\[batch=(\d+)\]:\s*(\S+?):\s*(\S+)\s*$")


def megatron_name(name: str) -> str:
    """A Megatron field name as a metric name: ``lm loss`` -> ``loss``."""
    lowered = " ".join(name.lower().split())
    known = MEGATRON_NAMES.get(lowered)
    if known is not None:
        return known
    return normalise_name(_NAME_JUNK.sub("_", lowered).strip("_"))


def parse_megatron(text: str) -> list[Sample] | None:
    """Samples of a Megatron ``iteration N/ M | name: value |`` line; None for another line."""
    if "iteration" not in text or "|" not in text:
        return None
    found = _MEGATRON_STEP.search(text)
    if found is None:
        return None
    step = int(found.group(1))
    stamp = _STAMP.search(text, 0, found.start())
    time = iso_to_epoch_seconds(stamp.group(1)) if stamp else None
    samples: list[Sample] = []
    for field in text[found.end() :].split("|"):
        pair = _MEGATRON_FIELD.fullmatch(field.strip())
        if pair is None:
            continue
        value = as_float(pair.group(2))
        if value is not None:
            samples.append(Sample(megatron_name(pair.group(1)), value, step, time))
    return samples


def parse_mmengine(text: str) -> list[Sample] | None:
    """Samples of an mmengine ``Epoch(train) [E][N/M]`` or ``Iter(train) [N/M]`` line."""
    if (
        "(train)" not in text
        and "(val)" not in text
        and "(test)" not in text
        and "Epoch [" not in text
    ):
        return None
    found = _MMENGINE.search(text)
    if found is None:
        return None
    mode = found.group("emode") or found.group("imode")
    step: int | None = None
    if found.group("epoch2") is not None:  # mmcv 2.x: a training line
        mode = "train"
        epoch, batch, per_epoch = (int(found.group(g)) for g in ("epoch2", "ebatch2", "eper2"))
        step = max(epoch - 1, 0) * per_epoch + batch
    elif mode == "train":
        if found.group("iter") is not None:
            step = int(found.group("iter"))
        else:
            epoch, batch, per_epoch = (int(found.group(g)) for g in ("epoch", "ebatch", "eper"))
            step = max(epoch - 1, 0) * per_epoch + batch
    pairs, _ = find_pairs(text[found.end() :])
    samples: list[Sample] = []
    for name, value in pairs:
        if mode != "train" and not name.startswith("eval"):
            name = "eval_loss" if name == "loss" else f"eval_{name}"
        samples.append(Sample(name, value, step))
    return samples


def parse_deepspeed(text: str) -> list[Sample] | None:
    """Samples of DeepSpeed's ``[Rank 0] step=`` line and its loss-scale messages."""
    if "loss scale" in text:
        overflow = _OVERFLOW.search(text)
        if overflow is not None:
            scale = as_float(overflow.group(2) or overflow.group(1) or overflow.group(4))
            return [] if scale is None else [Sample("loss_scale", scale)]
        if "already at minimum" in text:
            return [Sample("loss_scale_at_minimum", 1.0)]
        return None
    if "step=" not in text:
        return None
    found = _DEEPSPEED_STEP.search(text)
    if found is None:
        return None
    step = int(found.group(1))
    samples = [Sample("skipped_steps", float(found.group(2)), step)]
    lr = as_float(found.group(3))
    if lr is not None:
        samples.append(Sample("lr", lr, step))
    return samples


def parse_composer_metric(text: str) -> list[Sample] | None:
    """A Composer ``FileLogger`` line, ``[metric][batch=16]: loss/train/total: 2.3``."""
    if not text.startswith("[metric]"):
        return None
    found = _COMPOSER_METRIC.match(text)
    if found is None:
        return None
    value = as_float(found.group(3))
    if value is None:
        return []
    return [Sample(composer_name(found.group(2)), value, int(found.group(1)))]


def composer_name(name: str) -> str:
    """A Composer metric name: ``loss/train/total`` (its training loss) -> ``loss``."""
    lowered = name.lower()
    if lowered in ("loss/train/total", "loss/train"):
        return "loss"
    return normalise_name(name)


#: The parsers above, in the order ``formats`` tries them.
FRAMEWORK_PARSERS = (parse_megatron, parse_mmengine, parse_deepspeed, parse_composer_metric)
