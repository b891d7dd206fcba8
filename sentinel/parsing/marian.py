"""Marian NMT's training log: its line per ``--disp-freq`` and its validation lines.

``[2021-05-26 23:22:42] Ep. 1 : Up. 500 : Sen. 15,203 : Cost 6.01253986 * 414,436 after
414,436 : Time 609.91s : 679.50 words/s : gNorm 1.2345 : L.r. 3.0000e-04`` (older
releases: ``Cost 7.95987511 : Time ...``, no label count; ``gNorm`` and ``L.r.`` when
enabled) is read at its ``Up.``, the update count, which Marian names its checkpoints by
(``model.iter1000.npz``): ``Cost`` is the loss, ``gNorm`` the grad-norm, ``L.r.`` the
learning rate, words/s the throughput (``tokens_per_sec``). ``[valid] Ep. 1 : Up. 5000 :
ce-mean-words : 5.21277 : new best`` is an evaluation: ``ce-mean-words`` (the
cross-entropy Marian trains on) is ``eval_loss``, ``perplexity`` ``eval_ppl``, any other
metric ``eval_`` and its name (``eval_bleu``). Stateless, one line each.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.values import as_float

_TRAIN = re.compile(
    r"\bEp\. \d+ : Up\. (\d+) : Sen\. [\d,]+ : Cost (\S+)[^:]*: Time [\d.]+s"
    r" : ([\d.]+) words/s(.*)$"
)
_EXTRA = re.compile(r" : (gNorm|L\.r\.) (\S+)")
_EXTRA_NAMES = {"gNorm": "grad_norm", "L.r.": "lr"}
_VALID = re.compile(r"\[valid\] Ep\. \d+ : Up\. (\d+) : ([\w-]+) : (\S+)")
_VALID_NAMES = {"ce-mean-words": "eval_loss", "ce-mean": "eval_loss", "perplexity": "eval_ppl"}


def parse_marian(text: str) -> list[Sample] | None:
    """Samples of a Marian training or validation line; None for another line."""
    if "Ep. " not in text or " : Up. " not in text:
        return None
    valid = _VALID.search(text)
    if valid is not None:
        step, name, value = int(valid.group(1)), valid.group(2), as_float(valid.group(3))
        if value is None:
            return []
        metric = _VALID_NAMES.get(name) or "eval_" + name.replace("-", "_")
        return [Sample(metric, value, step)]
    found = _TRAIN.search(text)
    if found is None:
        return None
    step = int(found.group(1))
    samples = []
    for metric, written in (("loss", found.group(2)), ("tokens_per_sec", found.group(3))):
        number = as_float(written)
        if number is not None:
            samples.append(Sample(metric, number, step))
    for extra in _EXTRA.finditer(found.group(4)):
        number = as_float(extra.group(2))
        if number is not None:
            samples.append(Sample(_EXTRA_NAMES[extra.group(1)], number, step))
    return samples
