"""Formats whose step, or whose names, come from an earlier line: read with a little state.

``Formats.parse`` is tried on each human-written line before the generic ``keyvalue``
reader; it returns None for a line in none of these formats. Besides the frameworks'
own lines (``registry.FRAMEWORK_LINES``: a module each), it reads those that need an
earlier line:

- Keras / TF ``model.fit``: ``Epoch 3/10`` starts an epoch; its progress lines
  ``100/100 [====] - 1s 10ms/step - loss: 0.1234 - accuracy: 0.9`` (Keras 2) or
  ``100/100 ━━━━ 1s 10ms/step - accuracy: 0.9 - loss: 0.1234`` (Keras 3) are at step
  ``(epoch - 1) x 100 + 100``;
- Composer's console: ``[epoch=1][batch=16/32]:`` (or ``[batch=16/100]:``) heads the
  ``Train loss/train/total: 2.3011`` lines under it, at step ``(epoch - 1) x 32 + 16``;
- a metrics CSV with a header row, whatever the file is called and however its
  cells are padded (Keras ``CSVLogger``'s ``training.log``, Ultralytics' ``results.csv``):
  a header names at least two columns, one a known metric or step; the rows under
  it that hold as many numbers are read, at the step (else the epoch) column's value.
  A loss logged only in parts (Ultralytics' ``train/box_loss``, ``train/cls_loss``...,
  and ``val/box_loss``...) is also read whole, as the trainer sums it: ``loss`` and
  ``eval_loss``, beside each part; ``metrics/mAP50(B)`` and the like stay metrics of
  their own, ``lr/pg0`` is the learning rate;
- a line with terminal colours (torchtitan's ``step:  1  loss:  8.1940 ...``) is read
  without its escape sequences.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.composer import composer_name
from sentinel.parsing.keyvalue import KNOWN_KEYS, find_pairs, parse_keyvalue
from sentinel.parsing.registry import FRAMEWORK_LINES
from sentinel.parsing.values import RECORD_STEP_KEYS, as_float, normalise_name

_KERAS_EPOCH = re.compile(r"Epoch (\d+)/\d+")
_KERAS_PROGRESS = re.compile(r"(\d+)/(\d+) (?:\[[=>.]*\]|━)")
_COMPOSER_HEAD = re.compile(
    r"(?:\[epoch=(\d+)\])?\[(?:batch|sample|token|iteration)=(\d+)(?:/(\d+))?\]:?"
)
_COMPOSER_LINE = re.compile(r"(?:Train|Eval) (\S+?): (\S+)")
_HEADER_CELL = re.compile(r"[A-Za-z_][\w/.()\-]*")
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_STEP_COLUMNS = frozenset(RECORD_STEP_KEYS)
_FRAMEWORK_PARSERS = tuple(FRAMEWORK_LINES.values())


class Formats:
    """Reads the lines of the formats in this module's docstring, keeping what they need."""

    __slots__ = ("_columns", "_composer_step", "_epoch", "_step_column", "_totals")

    def __init__(self) -> None:
        self._epoch: int | None = None  # Keras: the epoch being trained (1-based)
        self._composer_step: int | None = None  # Composer: the step its last head named
        self._columns: tuple[str, ...] | None = None  # CSV: the metric name of each column
        self._step_column: int | None = None  # CSV: the step (or epoch) column
        # CSV: a loss logged only in parts: its name and the columns it is the sum of.
        self._totals: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line in one of these formats; None for another line."""
        if "\x1b" in text:
            return parse_keyvalue(_ESCAPE.sub("", text))
        for parse in _FRAMEWORK_PARSERS:
            found = parse(text)
            if found is not None:
                return found
        if "," in text and (self._columns is not None or text[0].isalpha()):
            found = self._csv(text)
            if found is not None:
                return found
        first = text[0]
        if first == "E" and text.startswith("Epoch "):
            return self._keras_epoch(text)
        if first == "[":
            return self._composer_head(text)
        if self._composer_step is not None and text.startswith(("Train ", "Eval ")):
            return self._composer_line(text)
        if first.isdigit() and " - " in text:
            return self._keras_progress(text)
        return None

    def _keras_epoch(self, text: str) -> list[Sample] | None:
        found = _KERAS_EPOCH.fullmatch(text)
        if found is None:
            return None
        self._epoch = int(found.group(1))
        return []

    def _keras_progress(self, text: str) -> list[Sample] | None:
        found = _KERAS_PROGRESS.match(text)
        if found is None:
            return None
        pairs, _ = find_pairs(text[found.end() :])
        batch, per_epoch = int(found.group(1)), int(found.group(2))
        step = batch if self._epoch is None else (self._epoch - 1) * per_epoch + batch
        return [Sample(name, value, step) for name, value in pairs]

    def _composer_head(self, text: str) -> list[Sample] | None:
        found = _COMPOSER_HEAD.fullmatch(text)
        if found is None:
            return None
        epoch, count, per_epoch = found.groups()
        step = int(count)
        if epoch is not None and per_epoch is not None:
            step += (int(epoch) - 1) * int(per_epoch)
        self._composer_step = step
        return []

    def _composer_line(self, text: str) -> list[Sample] | None:
        found = _COMPOSER_LINE.fullmatch(text)
        if found is None:
            return None
        value = as_float(found.group(2))
        if value is None:
            return []
        return [Sample(composer_name(found.group(1)), value, self._composer_step)]

    def _csv(self, text: str) -> list[Sample] | None:
        cells = [cell.strip() for cell in text.split(",")]
        if text[0].isalpha():
            return self._csv_header(cells)
        columns = self._columns
        if columns is None or len(cells) != len(columns):
            return None
        values = [as_float(cell) if cell else None for cell in cells]
        if any(value is None for value, cell in zip(values, cells, strict=True) if cell):
            return None
        step: int | None = None
        if self._step_column is not None:
            stamp = values[self._step_column]
            if stamp is not None and stamp.is_integer():
                step = int(stamp)
        samples = [
            Sample(name, value, step)
            for index, (name, value) in enumerate(zip(columns, values, strict=True))
            if value is not None and index != self._step_column
        ]
        for name, parts in self._totals:
            total = [values[index] for index in parts]
            if None not in total:
                samples.append(Sample(name, sum(total), step))  # type: ignore[arg-type]
        return samples

    def _csv_header(self, cells: list[str]) -> list[Sample] | None:
        if len(cells) < 2 or not all(_HEADER_CELL.fullmatch(cell) for cell in cells):
            return None
        lowered = [cell.lower() for cell in cells]
        if not any(cell in KNOWN_KEYS or normalise_name(cell) in KNOWN_KEYS for cell in lowered):
            return None
        self._columns = tuple(normalise_name(cell) for cell in cells)
        steps = [index for index, cell in enumerate(lowered) if cell in _STEP_COLUMNS]
        epochs = [index for index, cell in enumerate(lowered) if cell == "epoch"]
        found = steps or epochs
        self._step_column = found[0] if found else None
        self._totals = tuple(
            (total, parts)
            for total, prefix in (("loss", "train/"), ("eval_loss", "val/"))
            if total not in self._columns
            for parts in [_loss_parts(lowered, prefix)]
            if len(parts) > 1
        )
        return []


def _loss_parts(lowered: list[str], prefix: str) -> tuple[int, ...]:
    """The columns of a loss logged in parts under ``prefix``: ``train/box_loss``..."""
    return tuple(
        index
        for index, cell in enumerate(lowered)
        if cell.startswith(prefix) and cell.endswith("_loss")
    )
