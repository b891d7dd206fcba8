"""Composer's ``FileLogger`` metric line: ``[metric][batch=16]: loss/train/total: 2.3011``.

Stateless, one line each (``ParseFn``). Composer's console heads (``[epoch=1][batch=16/32]:``)
need the line before them: ``sentinel.parsing.formats`` reads those.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float, normalise_name

_COMPOSER_METRIC = re.compile(r"^\[metric\]\[batch=(\d+)\]:\s*(\S+?):\s*(\S+)\s*$")


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
