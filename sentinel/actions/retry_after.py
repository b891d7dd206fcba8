"""The ``Retry-After`` a target asked for while apprise was sending to it.

apprise returns only success or failure: the HTTP status and headers of its
plugins' answers never reach the caller, and its own retry ignores
``Retry-After``. Every apprise HTTP plugin posts with ``requests``, and every
``requests`` call runs through a ``requests.Session``, whose public *response
hooks* see each answer (redirect hops included) before the plugin reads it.
So one hook is added to every new ``Session`` (once, at import); it does
nothing unless the current context holds an ``Observer``, set by
``observe_responses()`` around one ``Apprise.notify`` call. The observer is a
``ContextVar``, not a thread-local, because apprise runs a plugin on its own
worker threads inside a copy of the caller's context: the plugin's answers
reach the right observer wherever they arrive, and no other code's requests
are ever looked at.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any

import requests

_DELAY_SECONDS = re.compile(r"\d+(\.\d+)?")


def retry_at(value: str, now: float) -> float | None:
    """Epoch time a ``Retry-After`` value (delay-seconds or HTTP-date) names, or None."""
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        return now + float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT, even written as "-0000"
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def asks_to_wait(status: int) -> bool:
    """Whether a ``Retry-After`` on an answer with ``status`` means "not before then"."""
    return status == 429 or 500 <= status < 600


class Observer:
    """What the answers seen during one send asked for; fed from apprise's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._retry_at: float | None = None

    @property
    def retry_at(self) -> float | None:
        """The latest time any 429/5xx answer asked the next attempt to wait for."""
        with self._lock:
            return self._retry_at

    def record(self, status: int, headers: Any, now: float) -> None:
        value = headers.get("Retry-After") if asks_to_wait(status) else None
        at = retry_at(value, now) if value else None
        if at is None:
            return
        with self._lock:
            # A plugin may post more than once per send: the longest wait wins.
            self._retry_at = at if self._retry_at is None else max(self._retry_at, at)


_observer: ContextVar[Observer | None] = ContextVar("sentinel_http_observer", default=None)


def _on_response(response: Any, *args: Any, **kwargs: Any) -> None:
    """A ``requests`` response hook: report the answer to the current observer, if any."""
    observer = _observer.get()
    if observer is not None:
        observer.record(response.status_code, response.headers, time.time())


@contextmanager
def observe_responses() -> Iterator[Observer]:
    """Collect what the HTTP answers made in this context (and its copies) ask for."""
    observer = Observer()
    token = _observer.set(observer)
    try:
        yield observer
    finally:
        _observer.reset(token)


def _install() -> None:
    """Add the response hook to every ``requests.Session`` created from now on; idempotent."""
    original: Callable[..., None] = requests.Session.__init__
    if getattr(original, "_sentinel_hooked", False):
        return

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.hooks["response"].append(_on_response)

    init._sentinel_hooked = True  # type: ignore[attr-defined]
    requests.Session.__init__ = init  # type: ignore[method-assign]


_install()
