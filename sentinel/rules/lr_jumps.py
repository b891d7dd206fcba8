"""The logged learning rate's last jump, which a rule's alert names for the diagnosis.

A jump is a move of ``LR_JUMP`` x or more, and more than twice the move before it: a
warmup climbs by a steady factor, a rate raised by mistake jumps once.
"""

from __future__ import annotations

import math

from sentinel.evidence.diagnosis_nan import LR_JUMP
from sentinel.rules.series import finite_with_steps


class LrJumps:
    """The logged learning rate: its last (step, value), the ratio it last moved by, and
    its last jump (step, before, after)."""

    __slots__ = ("jump", "last", "ratio")

    def __init__(self) -> None:
        self.last: tuple[int | None, float] | None = None
        self.ratio = 1.0
        self.jump: tuple[int | None, float, float] | None = None

    def reset(self) -> None:
        """A new attempt: nothing known of its rate."""
        self.last, self.ratio, self.jump = None, 1.0, None

    def note(self, step: int | None, value: float) -> None:
        """One logged rate (not finite or <= 0: ignored)."""
        if not math.isfinite(value) or value <= 0:
            return
        last = self.last
        if last is not None:
            ratio = value / last[1]
            if ratio >= LR_JUMP and ratio > 2 * self.ratio:
                self.jump = (step, last[1], value)
            self.ratio = ratio
        self.last = (step, value)

    def note_all(self, column: list[float] | None, steps: list[int]) -> None:
        """``note`` for a block's rates: the same state, and where no two values are
        ``LR_JUMP`` apart (the usual block), without a Python step per value."""
        if column is None:
            return
        values, at = finite_with_steps(column, steps)
        pairs = [(step, value) for step, value in zip(at, values, strict=True) if value > 0]
        if not pairs:
            return
        known = [value for _, value in pairs] + ([self.last[1]] if self.last else [])
        if max(known) < LR_JUMP * min(known):
            if len(pairs) >= 2:
                self.ratio = pairs[-1][1] / pairs[-2][1]
            elif self.last is not None:
                self.ratio = pairs[-1][1] / self.last[1]
            self.last = pairs[-1]
            return
        for step, value in pairs:
            self.note(step, value)

    def within(self, first: int | None, onset: int | None) -> list[float | int | None] | None:
        """The last jump as ``[step, before, after]`` when it came between ``first`` (the
        evidence's first step) and ``onset``, where either bound may be unknown; else None."""
        jump = self.jump
        if jump is None or jump[0] is None:
            return None
        if (first is not None and jump[0] < first) or (onset is not None and jump[0] > onset):
            return None
        return list(jump)
