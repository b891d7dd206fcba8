"""detectron2's own word that the loss went non-finite, read as the loss at its iteration.

Its trainer checks the losses every step and stops with ``FloatingPointError: Loss became
infinite or NaN at iteration=4311!``, then prints ``loss_dict = {'loss_cls': nan, ...}``:
the loss was non-finite at that iteration, which the metrics it printed last (every 20
iterations) do not show. Read as a NaN ``loss`` at it (an infinite one says the same to
``nan_inf``). Stateless, one line each (``ParseFn``); its ``iter: N  total_loss: ...``
lines are the key-value reader's.
"""

from __future__ import annotations

import math
import re

from sentinel.model.records import Sample

_BECAME = re.compile(r"Loss became infinite or NaN at iteration=(\d+)")


def parse_detectron2(text: str) -> list[Sample] | None:
    """The non-finite loss of detectron2's ``FloatingPointError`` line; None for another."""
    if "became infinite or NaN" not in text:
        return None
    found = _BECAME.search(text)
    if found is None:
        return None
    return [Sample("loss", math.nan, int(found.group(1)))]
