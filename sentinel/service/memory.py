"""What sentinel knows of the run, kept in the state dir so that it outlives sentinel.

Each rule's memory, the open incidents, who was told of them and when: saved when it
changed (``Watch.tick``), taken back when the first attempt starts. When the job is
the same (``watch`` beside it, or ``run`` adopting the job a killed sentinel left), all
of it; with ``run_wide`` (``watch``: the state dir is the run's), also the spend and
the flapping clocks when the job is a new attempt.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections.abc import Callable
from typing import Any

from sentinel.engine.core import Engine
from sentinel.model.incidents import IncidentTracker
from sentinel.model.untrusted import json_value
from sentinel.notify.dispatch import Dispatcher
from sentinel.store.state import StateStore

log = logging.getLogger(__name__)

#: The state dir's key for what sentinel knows of the run (``RunMemory.save``).
MEMORY_KEY = "memory"
#: Its layout; a memory of another layout is not taken back (said once).
MEMORY_VERSION = 1
#: While no incident is open or was lately, the clock's ticks save what sentinel knows this
#: often, not every tick: it is then the rules' own memory alone (the spend), and building
#: it to see whether it changed costs a millisecond or more of a turn on a VM.
QUIET_SAVE_S = 5.0

#: ``Watch.safely``: a write to the state dir that may fail without costing detection.
Safely = Callable[..., None]


def load_memory(store: StateStore) -> dict[str, Any] | None:
    """What the last sentinel saved of the run; None when nothing usable is there (said)."""
    try:
        text = store.get(MEMORY_KEY)
        memory = json_value(text) if text else None
    except (OSError, sqlite3.Error, ValueError) as error:
        log.warning("what sentinel knew of the run cannot be read (%s): starting afresh", error)
        return None
    if memory is not None and not isinstance(memory, dict):
        log.warning(
            "what sentinel knew of the run is not a record (%s): starting afresh",
            type(memory).__name__,
        )
        return None
    if memory is not None and memory.get("version") != MEMORY_VERSION:
        log.warning(
            "what sentinel knew of the run has layout %r, this one reads %d: starting afresh",
            memory.get("version"),
            MEMORY_VERSION,
        )
        return None
    return memory if isinstance(memory, dict) else None


class RunMemory:
    """What the last sentinel knew (until the first attempt starts), and what this one
    saved last."""

    def __init__(self, store: StateStore, *, remember: bool, run_wide: bool) -> None:
        self._store = store
        self._run_wide = run_wide
        self._remembered = load_memory(store) if remember else None
        self._saved = ""
        #: When the last save was, and whether incidents were open or had closed since.
        self._saved_at = -math.inf
        self._saved_open = False
        self._saved_closed = 0
        #: The attempt's process (pid, start time), where known.
        self.job_identity: list[float] | None = None

    def due(self, now: float, tracker: IncidentTracker) -> bool:
        """Whether a clock tick saves: each tick while an incident is open, was open at the
        last save or closed since; otherwise every ``QUIET_SAVE_S``."""
        return (
            bool(tracker.open)
            or self._saved_open
            or len(tracker.closed) != self._saved_closed
            or now - self._saved_at >= QUIET_SAVE_S
        )

    def save(
        self,
        now: float,
        engine: Engine,
        tracker: IncidentTracker,
        dispatcher: Dispatcher,
        safely: Safely,
    ) -> None:
        """Write what must outlive sentinel to the state dir, if it changed since last time."""
        memory = {
            "version": MEMORY_VERSION,
            "job": self.job_identity,
            "rules": engine.memory(now),
            "incidents": tracker.memory(),
            "dispatch": dispatcher.memory(),
        }
        self._saved_at, self._saved_open = now, bool(tracker.open)
        self._saved_closed = len(tracker.closed)
        text = json.dumps(memory, default=str, sort_keys=True)
        if text != self._saved:
            safely("what sentinel knows of the run", self._store.put, MEMORY_KEY, text)
            self._saved = text

    def job_started(
        self,
        identity: tuple[int, float] | None,
        engine: Engine,
        tracker: IncidentTracker,
        dispatcher: Dispatcher,
    ) -> None:
        """An attempt started (its process's pid and start time, where known): the first
        takes back what the last sentinel knew, as far as it still holds."""
        self.job_identity = None if identity is None else [identity[0], identity[1]]
        self._saved_at = -math.inf  # the next tick saves whose memory it is
        remembered, self._remembered = self._remembered, None
        if remembered is not None:
            self._take_back(remembered, engine, tracker, dispatcher)

    def _take_back(
        self,
        memory: dict[str, Any],
        engine: Engine,
        tracker: IncidentTracker,
        dispatcher: Dispatcher,
    ) -> None:
        same_job = self.job_identity is not None and memory.get("job") == self.job_identity
        if not same_job and not self._run_wide:
            return  # `run` with a job of its own: a new run, nothing of the last one carries
        try:
            engine.remember(memory["rules"], same_job=same_job)
            dispatcher.remember(memory["dispatch"], same_job=same_job)
            restored = tracker.remember(memory["incidents"]) if same_job else []
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            log.warning("what sentinel knew of the run is unusable (%r): starting afresh", error)
            return
        log.info(
            "took back what sentinel knew before it restarted (%s)%s",
            "the same job" if same_job else "a new attempt",
            f": {len(restored)} open incident(s): {', '.join(i.id for i in restored)}"
            if restored
            else "",
        )
