"""What every job here shares: the step its NaN starts at, its pace, and its step log."""

from __future__ import annotations

import os
import time

#: The loss (or, for Keras, the inputs) turn NaN from this global step on.
NAN_FROM = 60
#: Each step lasts at least this long: a real model's pace, not a linear layer racing.
STEP_S = float(os.environ.get("STEP_S", "0.02"))

_steps = open("steps.log", "a", buffering=1)  # noqa: SIM115 (open for the job's whole life)


def at_step(step: int) -> None:
    """Record that the job starts ``step`` now (``measure.py`` reads it), then train."""
    _steps.write(f"{step} {time.time():.4f}\n")
    time.sleep(STEP_S)
