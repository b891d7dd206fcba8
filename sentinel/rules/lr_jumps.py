"""The logged learning rate's last jump, which a rule's alert names for the diagnosis, and
what the learning rate before an incident says (``lr_evidence``: a jump, or a warmup).

A jump is a move of ``LR_JUMP`` x or more, and more than twice the move before it: a
warmup climbs by a steady factor, a rate raised by mistake jumps once.
"""

from __future__ import annotations

import math

from sentinel.model.incidents import Incident
from sentinel.rules.base import Recent
from sentinel.rules.series import finite_with_steps

#: A rise of the logged learning rate between two logged values that is a jump.
LR_JUMP = 3.0
#: A jump of at least this ratio to above this multiple of the highest rate logged before
#: it is no schedule's (a warmup climbs by less from one logged value to the next once
#: under way; a restart or a cycle goes back to a rate it had).
UNEXPLAINED_RATIO = 10.0
UNEXPLAINED = 2.0


def unexplained_jump(
    before: float,
    after: float,
    highest: float,
    *,
    factor: float = UNEXPLAINED_RATIO,
    above_seen: float = UNEXPLAINED,
) -> bool:
    """Whether a logged rate going from ``before`` to ``after`` is a jump no schedule explains:
    ``factor`` times or more the rate before it, and above ``above_seen`` times the highest
    rate the attempt logged before (``highest``). One test, for ``lr_jump`` and the others."""
    return after >= factor * before and after > above_seen * highest


class LrJumps:
    """The logged learning rate: its last (step, value), the ratio it last moved by, the
    highest it has been, and its last jump (step, before, after), the step of the rate
    logged before it (``changed_after``), and whether that jump went above anything the
    attempt had logged (``UNEXPLAINED``: no restart or cycle of a schedule goes back above
    its own peak)."""

    __slots__ = ("changed_after", "highest", "jump", "last", "ratio", "unexplained")

    def __init__(self) -> None:
        self.last: tuple[int | None, float] | None = None
        self.ratio = 1.0
        self.highest = 0.0
        self.jump: tuple[int | None, float, float] | None = None
        self.changed_after: int | None = None
        self.unexplained = False

    def reset(self) -> None:
        """A new attempt: nothing known of its rate."""
        self.last, self.ratio, self.jump, self.changed_after = None, 1.0, None, None
        self.highest, self.unexplained = 0.0, False

    def note(self, step: int | None, value: float) -> None:
        """One logged rate (not finite or <= 0: ignored)."""
        if not math.isfinite(value) or value <= 0:
            return
        last = self.last
        if last is not None:
            ratio = value / last[1]
            if ratio >= LR_JUMP and ratio > 2 * self.ratio:
                self.jump = (step, last[1], value)
                self.changed_after = last[0]
                self.unexplained = unexplained_jump(last[1], value, self.highest)
            self.ratio = ratio
        self.last = (step, value)
        self.highest = max(self.highest, value)

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
            self.highest = max(self.highest, max(known))
            return
        for step, value in pairs:
            self.note(step, value)

    def unexplained_within(self, first: int | None, onset: int | None) -> bool:
        """Whether the last jump came between ``first`` and ``onset`` (``within``) and went
        above anything logged before it."""
        return self.unexplained and self.within(first, onset) is not None

    def within(self, first: int | None, onset: int | None) -> list[float | int | None] | None:
        """The last jump as ``[step, before, after]`` when it came between ``first`` (the
        evidence's first step) and ``onset``, where either bound may be unknown; else None."""
        jump = self.jump
        if jump is None or jump[0] is None:
            return None
        if (first is not None and jump[0] < first) or (onset is not None and jump[0] > onset):
            return None
        return list(jump)


def lr_evidence(incident: Incident, recent: Recent) -> tuple[str, str] | None:
    """(what the logged learning rate did, advice): a jump between two logged values (the
    step where it changed), or a warmup still rising at the latest step; None when neither.

    A rule that saw the jump long before may say so itself (``details["lr_jump"]``:
    ``[step, before, after]``); else the recent ``lr`` samples tell.
    """
    jump = named_jump(incident, recent)
    if jump is not None:
        return jump_reading(*jump)
    values = _rates(incident, recent)
    if len(values) >= 2 and values[-1][1] > values[-2][1] * (1 + 1e-6):
        return (
            f"the learning rate was still warming up (rising, {values[-1][1]:.3g} at step"
            f" {values[-1][0]})",
            "lower the peak learning rate or lengthen the warmup; clip gradients at 1.0;"
            " use bf16 rather than fp16",
        )
    return None


def named_jump(
    incident: Incident, recent: Recent
) -> tuple[int | None, float, float, int | None] | None:
    """The jump of the logged rate ``lr_evidence`` names: (its step, the rate before, the
    rate after, the step of the rate logged before it: ``changed_after``, None where
    unknown); None when there is none."""
    for alert in incident.alerts:
        told = alert.details.get("lr_jump")
        if isinstance(told, (list, tuple)) and len(told) == 3:
            step, before, after = told
            changed = alert.details.get("changed_after")
            return step, float(before), float(after), changed if isinstance(changed, int) else None
    values = _rates(incident, recent)
    best: tuple[int | None, float, float, int | None] | None = None
    for index in range(1, len(values)):
        (step, after), (changed, before) = values[index], values[index - 1]
        ratio = after / before
        # Warmup climbs by a steady factor (2x, 1.5x...): a jump is far above the step before.
        prior = before / values[index - 2][1] if index >= 2 else 1.0
        if ratio >= LR_JUMP and ratio > 2 * prior and (best is None or ratio > best[2] / best[1]):
            best = (step, before, after, changed)
    return best


def _rates(incident: Incident, recent: Recent) -> list[tuple[int | None, float]]:
    """The recent logged rates up to the incident's latest step, finite and above 0."""
    steps = [alert.step for alert in incident.alerts if alert.step is not None]
    latest = max(steps) if steps else None
    return [
        (sample.step, sample.value)
        for sample in recent.get("lr", ())
        if math.isfinite(sample.value)
        and sample.value > 0
        and (latest is None or sample.step is None or sample.step <= latest)
    ]


def before_change(changed_after: int | None) -> str:
    """Where a rollback after a jump of the logged rate goes: before the last step logged
    at the old rate, whose checkpoint may already hold the new one."""
    if changed_after is None:
        return "the checkpoint saved before the rate changed"
    return (
        f"a checkpoint saved before step {changed_after}, the last logged at the old rate"
        " (one saved at that step may already hold the new one)"
    )


def jump_reading(
    step: int | None, before: float, after: float, changed_after: int | None = None
) -> tuple[str, str]:
    """(what the logged rate did, advice) for a jump ``named_jump`` found."""
    at = f" at step {step}" if step is not None else ""
    return (
        f"the logged learning rate jumped {after / before:.3g}x{at} (from {before:.3g} to"
        f" {after:.3g})",
        f"look at the learning-rate schedule{at}: a scheduler restarted or resumed with other"
        f" settings, a wrong multiplier or unit; roll back to {before_change(changed_after)}",
    )
