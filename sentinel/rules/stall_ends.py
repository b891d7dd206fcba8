"""How a silence nobody watched ended: the run starting again, the run's own pace, or a stall.

Replay's clock is the data's own: it jumps from one line's time to the next, so a
silence in a log is only seen once it is over, and whether the job was alive and
silent through it (a stall) cannot be watched. What ends it tells: a log the job was
stopped in and re-run into later (an appended log) starts again with a banner or a
step that goes back; a run that logs every hundred steps comes back with a hundred
steps done. Neither is a stall. ``stall`` holds its judgment of such a silence until
the next line says which it was.
"""

from __future__ import annotations

import re

#: Lines a training script prints as it starts (or starts again): a resume, a checkpoint
#: loaded, the training loop's banner (HF Trainer's ``***** Running training *****``).
_STARTS = re.compile(
    r"\bresum(?:e|es|ed|ing)\b"
    r"|\b(?:load|restor)\w*\b[^\n]{0,40}?\bcheckpoint"
    r"|\bcheckpoint\b[^\n]{0,40}?\b(?:loaded|restored)\b"
    r"|\btraining\]?\s*[:-]?\s*start"
    r"|\bstart(?:ing)?\s+(?:the\s+)?training\b"
    r"|\*\s*running training\s*\*",
    re.IGNORECASE,
)


def starts_a_run(text: str) -> bool:
    """Whether an output line says the run is starting (again): a banner, a resume."""
    return _STARTS.search(text) is not None


def steps_kept_pace(silent_s: float, steps_done: int, soft_s: float) -> bool:
    """Whether a silence that ended with ``steps_done`` new steps is the run's cadence: on
    average each of those steps took under the soft timeout, so the job stepped all along
    and only logs rarely (fairseq's every 100 updates), whatever the silence's length."""
    return steps_done > 0 and silent_s / steps_done < soft_s
