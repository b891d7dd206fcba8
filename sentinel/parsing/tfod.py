"""The TensorFlow Object Detection API's step line (``model_lib_v2.py``), as progress.

``I0409 23:03:12.869635 140410452137792 model_lib_v2.py:705] Step 4100 per-step time
0.436s``, then its losses as a dict that ``pprint`` spreads over lines, which names no step
(``LineParser`` reads such a dict at its closing line). The step line is read as progress
at its step, so the dict after it is read there. Stateless, one line each (``ParseFn``).
"""

from __future__ import annotations

import re

from sentinel.model.records import PROGRESS, Sample

_STEP = re.compile(r"\bStep (\d+) per-step time ")


def parse_tfod(text: str) -> list[Sample] | None:
    """The progress of the API's step line; None for another line."""
    if "per-step time" not in text:
        return None
    found = _STEP.search(text)
    if found is None:
        return None
    step = int(found.group(1))
    return [Sample(PROGRESS, float(step), step)]
