"""YOLACT's training line, read at its iteration.

``[  1]    1440 || B: 5.495 | C: 3.668 | M: 6.919 | S: 1.564 | T: 17.647 || ETA: 197 days,
23:50:39 || timer: 0.298`` (``train.py``'s print): the epoch in brackets, the run's
iteration, each loss term by its letter (B box, C class, M mask, P prototype, D coefficient
diversity, E class existence, S semantic segmentation, I mask IoU) and ``T``, their total:
the loss. Read as plain pairs, the line named no step and its loss was no ``loss``.
Stateless, one line each (``ParseFn``).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample

_LINE = re.compile(r"\[\s*(\d+)\]\s+(\d+)\s+\|\|(.*?)\|\|")
_TERM = re.compile(r"\b([A-Z]):\s*([-+]?\d+(?:\.\d*)?(?:e[-+]?\d+)?|nan|inf)(?=\s*\|)", re.I)
_NAMES = {
    "B": "loss_box",
    "C": "loss_class",
    "M": "loss_mask",
    "P": "loss_proto",
    "D": "loss_diversity",
    "E": "loss_existence",
    "S": "loss_semantic",
    "I": "loss_mask_iou",
    "T": "loss",
}


def parse_yolact(text: str) -> list[Sample] | None:
    """Samples of YOLACT's training line; None for another line."""
    if text[:1] != "[" or "||" not in text:
        return None
    found = _LINE.match(text)
    if found is None:
        return None
    terms = _TERM.findall(found.group(3) + "|")
    if not terms:
        return None
    step = int(found.group(2))
    samples = [
        Sample(_NAMES.get(key, f"loss_{key.lower()}"), float(value), step) for key, value in terms
    ]
    samples.append(Sample("epoch", float(found.group(1)), step))
    return samples
