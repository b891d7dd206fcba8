"""Keras / TF ``model.fit`` console lines: an ``Epoch 3/10`` line heads its progress lines.

``100/100 [====] - 1s 10ms/step - loss: 0.1234 - accuracy: 0.9`` (Keras 2) or
``100/100 ━━━━ 1s 10ms/step - accuracy: 0.9 - loss: 0.1234`` (Keras 3) under
``Epoch 3/10`` is at step ``(epoch - 1) x 100 + 100``; before any epoch line, at its batch.
``verbose=2`` prints one such line an epoch, with no bar: ``100/100 - 1s - loss: 0.1234
- accuracy: 0.9 - 1s/epoch - 10ms/step`` (Keras 2), ``100/100 - 1s - 10ms/step -
accuracy: 0.9 - loss: 0.1234`` (Keras 3); Keras 1's, ``3083s - loss: 1.7197 - acc: ...``,
is at the epochs done. A ``LineFormat``: it keeps the epoch the last
head named. Under a head, a line also gives the epochs done (``epoch``, as the HF
Trainer logs it: 3.5 is half of the fourth), which places its step among the run's epochs
(a NaN at the fourth epoch is no first step, however few lines came before it).

Keras 0.x heads its epochs ``Epoch 0``, counted from 0, and its bar counts samples
(``61878/61878 [====] - 5s - loss: 1.1788``). Where no head was seen (an excerpt, a log
with the heads cut), a line whose count went back, or that ends an epoch again, begins the
next epoch: its lines are read in order at the count since the first line, each epoch at
a step of its own (read at their count alone, every epoch's end was one step, and the run
one value).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import find_pairs

_EPOCH = re.compile(r"Epoch (\d+)(/\d+)?")
_PROGRESS = re.compile(r"(\d+)/(\d+) (?:\[[=>.]*\]|━|- \d+m?s - )")
#: Keras 1's ``verbose=2`` line an epoch, with no count: ``3083s - loss: 1.7197 - acc: ...``.
_SECONDS = re.compile(r"\d+s - (?=[a-z_]+: )")


class KerasProgress:
    """Reads Keras's epoch heads and progress lines, keeping the epoch being trained."""

    __slots__ = ("_batch", "_epoch", "_epochs_seen", "_values")

    def __init__(self) -> None:
        self._epoch: int | None = None  # the epoch being trained, counted from 0
        # With no head: the epochs begun since the first line, and the last line's count.
        self._epochs_seen = 0
        self._batch: int | None = None
        self._values: dict[str, float] = {}  # the last line's metrics

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        first = text[0]
        if first == "E" and text.startswith("Epoch "):
            found = _EPOCH.fullmatch(text)
            if found is None:
                return None
            # ``Epoch 3/10`` counts from 1 (Keras 1 and later), ``Epoch 0`` from 0 (0.x):
            # kept for the bars under it, and a bare one left to the other readers too.
            number = int(found.group(1))
            self._epoch = number - 1 if found.group(2) else number
            return [] if found.group(2) else None
        if first.isdigit() and " - " in text:
            found = _PROGRESS.match(text)
            if found is None:
                return self._epoch_line(text)
            pairs, _ = find_pairs(text[found.end() :])
            batch, per_epoch = int(found.group(1)), int(found.group(2))
            if self._epoch is None:
                return self._unheaded(pairs, batch, per_epoch)
            step = self._epoch * per_epoch + batch
            samples = [Sample(name, value, step) for name, value in pairs]
            if pairs and per_epoch:
                # The epochs done, as the HF Trainer logs them (3.5: half of the fourth).
                done = self._epoch + batch / per_epoch
                samples.append(Sample("epoch", done, step))
            return samples
        return None

    def _epoch_line(self, text: str) -> list[Sample] | None:
        """Keras 1's ``verbose=2`` line under its head (``Epoch 3/10``, then ``3083s - loss:
        ...``): at the epochs done, the only count it gives; None for another line."""
        found = _SECONDS.match(text)
        if found is None or self._epoch is None:
            return None
        pairs, _ = find_pairs(text[found.end() :])
        step = self._epoch + 1
        return [
            *(Sample(name, value, step) for name, value in pairs),
            Sample("epoch", float(step), step),
        ]

    def _unheaded(self, pairs: list[tuple[str, float]], batch: int, per_epoch: int) -> list[Sample]:
        """A progress line with no epoch head before it: at its count since the first. A
        count that went back begins the next epoch, and so does an epoch's end again with
        other values (with the same, it is the end redrawn with the validation's)."""
        last, shown = self._batch, dict(pairs)
        if last is not None and (
            batch < last or (batch == last == per_epoch and not self._same_as_last(shown))
        ):
            self._epochs_seen += 1
        self._batch, self._values = batch, shown
        step = self._epochs_seen * per_epoch + batch
        return [Sample(name, value, step) for name, value in pairs]

    def _same_as_last(self, shown: dict[str, float]) -> bool:
        """Whether every metric this line shares with the last has the value it had."""
        last = self._values
        shared = shown.keys() & last.keys()
        return bool(shared) and all(_same(shown[name], last[name]) for name in shared)


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # NaN redrawn is the same NaN
