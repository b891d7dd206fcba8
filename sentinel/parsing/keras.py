"""Keras / TF ``model.fit`` console lines: an ``Epoch 3/10`` line heads its progress lines.

``100/100 [====] - 1s 10ms/step - loss: 0.1234 - accuracy: 0.9`` (Keras 2) or
``100/100 ━━━━ 1s 10ms/step - accuracy: 0.9 - loss: 0.1234`` (Keras 3) under
``Epoch 3/10`` is at step ``(epoch - 1) x 100 + 100``; before any epoch line, at its batch.
``verbose=2`` prints one such line an epoch, with no bar: ``100/100 - 1s - loss: 0.1234
- accuracy: 0.9 - 1s/epoch - 10ms/step`` (Keras 2), ``100/100 - 1s - 10ms/step -
accuracy: 0.9 - loss: 0.1234`` (Keras 3). A ``LineFormat``: it keeps the epoch the last
head named. Under a head, a line also gives the epochs done (``epoch``, as the HF
Trainer logs it: 3.5 is half of the fourth), which places its step among the run's epochs
(a NaN at the fourth epoch is no first step, however few lines came before it).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import find_pairs

_EPOCH = re.compile(r"Epoch (\d+)/\d+")
_PROGRESS = re.compile(r"(\d+)/(\d+) (?:\[[=>.]*\]|━|- \d+m?s - )")


class KerasProgress:
    """Reads Keras's epoch heads and progress lines, keeping the epoch being trained."""

    __slots__ = ("_epoch",)

    def __init__(self) -> None:
        self._epoch: int | None = None  # the epoch being trained (1-based)

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        first = text[0]
        if first == "E" and text.startswith("Epoch "):
            found = _EPOCH.fullmatch(text)
            if found is None:
                return None
            self._epoch = int(found.group(1))
            return []
        if first.isdigit() and " - " in text:
            found = _PROGRESS.match(text)
            if found is None:
                return None
            pairs, _ = find_pairs(text[found.end() :])
            batch, per_epoch = int(found.group(1)), int(found.group(2))
            if self._epoch is None:
                return [Sample(name, value, batch) for name, value in pairs]
            step = (self._epoch - 1) * per_epoch + batch
            samples = [Sample(name, value, step) for name, value in pairs]
            if pairs and per_epoch:
                # The epochs done, as the HF Trainer logs them (3.5: half of the fourth).
                done = self._epoch - 1 + batch / per_epoch
                samples.append(Sample("epoch", done, step))
            return samples
        return None
