"""EventLoop: the interpreter's switch interval while it runs (the stop's thread and the loop)."""

from __future__ import annotations

import statistics
import sys
import threading
import time
from typing import Any

from sentinel.model.records import Marks
from sentinel.supervisor.event_loop import SWITCH_INTERVAL_S, TICK_LATE_FRACTION, EventLoop
from sentinel.supervisor.events import OutputLines
from sentinel.supervisor.inbox import Inbox


class OneTurn:
    """Handlers that note the switch interval on the loop's first turn, then finish."""

    def __init__(self) -> None:
        self.finished = False
        self.restart_at: float | None = None
        self.seen: list[float] = []

    def turned(self) -> None:
        self.seen.append(sys.getswitchinterval())
        self.finished = True

    def on_lines(self, source: str, lines: list[str], read_at: float, marks: Marks) -> None: ...
    def on_system(self, readings: dict[str, Any], read_at: float) -> None: ...
    def on_trainer_state(self, source: str, text: str, read_at: float) -> None: ...
    def on_exit(self, attempt: int, returncode: int | None, *, settled: bool) -> None: ...
    def on_signal(self, signum: int) -> None: ...
    def on_terminated(self, stop: Any, result: Any) -> None: ...
    def on_evidence(self, stop: Any, evidence: Any) -> None: ...
    def on_tick(self) -> None: ...
    def restart_due(self) -> None: ...


def test_the_loop_runs_with_a_short_switch_interval_and_gives_the_old_one_back() -> None:
    before = sys.getswitchinterval()
    handlers = OneTurn()
    EventLoop(Inbox(), handlers, tick_s=0.01).run()
    assert handlers.seen == [min(before, SWITCH_INTERVAL_S)]
    assert handlers.seen[0] < before
    assert sys.getswitchinterval() == before


class Recording(OneTurn):
    """Handlers that note each tick and whether output came in its turn, until ``until``
    (monotonic)."""

    def __init__(self, until: float) -> None:
        super().__init__()
        self.until = until
        self.turns: list[tuple[float, bool]] = []
        self.ticks: list[float] = []
        self._output = False

    def turned(self) -> None:
        self.finished = time.monotonic() >= self.until
        self._output = False  # a new turn

    def on_lines(self, source: str, lines: list[str], read_at: float, marks: Marks) -> None:
        self._output = True

    def on_tick(self) -> None:
        self.ticks.append(time.monotonic())
        self.turns.append((time.monotonic(), self._output))


def test_ticks_ride_on_output_handed_on_once_an_interval() -> None:
    """A reader hands output on a little over once a tick interval (its window and a look):
    each tick rides on that turn instead of waking the loop a second time an interval."""
    tick_s, period_s, count = 0.2, 0.205, 14
    inbox: Inbox[Any] = Inbox()
    handlers = Recording(until=time.monotonic() + count * period_s + 0.1)

    def reader() -> None:
        started = time.monotonic()
        for n in range(1, count + 1):
            time.sleep(max(0.0, started + n * period_s - time.monotonic()))
            inbox.put(OutputLines("train.log", ["{}"], time.time()))

    thread = threading.Thread(target=reader)
    thread.start()
    EventLoop(inbox, handlers, tick_s=tick_s).run()
    thread.join()
    alone = [at for at, output in handlers.turns if not output]
    assert len(handlers.ticks) >= count - 2, "a tick is never lost"
    assert len(alone) <= 3, f"{len(alone)} of {len(handlers.ticks)} ticks woke the loop alone"


def test_without_output_ticks_keep_their_beat_at_most_a_quarter_late() -> None:
    tick_s = 0.1
    started = time.monotonic()
    handlers = Recording(until=started + 1.05)
    EventLoop(Inbox(), handlers, tick_s=tick_s).run()
    lateness = [at - started - (n + 1) * tick_s for n, at in enumerate(handlers.ticks)]
    assert len(handlers.ticks) >= 8
    assert min(lateness) >= tick_s * TICK_LATE_FRACTION * 0.9, "they wait for a turn first"
    # Each tick is due on the beat, not a tick after the last one: a tick the scheduler
    # held up on a loaded machine is one late tick, not a later beat for all that follow
    # (the median; a beat drifting by a quarter a tick puts it a tick off by the tenth).
    drift = statistics.median(lateness)
    assert drift < tick_s * TICK_LATE_FRACTION + 0.05, "and do not drift off the beat"
