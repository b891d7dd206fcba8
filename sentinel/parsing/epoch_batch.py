"""Hand-written loops that name the epoch and the batch within it, but not the batches an
epoch has: ``Epoch 1, Batch 100, Loss: 0.5``, ``epoch 1 batch 100 loss 0.5``, ``[Epoch 1,
Batch 100] loss: 0.5``, MXNet's ``Epoch[0] Batch [50]  Speed: 31.41 samples/sec
Train-Perplexity=12.3``, and PyTorch's CIFAR-10 tutorial, ``[1,  2000] loss: 2.192``
(``print(f'[{epoch + 1}, {i + 1:5d}] loss: ...')``), which so many loops copy.

Read as the epoch alone, every line of an epoch would share its step. The step here is the
batches since the first epoch began (``values.EpochBatches``); a log that starts after its
first epoch (an excerpt, a rotated log) cannot tell the epochs before: its lines are read
at the batches since the first epoch it shows began, in order and each at its own step
(read at the epoch, an epoch's lines shared one step and were taken for ranks).
A line that names the batches an epoch has (``Batch 100/600``) is read at the epochs before
it times those, plus its batch, its epochs counted from 0 where the first such line names
epoch 0, else from 1 (``Epoch 1, Batch 1/500`` is step 1, not 501). A ``LineFormat``: it
counts the batches of its epochs.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import EPOCH_BATCH_OF, find_pairs
from sentinel.parsing.values import EpochBatches

#: ``Epoch 1, Batch 100``, MXNet's ``Epoch[0] Batch [50]`` and the like, not followed by
#: ``/600`` (those are exact).
_NAMED = re.compile(
    r"\bepoch\s*[:=]?\s*\[?\s*(\d+)\W{1,4}batch\s*[:=]?\s*\[?\s*(\d+)(?!\s*/|\d)",
    re.IGNORECASE,
)
#: A word that names the line's own step (then its step is that).
_OWN_STEP = re.compile(r"\b(?:step|iter(?:ation)?|global_step)\b", re.IGNORECASE)
#: The CIFAR-10 tutorial's ``[1,  2000] loss: 2.192``: epoch from 1, batch from 1.
_TUTORIAL = re.compile(r"\[\s*(\d+),\s*(\d+)\]\s+(?=[a-z])", re.IGNORECASE)
#: The names that place the line, not metrics.
_PLACING = frozenset({"epoch", "batch"})


class EpochBatch:
    """Reads epoch-and-batch lines, counting the batches of their epochs."""

    __slots__ = ("_batches", "_first_epoch")

    def __init__(self) -> None:
        self._batches = EpochBatches(from_any_epoch=True)
        #: The first epoch a line with the batches an epoch has named: loops count epochs
        #: from 0 or from 1, and the first says which (an excerpt's, after both: from 1,
        #: which puts a step an epoch early, never late, so a rollback goes back far enough).
        self._first_epoch: int | None = None

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        first = text[0]
        if first == "[" and text[1:2] != "E" and text[1:2] != "e":
            found = _TUTORIAL.match(text)
            rest = text[found.end() :] if found is not None else ""
        elif "atch" in text and ("poch" in text or "POCH" in text):
            found = _NAMED.search(text)
            rest = text
            if found is None:
                return self._of_all(text)
        else:
            return None
        if found is None:
            return None
        pairs, named = find_pairs(rest)
        pairs = [(name, value) for name, value in pairs if name not in _PLACING]
        if not pairs:
            return None
        epoch, batch = int(found.group(1)), int(found.group(2))
        counted = self._batches.step(epoch, batch)
        step = named if named is not None else counted
        samples = [Sample(name, value, step) for name, value in pairs]
        samples.append(Sample("epoch", float(epoch), step))
        return samples

    def _of_all(self, text: str) -> list[Sample] | None:
        """A line that names the batches an epoch has (``Epoch 1, Batch 100/600``): at the
        epochs before it times those, plus its batch, the epochs counted from the first
        one such a line named (0, or else 1); None for a line that does not."""
        found = EPOCH_BATCH_OF.search(text)  # its epoch counted from the first one named
        if found is None or _OWN_STEP.search(text) is not None:
            return None
        pairs, _ = find_pairs(text)
        if not pairs:
            return None
        epoch, batch, per_epoch = map(int, found.groups())
        if self._first_epoch is None:
            self._first_epoch = epoch
        base = 0 if self._first_epoch == 0 else 1
        step = max(epoch - base, 0) * per_epoch + batch
        return [Sample(name, value, step) for name, value in pairs]
