"""What the sources' and the stop's threads hand the supervisor's loop: one class an event.

Each is put on the loop's inbox (``sentinel.supervisor.inbox``) from the thread that saw
it and handled on the loop's thread (``sentinel.supervisor.event_loop``), in arrival order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sentinel.model.incidents import Incident
from sentinel.model.records import Marks, Sample
from sentinel.store import run_verdict

if TYPE_CHECKING:
    from sentinel.evidence.capture import Evidence
    from sentinel.process.signal_tree import TreeStop


@dataclass
class Stop:
    """A stop sentinel decided on: why, and whether a rollback (and restart) follows."""

    incident: Incident | None
    restart: bool
    started_at: float = field(default_factory=time.time)
    #: Another node's verdict for the run, which this stop carries out.
    joined: run_verdict.RunRecord | None = None


@dataclass(frozen=True, slots=True)
class OutputLines:
    """Lines of output read from ``source`` (the job's stdout or stderr, a followed file)."""

    source: str
    lines: list[str]
    read_at: float
    #: When the lines were written at the earliest (``Marks``; none: by ``read_at``'s window).
    marks: Marks = ()


@dataclass(frozen=True, slots=True)
class Readings:
    """The machine's samples (GPUs, the job's process tree), by source."""

    readings: dict[str, list[Sample]]
    read_at: float


@dataclass(frozen=True, slots=True)
class TrainerStateRead:
    """The text of a ``trainer_state.json`` the job saved."""

    source: str
    text: str
    read_at: float


@dataclass(frozen=True, slots=True)
class JobExited:
    """An attempt of the job ended; ``status`` None when not knowable (one started elsewhere)."""

    attempt: int
    status: int | None
    #: Handed on again once the followed logs had time to be read to their end.
    settled: bool = False


@dataclass(frozen=True, slots=True)
class SignalReceived:
    """A signal to sentinel itself (SIGTERM, SIGINT, SIGHUP)."""

    signum: int


@dataclass(frozen=True, slots=True)
class StopDone:
    """The stop of the job's tree ended: who exited on the signal, who needed SIGKILL."""

    stop: Stop | None
    result: TreeStop


@dataclass(frozen=True, slots=True)
class EvidenceTaken:
    """What the live job was doing, taken before the stop's first signal."""

    stop: Stop | None
    evidence: Evidence


Event = (
    OutputLines
    | Readings
    | TrainerStateRead
    | JobExited
    | SignalReceived
    | StopDone
    | EvidenceTaken
)
#: How a thread hands the loop an event.
Put = Callable[[Event], None]
