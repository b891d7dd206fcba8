"""mmengine (OpenMMLab)'s console line, read at the step it names.

``Epoch(train)  [1][ 240/735]  lr: 1.0000e-02  eta: 0:37:40 ... loss: 0.8937`` at step
``(epoch - 1) x 735 + 240``, ``Iter(train) [ 240/80000]`` at 240, MMCV 2.x's ``Epoch
[1][150/5808]`` too; a ``val``/``test`` line's metrics as ``eval_`` ones, at no step of
their own. Stateless, one line each (``ParseFn``).
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import find_pairs

_MMENGINE = re.compile(
    r"\b(?:Epoch\((?P<emode>train|val|test)\)\s*\[(?P<epoch>\d+)\]\s*\[\s*(?P<ebatch>\d+)\s*/\s*(?P<eper>\d+)\]"
    r"|Iter\((?P<imode>train|val|test)\)\s*\[\s*(?P<iter>\d+)\s*/\s*\d+\]"
    # MMCV / mmdet 2.x's training lines: ``Epoch [1][150/5808]\tlr: ..., loss: ...``.
    r"|Epoch\s+\[(?P<epoch2>\d+)\]\s*\[\s*(?P<ebatch2>\d+)\s*/\s*(?P<eper2>\d+)\])"
)


def parse_mmengine(text: str) -> list[Sample] | None:
    """Samples of an mmengine ``Epoch(train) [E][N/M]`` or ``Iter(train) [N/M]`` line."""
    if (
        "(train)" not in text
        and "(val)" not in text
        and "(test)" not in text
        and "Epoch [" not in text
    ):
        return None
    found = _MMENGINE.search(text)
    if found is None:
        return None
    mode = found.group("emode") or found.group("imode")
    step: int | None = None
    if found.group("epoch2") is not None:  # mmcv 2.x: a training line
        mode = "train"
        epoch, batch, per_epoch = (int(found.group(g)) for g in ("epoch2", "ebatch2", "eper2"))
        step = max(epoch - 1, 0) * per_epoch + batch
    elif mode == "train":
        if found.group("iter") is not None:
            step = int(found.group("iter"))
        else:
            epoch, batch, per_epoch = (int(found.group(g)) for g in ("epoch", "ebatch", "eper"))
            step = max(epoch - 1, 0) * per_epoch + batch
    pairs, _ = find_pairs(text[found.end() :])
    samples: list[Sample] = []
    for name, value in pairs:
        if mode != "train" and not name.startswith("eval"):
            name = "eval_loss" if name == "loss" else f"eval_{name}"
        samples.append(Sample(name, value, step))
    return samples
