"""Dreamer's (danijar's) console line, read at the step it opens with.

``[6000] expl_amount 0.3 / model_grad_norm 4468751873343488.0 / ... / model_loss 152175.0
/ value_loss 6.3 / actor_loss -14.7 / fps 1.0`` (Dreamer, DreamerV2's ``logger.write``):
the environment step in brackets, then ``name value`` pairs apart by `` / ``. Names as
written (``model_loss``, ``actor_loss``: a loss each, by its name; ``model_grad_norm``);
read as plain pairs, the line named no step and kept its losses only. Stateless, one line
each (``ParseFn``).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float, normalise_name

_HEAD = re.compile(r"\[(\d+)\]\s+(?=[A-Za-z_][\w/.\-]* \S+ / )")
_PAIR = re.compile(r"([A-Za-z_][\w/.\-]*) (\S+)")


def parse_dreamer(text: str) -> list[Sample] | None:
    """Samples of a ``[step] name value / name value`` line; None for another line."""
    if text[:1] != "[" or " / " not in text:
        return None
    found = _HEAD.match(text)
    if found is None:
        return None
    step = int(found.group(1))
    samples: list[Sample] = []
    for part in text[found.end() :].split(" / "):
        pair = _PAIR.fullmatch(part.strip())
        if pair is None:
            return None  # not Dreamer's: every part is a name and its value
        value = as_float(pair.group(2))
        if value is not None:
            samples.append(Sample(normalise_name(pair.group(1)), value, step))
    return samples
