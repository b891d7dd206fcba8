"""WeNet's training and cross-validation lines, read at a step and a rank.

``TRAIN Batch 0/4000 loss 41.3 loss_att 40.1 loss_ctc 44.2 lr 0.00001905 rank 0``: the
epoch (from 0), then the batch within it, the values, the rank that printed it (each rank
logs its own, to one file). Newer releases put ``| steps/sec 1.2|`` between. The step is
the batches since the first epoch began (``values.EpochBatches``; an excerpt counts from
the first epoch it shows). ``CV Batch 0/40 loss 28.5 loss_att 27.1 loss_ctc 31.5 history
loss 27.9 rank 2`` is the cross-validation at an epoch's end: its ``history loss`` (the
running mean over what was evaluated so far) is ``eval_loss``, at the step the epoch's
training reached. Read as plain pairs, each CV line's loss was a value of the training
loss, 1.5x it: a ``divergence`` warning on a healthy run. A ``LineFormat``.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import as_evaluation, find_pairs
from sentinel.parsing.values import EpochBatches

_LINE = re.compile(r"\b(TRAIN|CV)\b[^A-Za-z]*(?:steps/sec [\d.]+\s*\|\s*)?Batch (\d+)/(\d+) (.*)$")
_RANK = re.compile(r"\s+rank (\d+)\s*$")


class WenetLog:
    """Reads WeNet's ``TRAIN Batch`` and ``CV Batch`` lines, counting the batches of its epochs."""

    __slots__ = ("_batches",)

    def __init__(self) -> None:
        self._batches = EpochBatches(from_any_epoch=True)

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        if "Batch " not in text or ("TRAIN" not in text and "CV" not in text):
            return None
        found = _LINE.search(text)
        if found is None:
            return None
        kind, epoch, batch, rest = found.groups()
        rank = None
        ranked = _RANK.search(rest)
        if ranked is not None:
            rank, rest = int(ranked.group(1)), rest[: ranked.start()]
        pairs, _ = find_pairs(rest)
        if kind == "TRAIN":
            step = self._batches.step(int(epoch), int(batch))
            return [Sample(name, value, step, None, rank) for name, value in pairs]
        step = self._batches.epoch_end(int(epoch))
        history = [value for name, value in pairs if name == "loss#2"]
        evaluated = [
            (as_evaluation(name), value) for name, value in pairs if not name.startswith("loss")
        ]
        if history:
            evaluated.insert(0, ("eval_loss", history[0]))
        return [Sample(name, value, step, None, rank) for name, value in evaluated]
