"""The supervisor's one thread: events from an inbox, clock ticks on the beat, a due restart.

Events that arrive while a turn is busy are taken together, so a chatty job costs
a wake-up per batch, not per line; output of several files taken together is read
with the files that may hold a non-finite value first (``shedding.suspects_first``).
A clock tick due soon, or due a little while ago, rides on a turn taken anyway (a
wake-up of its own costs more than the tick); periodic readings put without waking wait
for the next turn.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

from sentinel.model.records import Marks
from sentinel.supervisor.events import (
    Event,
    EvidenceTaken,
    JobExited,
    OutputLines,
    Readings,
    SignalReceived,
    StopDone,
    TrainerStateRead,
)
from sentinel.supervisor.inbox import Inbox
from sentinel.supervisor.shedding import suspects_first

#: How long a thread waits for the interpreter's lock before the thread holding it must let
#: go (Python's default is 5 ms). A thread that has something for the loop (a reader's NaN,
#: a stop's thread taking evidence before its signal) waits that long behind another that
#: runs (the chart drawer, the stop's thread). Only threads that run at the same time
#: switch more.
SWITCH_INTERVAL_S = 0.0005
#: A clock tick due within this fraction of the tick interval runs on the loop's turn
#: now rather than on a wake-up of its own (a quarter: at most 250 ms early at 1 s).
TICK_EARLY_FRACTION = 0.25
#: A clock tick also waits up to this fraction of the interval for a turn taken anyway, and
#: the next is then an interval after that turn: output that comes about once an interval
#: (a job logging a line a second, each handed on as it comes) carries every tick, where
#: ticks on their own beat woke the loop a second time a second whenever the line came
#: more than a quarter before the beat. Without output a tick comes this late (250 ms at
#: 1 s), on its beat.
TICK_LATE_FRACTION = 0.25


class Handlers(Protocol):
    """What the loop calls; every call is on the loop's thread."""

    @property
    def finished(self) -> bool:
        """Set once the run is over: the loop ends after the current turn."""
        ...

    #: When a restart is due (monotonic), or None.
    restart_at: float | None

    def turned(self) -> None: ...

    def on_lines(self, source: str, lines: list[str], read_at: float, marks: Marks) -> None: ...

    def on_system(self, readings: dict[str, Any], read_at: float) -> None: ...

    def on_trainer_state(self, source: str, text: str, read_at: float) -> None: ...

    def on_exit(self, attempt: int, returncode: int | None, *, settled: bool) -> None: ...

    def on_signal(self, signum: int) -> None: ...

    def on_terminated(self, stop: Any, result: Any) -> None: ...

    def on_evidence(self, stop: Any, evidence: Any) -> None: ...

    def on_tick(self) -> None: ...

    def restart_due(self) -> None: ...


class EventLoop:
    """Runs ``handlers`` off ``inbox`` until they say the run is finished."""

    def __init__(self, inbox: Inbox[Event], handlers: Handlers, tick_s: float) -> None:
        self.inbox = inbox
        self.handlers = handlers
        self.tick_s = tick_s

    def run(self) -> None:
        switch_interval_s = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval_s, SWITCH_INTERVAL_S))
        try:
            self._run()
        finally:
            sys.setswitchinterval(switch_interval_s)

    def _run(self) -> None:
        handlers, tick_s = self.handlers, self.tick_s
        early_s, late_s = tick_s * TICK_EARLY_FRACTION, tick_s * TICK_LATE_FRACTION
        next_tick = time.monotonic() + tick_s
        while not handlers.finished:
            handlers.turned()
            restart_at = handlers.restart_at
            deadline = next_tick + late_s
            if restart_at is not None:
                deadline = min(deadline, restart_at)
            events = self.inbox.take(max(0.0, deadline - time.monotonic()))
            now_mono = time.monotonic()
            if len(events) > 1:
                events = suspects_first(events)
            self.dispatch(events)
            if now_mono >= next_tick - early_s:
                if next_tick < now_mono < deadline:
                    # Late, on a turn an event woke: the next an interval from this turn,
                    # so that ticks ride on output that comes once an interval.
                    next_tick = now_mono + tick_s
                else:
                    # On the beat, so that early ticks do not add up to more ticks; after
                    # a long turn, a full interval from now.
                    next_tick = max(next_tick + tick_s, now_mono + tick_s - early_s)
                handlers.on_tick()
            restart_at = handlers.restart_at
            if restart_at is not None and now_mono >= restart_at:
                handlers.restart_at = None
                handlers.restart_due()

    def dispatch(self, events: list[Event], *, late: bool = False) -> None:
        """Handle events in arrival order; after the end (``late``) only output and outcomes."""
        handlers = self.handlers
        for event in events:
            if type(event) is OutputLines:
                handlers.on_lines(event.source, event.lines, event.read_at, event.marks)
            elif type(event) is StopDone:
                handlers.on_terminated(event.stop, event.result)
            elif type(event) is EvidenceTaken:
                handlers.on_evidence(event.stop, event.evidence)
            elif late or handlers.finished:
                continue
            elif type(event) is Readings:
                handlers.on_system(event.readings, event.read_at)
            elif type(event) is TrainerStateRead:
                handlers.on_trainer_state(event.source, event.text, event.read_at)
            elif type(event) is JobExited:
                handlers.on_exit(event.attempt, event.status, settled=event.settled)
            elif type(event) is SignalReceived:
                handlers.on_signal(event.signum)

    def drain(self) -> None:
        """Take in what arrived after the end: late output, a SIGKILL's outcome for the report."""
        while events := self.inbox.take(0):
            self.dispatch(events, late=True)
