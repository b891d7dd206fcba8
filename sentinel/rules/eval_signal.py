"""The eval loss as a second signal: whether it rose at an evaluation since an episode of
the train loss began.

A critical needs more than one noisy signal (issue 22.4): a persistent train-loss spike
is acted on when something agrees, the grad-norm spiking with it or the eval loss rising
with it. A spike that hurts the model shows at the next evaluation; one the eval loss
shrugs off (a few hard batches, a logging artefact) stays a warning.

An evaluation has risen when it is above the last one before the episode's onset by more
than ``RISE`` of it and by more than any rise between two evaluations before the onset
(the eval set's own wobble). Evaluations are placed by their step: an episode or an
evaluation with no step is never corroborated this way.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import pairwise

from sentinel.rules.series import finite_with_steps

#: The eval metric read (canonical name).
EVAL_METRIC = "eval_loss"
#: Evaluations kept: those before an episode are its reference and its wobble.
KEPT = 32
#: An evaluation this fraction above the one before the onset may have risen.
RISE = 0.05


class EvalSignal:
    """The latest evaluations of the attempt, as (step, value), finite only."""

    __slots__ = ("evals",)

    def __init__(self) -> None:
        self.evals: deque[tuple[int, float]] = deque(maxlen=KEPT)

    def reset(self) -> None:
        """A new attempt: no evaluation yet."""
        self.evals.clear()

    def observe(self, step: int | None, value: float) -> None:
        """One evaluation (with no step, or not finite: not kept)."""
        if step is not None and math.isfinite(value):
            self.evals.append((step, value))

    def extend(self, column: list[float] | None, steps: list[int]) -> None:
        """``observe`` each evaluation of a block's column, in order."""
        if column is not None:
            values, at = finite_with_steps(column, steps)
            self.evals.extend(zip(at, values, strict=True))

    def rose_since(self, onset_step: int | None) -> str | None:
        """The evidence that the eval loss rose at an evaluation from ``onset_step`` on,
        or None: no evaluation on both sides of the onset, or none risen."""
        if onset_step is None:
            return None
        before = [value for step, value in self.evals if step < onset_step]
        since = [(step, value) for step, value in self.evals if step >= onset_step]
        if not before or not since or before[-1] <= 0:
            return None
        reference = before[-1]
        step, highest = max(since, key=lambda evaluation: evaluation[1])
        wobble = max((later - earlier for earlier, later in pairwise(before)), default=0.0)
        if highest <= reference * (1 + RISE) or highest - reference <= wobble:
            return None
        return (
            f"and {EVAL_METRIC} rose with it ({reference:.4g} before the onset, {highest:.4g}"
            f" at step {step})"
        )
