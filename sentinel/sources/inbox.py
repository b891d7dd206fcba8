"""Events from the sources' threads for the one thread that owns the engine.

Sources hand over what they read here; the owner takes everything waiting in one go.
A producer wakes the owner only when no wake-up is pending yet, so whatever arrives while
the owner is busy rides along with the next take instead of costing a wake-up each
(on a VM one costs tens of microseconds of CPU; a ``queue.Queue`` pays it per item).
An event that can wait (a periodic reading) wakes nobody: it rides along with the next
take, which the owner bounds with its own timeout.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

Event = TypeVar("Event")


class Inbox(Generic[Event]):
    """A many-producer, one-consumer hand-over that wakes the consumer once per batch.

    ``put`` takes a lock: a signal handler must hand its event to a thread first, since
    the thread it interrupted may hold that lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._events: list[Event] = []
        #: A ``put`` has woken (or will wake) the consumer since its last take.
        self._woken = False

    def put(self, event: Event, *, wake: bool = True) -> None:
        """Add ``event``; wakes the consumer if it waits, unless ``wake`` is False.

        An event put with ``wake=False`` waits for the consumer's next take: the end of
        its timeout, or the next event that wakes it, whichever comes first.
        """
        with self._lock:
            self._events.append(event)
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
        return events

    def __len__(self) -> int:
        """Events waiting now."""
        with self._lock:
            return len(self._events)
