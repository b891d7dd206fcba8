"""Ultralytics' console (YOLOv8, YOLO11, and YOLOv5's): a header row names the columns of the
progress rows drawn under it.

::

    Epoch  GPU_mem  box_loss  cls_loss  dfl_loss  Instances  Size
      2/3       0G     1.077    0.9391    0.6684         11    64: 25% ━━━───────── 2/8 2.6it/s 0.4s
    3/100    2.61G     1.202     1.612     1.238         42   640:  38%|███▊      | 3/8 [00:01]

Its trainer writes the header as ``"%11s" * n % ("Epoch", "GPU_mem", *loss_names,
"Instances", "Size")`` and each row as the bar's description: the epoch, the memory, the
epoch's running mean of each loss term (``%11.4g``, so a NaN reads ``nan``), the batch's
instances and image size (each cell 11 wide, narrowed above); the bar counts the epoch's
batches. Ultralytics' own bar draws it (the first row, as 8.4 does), or tqdm's
(``TQDM_BAR_FORMAT``, earlier releases: the second).

The trainer sets a batch's description before the bar counts that batch: a row at count
``k`` shows the means after batch ``k + 1`` (a row at 0 holds the first batch's), and the
bar's last redraw, at the epoch's count, those after its last batch. A row is read at step
``(epoch - 1) x batches + min(k + 1, batches)`` (a redraw after the count, where the
drawing of the description was skipped, is read one step late): each loss term by its name
(``box`` as ``box_loss``), and ``loss`` their sum (the loss the trainer minimises, as its
``results.csv`` is read; a classifier's one term is ``loss`` already). Ultralytics' own
bar fits a row to the terminal's width, cutting the description short with ``…``: the
terms before the cut are read, ``loss`` only when none is cut (at 80 columns, only
``box_loss`` or none is left). YOLOv5's header is ``Epoch  gpu_mem  box  obj  cls  [total]
labels  img_size`` (``total`` is the loss), and its rows count epochs from 0 (``0/99``), as
its 7.0 does under the newer header: a row at epoch 0 says so. The validation rows
(``Class  Images  Instances  Box(P ...``, other columns) are not read. A ``LineFormat``: it
keeps the header's names.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float

#: A progress row: ``3/100  <cells>: 38%`` and the bar, Ultralytics' (`` ━━━╸──── 3/8``)
#: or tqdm's (``|███▊      | 3/8``), then the count.
_ROW = re.compile(r"(\d+)/\d+\s+(.*?):\s+\d{1,3}%(?:\|[^|]*\||\s+[━╸─]*)\s*(\d+)/(\d+)")
#: Where Ultralytics' bar cut a description to the terminal's width.
_CUT = "…"
#: The header's last two names: YOLOv8 and later (and YOLOv5 7.0), earlier YOLOv5.
_YOLOV5_LAST = ["labels", "img_size"]
_LAST = (["Instances", "Size"], _YOLOV5_LAST)


class UltralyticsConsole:
    """Reads the training header and the progress rows under it."""

    __slots__ = ("_from_zero", "_terms")

    def __init__(self) -> None:
        #: The loss terms the header names, in its order; None before a header.
        self._terms: tuple[str, ...] | None = None
        #: Whether the rows count epochs from 0 (YOLOv5's ``0/99``), not from 1.
        self._from_zero = False

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        if text.startswith("Epoch "):
            names = text.split()
            if len(names) < 5 or names[1].lower() != "gpu_mem" or names[-2:] not in _LAST:
                return None  # Keras's "Epoch 3/10", and others
            self._terms = tuple(map(_term_name, names[2:-2]))
            self._from_zero = names[-2:] == _YOLOV5_LAST
            return []
        terms = self._terms
        if terms is None or not text[:1].isdigit() or "%" not in text:
            return None
        row = _ROW.match(text)
        if row is None:
            return None
        cells = row.group(2).split()  # the memory, the terms, the instances and the size
        cut = bool(cells) and cells[-1].endswith(_CUT)
        if cut:
            cells.pop()  # the cell the cut ended in; the ones before it are whole
            if len(cells) > len(terms) + 2:
                return None
        elif len(cells) != len(terms) + 3:
            return None
        batch, batches = int(row.group(3)), int(row.group(4))
        epoch = int(row.group(1))
        self._from_zero = self._from_zero or epoch == 0
        step = (epoch - (not self._from_zero)) * batches + min(batch + 1, batches)
        samples = []
        for name, cell in zip(terms, cells[1:], strict=False):
            value = as_float(cell)
            if value is None:
                return None
            samples.append(Sample(name, value, step))
        if "loss" in terms or len(samples) < len(terms):
            return samples  # the classifier's one term is the loss; a cut row has no sum
        total = sum(sample.value for sample in samples)
        return [Sample("loss", total, step), *samples]


def _term_name(name: str) -> str:
    """A loss term as the header names it, lower-cased, ending in ``_loss`` (``box`` in some
    trainers' headers is ``box_loss``)."""
    lowered = name.lower()
    if lowered == "total":
        return "loss"  # YOLOv5's sum of the terms, beside them
    return lowered if lowered.endswith("loss") else f"{lowered}_loss"
