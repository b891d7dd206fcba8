"""YOLOv5's and YOLOv7's ``results.txt``: a row an epoch, no header.

::

         5/299     10.9G   0.05404   0.02393   0.01594   0.09391       129       640    0.4326  ...

Their ``train.py`` writes each epoch's row as ``"%10s" * 2 + "%10.4g" * 6`` (the epoch over
its last index, counted from 0, the GPU memory, the epoch's mean box, objectness and class
losses and their total, the last batch's labels and image size) then ``"%10.4g" * 7`` of its
validation (precision, recall, mAP@.5, mAP@.5:.95, and the box, objectness and class
losses). Fifteen cells, the first ``E/N``, the second the memory (``10.9G``). Read at the
epoch's number (from 0, as the rows count) as the training ``loss`` (the total), its three
terms, ``eval_loss`` (the sum of the validation's three) and the validation's metrics; a
NaN reads ``nan``. Stateless, one line each (``ParseFn``).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float

_ROW = re.compile(r"\s*(\d+)/\d+\s+\d+(?:\.\d+)?[GMK]?\s+(.*)")
#: The cells after the epoch and the memory, by name (``None``: not a metric).
_NAMES = (
    "box_loss", "obj_loss", "cls_loss", "loss", None, None,
    "precision", "recall", "map50", "map50_95",
    "eval_box_loss", "eval_obj_loss", "eval_cls_loss",
)  # fmt: skip


def parse_yolo_results(text: str) -> list[Sample] | None:
    """The metrics of a ``results.txt`` row; None for another line."""
    found = _ROW.match(text)
    if found is None:
        return None
    cells = found.group(2).split()
    if len(cells) != len(_NAMES):
        return None
    values = [as_float(cell) for cell in cells]
    if any(value is None for value in values):
        return None
    epoch = int(found.group(1))
    samples = [
        Sample(name, value, epoch)
        for name, value in zip(_NAMES, values, strict=True)
        if name is not None and value is not None
    ]
    evals = values[-3:]
    if all(value is not None for value in evals):
        samples.append(Sample("eval_loss", sum(v for v in evals if v is not None), epoch))
    return samples
