"""The records that flow through the pipeline: lines, samples, alerts.

Every stage speaks these types and nothing else, so a stage can be tested
with plain values and replaced without touching its neighbours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple


class Severity(StrEnum):
    """How bad an alert is; ordered, so ``Severity.WARNING < Severity.CRITICAL``."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank < other.rank

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank <= other.rank

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank > other.rank

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank >= other.rank


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class Line(NamedTuple):
    """One line of a job's output or of a tailed file, without its terminator.

    ``time`` is when sentinel read it (epoch seconds); ``source`` names where it
    came from: a file path, ``stdout`` or ``stderr``.

    A named tuple, like ``Sample``: immutable, and made for every line read.
    """

    source: str
    text: str
    time: float


#: When lines read together were written at the earliest: ``(index, since)`` pairs, in
#: order, each saying that the line at ``index`` and those after it, up to the next pair's,
#: were not written before ``since`` (epoch seconds): the reader's look before the one that
#: first saw their bytes. Lines before the first pair have no such bound. A reader gathers
#: output for a window and hands it on at once (one turn of the engine a window), but a
#: rollback that places step-less saves by time needs each line's bound, not the window's.
#: Dropping lines from a batch keeps its marks true (a line moves to an earlier index,
#: whose bound is earlier); adding lines would not.
Marks = tuple[tuple[int, float], ...]


class Sample(NamedTuple):
    """One metric value: ``loss`` was 2.31 at step 120.

    ``step`` is None when the line carried no step (the engine fills it in from
    the last progress it saw); ``time`` is the data's own timestamp in epoch
    seconds, or None when the line had none.

    A named tuple rather than a frozen dataclass: just as immutable, and about
    four times cheaper to make, which counts when every line of a metrics file
    makes several (``bench/replay.py``). A changed copy is ``sample._replace(step=5)``.

    ``rank`` is the distributed rank whose line it came from, when the line says so
    (``[rank1]:``, ``[default1]:``, ``1: ``; ``sentinel.parsing.ranks``), else None. Fast
    paths may make a sample as a plain 4-tuple (``tuple.__new__``): such a sample has no
    rank, so code that may meet one reads ``sample[:4]``, and the rank as
    ``sample[4] if len(sample) > 4 else None``.
    """

    name: str
    value: float
    step: int | None = None
    time: float | None = None
    rank: int | None = None


#: Sample name a parser uses to report progress without a metric (a tqdm bar's "120/1000").
PROGRESS = "step"


def json_number(value: float | None) -> float | str | None:
    """A float as strict JSON allows it: NaN and infinities become "nan", "inf", "-inf"."""
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


#: The ``source`` of sentinel's own alerts (what it could not do, its state dir), not a log's.
SENTINEL_SOURCE = "sentinel"


@dataclass(frozen=True, slots=True)
class Alert:
    """What a detector reports. ``to_json`` is the public alert schema (docs/outputs.md).

    ``onset_step`` is the first step of the evidence (where rollback must go
    back before); ``resolves`` marks the all-clear of an earlier alert of the
    same rule. Neither is part of the JSON schema.
    """

    rule: str
    severity: Severity
    message: str
    time: float
    source: str = ""
    step: int | None = None
    metric: str | None = None
    value: float | None = None
    onset_step: int | None = None
    resolves: bool = False
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The public schema; an alert that opened or escalated an incident adds ``diagnosis``,
        one decided live ``decided_at`` (when the decision was made)."""
        out = {
            "rule": self.rule,
            "severity": str(self.severity),
            "step": self.step,
            "metric": self.metric,
            "value": json_number(self.value),
            "message": self.message,
            "time": self.time,
            "source": self.source,
        }
        diagnosis = self.details.get("diagnosis")
        if diagnosis is not None:
            out["diagnosis"] = diagnosis
        decided_at = self.details.get("decided_at")
        if decided_at is not None:  # live: ``time`` is when the evidence was read
            out["decided_at"] = decided_at
        return out


@dataclass(slots=True, eq=False)
class Block:
    """Lines of one log that share one JSON schema, as columns: replay's unit of work.

    The engine shows a block to every rule it concerns (``BaseDetector.can_absorb``),
    and when each says the block is uneventful for it, each takes it in one call
    (``absorb``) instead of line by line. Line ``i`` holds one sample per metric in
    ``names`` (in that order): ``Sample(name, columns[name][i], steps[i], times[i])``.

    ``clock[i]`` is the ``now`` the rules would be handed with line ``i``; it never goes
    back (a line's time behind the clock leaves the clock where it was). When
    ``ticks`` is true (replay on the data's own clock), ``tick(clock[i])`` would be
    called before line ``i`` whenever ``clock[i]`` is past the clock before it
    (``start_clock`` before line 0). ``output`` says whether rules that watch output
    would see the lines (``texts``).

    A block is read-only to the rules: its lists may be shared (``clock`` is often
    ``times`` itself).

    A block of HF Trainer output also carries the progress bars read among its lines
    (``progress``): what a rule that ``sees_progress`` is shown besides the lines. Such a
    block is replay's before the data's first timestamp, where everything is read at one
    moment: no ``times``, no ``ticks``, no ``output``, and ``clock`` is ``progress_at`` on
    every line. It may hold bars and no line at all (``names`` empty).
    """

    source: str
    #: The lines as read, for the rules that watch output.
    texts: list[str]
    #: The metric names of every line, in the line's order; never ``PROGRESS``.
    names: tuple[str, ...]
    #: Per metric: its value on each line (floats; NaN and infinities included).
    columns: dict[str, list[float]]
    #: Every line's step (a block has no step-less line).
    steps: list[int]
    #: Every line's own timestamp, or None when the lines carry none.
    times: list[float] | None
    clock: list[float]
    start_clock: float | None
    ticks: bool
    output: bool
    #: Every step shown to a rule that sees progress, in the order read: each progress
    #: bar's step that passed every step before it, and each line's step. None: the
    #: lines alone (``steps``), as in every block of JSON lines.
    progress: list[int] | None = None
    #: The moment a block with ``progress`` was read at (its lines' and its bars').
    progress_at: float = 0.0
    _step_range: tuple[int, int] | None = field(default=None, init=False, repr=False)

    def __len__(self) -> int:
        return len(self.steps)

    def step_range(self) -> tuple[int, int]:
        """The lowest and the highest step of the lines (worked out once: several rules and
        the engine ask); a block with no line has none."""
        if self._step_range is None:
            self._step_range = (min(self.steps), max(self.steps))
        return self._step_range
