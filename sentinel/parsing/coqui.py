"""Coqui's trainer (Coqui TTS: VITS, Tacotron, GlowTTS...): its step header, as progress.

Its console logger prints a header a logged step, then one line a value, each beside its
running mean::

    --> STEP: 49/377 -- GLOBAL_STEP: 370050
      | > loss_disc: 2.40120  (2.51074)
      | > amp_scaler: 128.00000  (1477.33333)
      | > current_lr_0: 0.00018

(newer releases: ``--> TIME: 2023-... -- STEP: 49/377 -- GLOBAL_STEP: 370050``). The header
is read as progress at the global step (the trainer names its checkpoints by it,
``checkpoint_370050.pth``), so the value lines under it, which name no step, are read at
it; the key-value reader reads those lines (``amp_scaler`` is the ``loss_scale``,
``current_lr_0`` the ``lr``). Stateless, one line each (``ParseFn``).
"""

from __future__ import annotations

import re

from sentinel.model.records import PROGRESS, Sample

_HEADER = re.compile(r"-->.*?\bSTEP: \d+/\d+ -- GLOBAL_STEP: (\d+)")


def parse_coqui(text: str) -> list[Sample] | None:
    """The progress of Coqui's step header; None for another line."""
    if "GLOBAL_STEP: " not in text:
        return None
    found = _HEADER.search(text)
    if found is None:
        return None
    step = int(found.group(1))
    return [Sample(PROGRESS, float(step), step)]
