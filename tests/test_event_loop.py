"""EventLoop: the interpreter's switch interval while it runs (the stop's thread and the loop)."""

from __future__ import annotations

import sys
from typing import Any

from sentinel.supervisor.event_loop import SWITCH_INTERVAL_S, EventLoop
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

    def on_lines(self, source: str, lines: list[str], read_at: float) -> None: ...
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
