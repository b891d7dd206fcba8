"""Signals to sentinel, handed to its loop as events.

A Python signal handler runs on the main thread between two bytecodes, possibly
while that thread holds the inbox's lock: it may only use ``SimpleQueue.put``,
documented safe there. One forwarder thread, started once, hands each signal on.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable
from typing import Any

#: SIGINT and SIGTERM stop (a second one forces); SIGHUP reloads the config.
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SignalForwarder:
    """Installs the handlers; ``deliver(signum)`` is called on the forwarder thread."""

    def __init__(self, deliver: Callable[[int], None]) -> None:
        self._deliver = deliver
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Take the signals over (only on the main thread: elsewhere Python cannot)."""
        if threading.current_thread() is not threading.main_thread():
            return
        threading.Thread(target=self._forward, name="signals", daemon=True).start()

        def handler(signum: int, _frame: object) -> None:
            self._queue.put(signum)

        self._previous = {sig: signal.signal(sig, handler) for sig in HANDLED}

    def restore(self) -> None:
        """Give the signals back and end the forwarder."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._previous:
            self._queue.put(None)
        self._previous = {}

    def _forward(self) -> None:
        while (signum := self._queue.get()) is not None:
            self._deliver(signum)
