"""The ``Retry-After`` a target asked for while apprise was sending to it.

apprise returns only success or failure: the HTTP status and headers of its
plugins' answers never reach the caller, and its own retry ignores
``Retry-After``. apprise's HTTP plugins send with the module-level functions of
``requests`` (``requests.post``, ``requests.request``, ...), looked up as the
global ``requests`` of the plugin's own module, and those functions take
request-level *response hooks* that see each answer (redirect hops included)
before the plugin reads it.

So, only while ``observe_responses(plugin)`` is open around one
``Apprise.notify``, the plugin's modules see ``requests`` through a stand-in
whose request functions add that hook, and only for calls made in the
observing context (a ``ContextVar``: apprise runs a plugin on its own worker
threads inside a copy of the caller's context). Nothing is changed at import,
``requests`` itself is never changed, another thread's calls (through apprise
or not) are passed on untouched, and the plugin's modules get the real
``requests`` back when the last observation ends.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC
from email.utils import parsedate_to_datetime
from types import ModuleType
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

#: The ``requests`` functions a plugin may send with; each takes ``hooks=``.
_REQUEST_FUNCTIONS = ("request", "get", "options", "head", "post", "put", "patch", "delete")


def _on_response(observer: Observer, response: Any, *args: Any, **kwargs: Any) -> None:
    """A ``requests`` response hook: report the answer to ``observer``."""
    observer.record(response.status_code, response.headers, time.time())


def _with_hook(hooks: Any, observer: Observer) -> dict[str, Any]:
    """``hooks`` (as a caller passed them to ``requests``) plus one reporting to ``observer``."""
    merged = dict(hooks or {})
    existing = merged.get("response")
    if existing is None:
        response_hooks = []
    elif callable(existing):
        response_hooks = [existing]
    else:
        response_hooks = list(existing)
    merged["response"] = [*response_hooks, functools.partial(_on_response, observer)]
    return merged


def _observing(name: str) -> Callable[..., Any]:
    """``requests.<name>``, with the response hook added when called in an observed context."""

    def call(*args: Any, **kwargs: Any) -> Any:
        observer = _observer.get()
        if observer is not None:
            kwargs["hooks"] = _with_hook(kwargs.get("hooks"), observer)
        # Looked up at each call, so whatever ``requests.<name>`` is then still runs.
        return getattr(requests, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


class _RequestsForPlugins(ModuleType):
    """``requests`` as a plugin module sees it while observed: the real module's every name,
    except that its request functions go through ``_observing``."""

    def __init__(self) -> None:
        super().__init__(requests.__name__, requests.__doc__)
        for name in _REQUEST_FUNCTIONS:
            setattr(self, name, _observing(name))

    def __getattr__(self, name: str) -> Any:
        return getattr(requests, name)


_stand_in = _RequestsForPlugins()
_lock = threading.Lock()
#: How many open observations use each plugin module (by module name).
_users: dict[str, int] = {}


def _plugin_modules(plugin: object) -> list[ModuleType]:
    """The apprise modules that send for ``plugin``: those defining its class and bases,
    and, for a plugin that is a package (``fcm``, ``matrix``), that package's other modules."""
    names = {
        cls.__module__ for cls in type(plugin).__mro__ if cls.__module__.startswith("apprise.")
    }
    packages = {name.rpartition(".")[0] for name in names} - {"apprise", "apprise.plugins"}
    # ``copy`` is one step under the GIL; listing the items builds a tuple each, and a
    # collection then may run Python code that lets another thread import a module:
    # "dictionary changed size during iteration" (seen when two targets sent at once).
    return [
        module
        for name, module in sys.modules.copy().items()
        if isinstance(module, ModuleType)
        and (name in names or name.rpartition(".")[0] in packages)
        and module.__dict__.get("requests") in (requests, _stand_in)
    ]


def _lend(modules: list[ModuleType]) -> None:
    with _lock:
        for module in modules:
            _users[module.__name__] = _users.get(module.__name__, 0) + 1
            module.requests = _stand_in  # type: ignore[attr-defined]


def _give_back(modules: list[ModuleType]) -> None:
    with _lock:
        for module in modules:
            left = _users.pop(module.__name__) - 1
            if left:
                _users[module.__name__] = left
            elif module.__dict__.get("requests") is _stand_in:
                module.requests = requests  # type: ignore[attr-defined]


@contextmanager
def observe_responses(plugin: object) -> Iterator[Observer]:
    """Collect what the HTTP answers to ``plugin``'s requests, made in this context (and
    its copies), ask for; no other code's requests are seen."""
    observer = Observer()
    modules = _plugin_modules(plugin)
    _lend(modules)
    token = _observer.set(observer)
    try:
        yield observer
    finally:
        _observer.reset(token)
        _give_back(modules)
