"""llm.c's log file (``-o``, its ``main.log``), read at the step each line names.

``s:120 trl:3.2714 lr:0.000600 norm:0.89`` (a training step: its loss, learning rate and
gradient norm), ``s:250 tel:3.3019`` (the validation loss) and ``s:250 eval:0.2913``
(HellaSwag's accuracy): Karpathy's C/CUDA trainer, and the records that copy it. Read as
plain pairs, its names were none known and its step none. Stateless, one line each
(``ParseFn``).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float

_LINE = re.compile(r"s:(\d+)((?: [a-z]+:\S+)+)")
_NAMES = {"trl": "loss", "tel": "eval_loss", "lr": "lr", "norm": "grad_norm", "eval": "eval_acc"}


def parse_llmc(text: str) -> list[Sample] | None:
    """Samples of an llm.c ``s:N name:value ...`` line; None for another line."""
    if text[:2] != "s:":
        return None
    found = _LINE.fullmatch(text)
    if found is None:
        return None
    step = int(found.group(1))
    samples: list[Sample] = []
    for pair in found.group(2).split():
        key, _, value = pair.partition(":")
        name = _NAMES.get(key)
        number = as_float(value)
        if name is None or number is None:
            return None  # not llm.c's: each name is one it writes
        samples.append(Sample(name, number, step))
    return samples
