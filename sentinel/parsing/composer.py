"""Composer's lines: its ``FileLogger`` metric line and its console's heads.

- ``[metric][batch=16]: loss/train/total: 2.3011``: stateless, one line each
  (``parse_composer_metric``, a ``ParseFn``);
- the console: ``[epoch=1][batch=16/32]:`` (or ``[batch=16/100]:``) heads the
  ``Train loss/train/total: 2.3011`` lines under it, at step ``(epoch - 1) x 32 + 16``
  (``ComposerConsole``, a ``LineFormat``: it keeps the step its last head named).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float, normalise_name

_COMPOSER_METRIC = re.compile(r"^\[metric\]\[batch=(\d+)\]:\s*(\S+?):\s*(\S+)\s*$")
_CONSOLE_HEAD = re.compile(
    r"(?:\[epoch=(\d+)\])?\[(?:batch|sample|token|iteration)=(\d+)(?:/(\d+))?\]:?"
)
_CONSOLE_LINE = re.compile(r"(?:Train|Eval) (\S+?): (\S+)")


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


class ComposerConsole:
    """Reads Composer's console heads and the metric lines under them."""

    __slots__ = ("_step",)

    def __init__(self) -> None:
        self._step: int | None = None  # the step the last head named

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line; None for a line in another format."""
        if text[0] == "[":
            found = _CONSOLE_HEAD.fullmatch(text)
            if found is None:
                return None
            epoch, count, per_epoch = found.groups()
            step = int(count)
            if epoch is not None and per_epoch is not None:
                step += (int(epoch) - 1) * int(per_epoch)
            self._step = step
            return []
        if self._step is not None and text.startswith(("Train ", "Eval ")):
            found = _CONSOLE_LINE.fullmatch(text)
            if found is None:
                return None
            value = as_float(found.group(2))
            if value is None:
                return []
            return [Sample(composer_name(found.group(1)), value, self._step)]
        return None
