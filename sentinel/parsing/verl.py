"""verl's console line (its ``LocalLogger``, ``trainer.logger=['console']``): one a step.

``step:12 - actor/pg_loss:0.0123 - actor/entropy:0.456 - critic/score/mean:0.5 - ...``:
each number its ``pprint.pformat`` (``nan``, ``1.2e-05``; ``np.float64(0.5)`` for numpy's
scalars under numpy 2), after a logger's own head where one prints it. Read at its
``step:``, the trainer's global step, which verl names its checkpoints by
(``global_step_12``). Names are normalised as everywhere (the SFT trainer's
``train/loss`` is ``loss``, ``train/lr`` is ``lr``); a PPO or GRPO run's
(``actor/pg_loss``, ``actor/entropy``, ``actor/grad_norm``, ``critic/score/mean``) stay as
written: an RL objective moves with its rewards, so the rules that judge a training
loss's shape leave it alone, while a non-finite ``actor/pg_loss`` stops the job
(``nan_inf``: a loss by its name), as do the objective's values turning non-finite
together.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float, normalise_name

_STEP = re.compile(r"(?:^|\s)step:(\d+) - ")
#: numpy 2's repr of a scalar: ``np.float64(0.5)``.
_NUMPY = re.compile(r"np\.\w+\((.*)\)")


def parse_verl(text: str) -> list[Sample] | None:
    """Samples of one stripped line in verl's console form; None for another line."""
    if "step:" not in text or " - " not in text:
        return None
    found = _STEP.search(text)
    if found is None:
        return None
    step = int(found.group(1))
    samples: list[Sample] = []
    parts = text[found.end() :].split(" - ")
    for index, part in enumerate(parts):
        key, colon, value = part.strip().rpartition(":")
        if not colon or not key:
            if index == len(parts) - 1 and len(samples) >= 2:
                break  # a line cut short (a full disk, a paste): its pairs before still count
            return None  # not verl's: every part is a key and its number
        wrapped = _NUMPY.fullmatch(value)
        number = as_float(wrapped.group(1) if wrapped else value)
        if number is not None:
            samples.append(Sample(normalise_name(key), number, step))
    return samples
