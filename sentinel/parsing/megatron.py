"""Megatron-LM and Megatron-DeepSpeed's console line, read at the iteration it names.

`` iteration  200/ 1000 | consumed samples: 800 | ... | lm loss: 7.399415E+00 | loss scale:
16384.0 | grad norm: 2.918 | number of skipped iterations:   0 | number of nan iterations:
0 |``; multi-word names read as ``loss``, ``lr``, ``grad_norm``, ``loss_scale``,
``skipped_iterations``, ``nan_iterations``, the rest lower-cased with ``_``
(``consumed_samples``); older Megatron's ``lm loss 6.75E+00 | loss scale 64.0`` (no colon)
too. The evaluation's ``validation loss at iteration 1000 | LM loss: 4.5E+00 | LM PPL: ...``
is ``eval_loss`` and ``eval_ppl`` at that iteration, never the training loss. Stateless, one
line each (``ParseFn``).

A NaN loss leaves the line without its loss: Megatron (and Megatron-DeepSpeed, GPT-NeoX)
prints each loss of the interval only ``if avg > 0.0``, which a NaN is not, and counts a
NaN iteration only when it was skipped (fp16's overflow), so in bf16 a run whose loss turned
NaN logs ``... | loss scale: 1.0 | number of skipped iterations:   0 | number of nan
iterations:   0 |`` and nothing else says so (Megatron-DeepSpeed PR 434, Megatron-LLM issue
33). A training line with no loss at all on which no iteration was skipped is read as a
loss of NaN (an average of 0 or less is as bad for a training loss). One on which every
iteration was skipped shows no loss for that reason (fp16's first steps, while the loss
scale settles), and one that names no skipped count is not judged.
"""

from __future__ import annotations

import math
import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float, iso_to_epoch_seconds, normalise_name

_MEGATRON_STEP = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
#: The evaluation's line: `` validation loss at iteration 1000 | LM loss: 4.5E+00 | LM PPL:
#: 90.3 |`` (older), ``... at iteration 100 on validation set | lm loss value: ... |``;
#: GPT-NeoX's ``validation results at iteration 100 | lm_loss value: 6.9E+00 | ...``.
_MEGATRON_VALIDATION = re.compile(
    r"\bvalidation (?:loss|results) at iteration\s+(\d+)\b[^|]*\|", re.I
)
#: ``name: value``, or ``name value`` as older Megatron writes it (``lm loss 6.75E+00``).
_MEGATRON_FIELD = re.compile(
    r"([A-Za-z][^|:]*?)(?:\s*:\s*|\s+)([-+]?(?:[\d.]+(?:e[-+]?\d+)?|nan|inf))\b", re.I
)
#: The evaluation's names, lower-cased, to sentinel's.
_VALIDATION_NAMES = {
    "lm loss": "eval_loss",
    "lm loss value": "eval_loss",
    "lm loss ppl": "eval_ppl",
    "lm ppl": "eval_ppl",
    "lm_loss value": "eval_loss",
    "lm_loss_ppl value": "eval_ppl",
}
_STAMP = re.compile(
    r"\[(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:[+-]\d{2}:?\d{2})?)\]"
)
#: Megatron's multi-word names, lower-cased, to sentinel's.
MEGATRON_NAMES: dict[str, str] = {
    "lm loss": "loss",
    "lm_loss": "loss",  # GPT-NeoX's line, Megatron's with its names joined by "_"
    "learning rate": "lr",
    "grad norm": "grad_norm",
    "loss scale": "loss_scale",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
    "elapsed time per iteration (ms)": "iteration_time_ms",
    "elapsed time per iteration (s)": "iteration_time_s",
}
_NAME_JUNK = re.compile(r"[^a-z0-9/._]+")


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
    evaluation = False
    if found is None:
        found = _MEGATRON_VALIDATION.search(text)
        if found is None:
            return None
        evaluation = True
    step = int(found.group(1))
    stamp = _STAMP.search(text, 0, found.start())
    time = iso_to_epoch_seconds(stamp.group(1)) if stamp else None
    samples: list[Sample] = []
    for field in text[found.end() :].split("|"):
        pair = _MEGATRON_FIELD.fullmatch(field.strip())
        if pair is None:
            continue
        value = as_float(pair.group(2))
        if value is None:
            continue
        if evaluation:
            lowered = " ".join(pair.group(1).lower().split())
            name = _VALIDATION_NAMES.get(lowered) or f"eval_{megatron_name(pair.group(1))}"
        else:
            name = megatron_name(pair.group(1))
        samples.append(Sample(name, value, step, time))
    if not evaluation and _loss_left_out(samples):
        samples.append(Sample("loss", math.nan, step, time))
    return samples


def _loss_left_out(samples: list[Sample]) -> bool:
    """Whether a training line shows no loss though none of its iterations was skipped:
    Megatron left the loss out because its average was not above 0 (NaN)."""
    skipped = None
    for sample in samples:
        name = sample.name
        if name == "skipped_iterations":
            skipped = sample.value
        elif "loss" in name and name != "loss_scale":
            return False
    return skipped == 0
