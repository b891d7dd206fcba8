"""Events from the sources' threads for the one thread that owns the engine.

Sources hand over what they read here; the owner takes everything waiting in one go.
A producer wakes the owner only when no wake-up is pending yet, so whatever arrives while
the owner is busy rides along with the next take instead of costing a wake-up each
(on a VM one costs tens of microseconds of CPU; a ``queue.Queue`` pays it per item).
An event that can wait (a periodic reading) wakes nobody: it rides along with the next
take, which the owner bounds with its own timeout.

An inbox may be bounded: when what its events weigh passes the bound's limit (an
owner that is stalled while a job floods its output), the oldest events that weigh
anything are shrunk, oldest first, until half the limit is left; events that weigh
nothing (an exit, a signal) are never touched.
"""

from __future__ import annotations

import threading
from typing import Generic, Protocol, TypeVar

Event = TypeVar("Event")


class Bound(Protocol[Event]):
    """How much an inbox may hold, and how an event is made lighter."""

    #: The most the waiting events may weigh.
    limit: int

    def weight(self, event: Event) -> int:
        """What ``event`` weighs (0: never shrunk)."""
        ...

    def shrink(self, event: Event) -> Event:
        """A lighter event in its place; called under the inbox's lock."""
        ...


class Inbox(Generic[Event]):
    """A many-producer, one-consumer hand-over that wakes the consumer once per batch.

    ``put`` takes a lock: a signal handler must hand its event to a thread first, since
    the thread it interrupted may hold that lock.
    """

    def __init__(self, bound: Bound[Event] | None = None) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._events: list[Event] = []
        #: A ``put`` has woken (or will wake) the consumer since its last take.
        self._woken = False
        self._bound = bound
        #: What the waiting events weigh, and how many of the oldest were shrunk already.
        self._held = 0
        self._shrunk = 0

    def put(self, event: Event, *, wake: bool = True) -> None:
        """Add ``event``; wakes the consumer if it waits, unless ``wake`` is False.

        An event put with ``wake=False`` waits for the consumer's next take: the end of
        its timeout, or the next event that wakes it, whichever comes first.
        """
        with self._lock:
            self._events.append(event)
            bound = self._bound
            if bound is not None:
                self._held += bound.weight(event)
                if self._held > bound.limit:
                    self._shrink(bound)
            if wake and not self._woken:
                self._woken = True
                self._ready.notify()

    def take(self, timeout_s: float | None = None) -> list[Event]:
        """Every event waiting, oldest first; waits up to ``timeout_s`` (None: forever) for
        an event that wakes it, and takes what is there when the time runs out.

        An empty list when the time ran out with nothing there.
        """
        with self._lock:
            if not self._woken and (timeout_s is None or timeout_s > 0):
                self._ready.wait(timeout_s)
            self._woken = False
            events, self._events = self._events, []
            self._held = self._shrunk = 0
        return events

    def _shrink(self, bound: Bound[Event]) -> None:
        """Shrink the oldest events not shrunk yet until half the limit is left."""
        events = self._events
        while self._held > bound.limit // 2 and self._shrunk < len(events) - 1:
            index = self._shrunk
            self._shrunk += 1
            weight = bound.weight(events[index])
            if weight:
                events[index] = bound.shrink(events[index])
                self._held += bound.weight(events[index]) - weight

    def __len__(self) -> int:
        """Events waiting now."""
        with self._lock:
            return len(self._events)
