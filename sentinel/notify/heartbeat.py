"""A dead-man switch: ping a heartbeat URL while sentinel is healthy, so its silence is noticed.

A receiver such as healthchecks.io alarms when pings stop. An unhealthy sentinel
(its loop stuck, a source thread dead) therefore sends nothing rather than a
ping that would vouch for it. A failed ping is logged, recorded in the state
DB's kv (``heartbeat.last_error``, ``heartbeat.last_error_at``) and tried again
at the next interval; a good one records ``heartbeat.last_ok_at`` (epoch
seconds), which ``sentinel status`` shows.

The URL holds its token in the path or the query; it is registered with
``sentinel.model.secrets`` and only ever shown masked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import requests

from sentinel.model import secrets
from sentinel.store.state import StateStore

logger = logging.getLogger(__name__)

LAST_OK_KEY = "heartbeat.last_ok_at"
LAST_ERROR_KEY = "heartbeat.last_error"
LAST_ERROR_AT_KEY = "heartbeat.last_error_at"


class Heartbeat:
    """Pings ``url`` (HTTP GET) every ``interval_s`` on a daemon thread while ``healthy()``.

    The first ping goes out right after ``start``. Nothing here raises into the
    caller: a failing ping, a failing ``healthy`` or a failing store is logged.
    """

    def __init__(
        self,
        url: str,
        interval_s: float,
        healthy: Callable[[], bool],
        *,
        store: StateStore | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.url = url
        self.masked_url = secrets.mask_heartbeat_url(url)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.last_ok_at: float | None = None
        self.last_error: str | None = None
        self._healthy = healthy
        self._store = store
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._was_healthy = True
        self._failing = False
        secrets.register(secrets.heartbeat_secrets(url))

    def start(self) -> None:
        """Ping now, then every ``interval_s``; a second call does nothing."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="sentinel-heartbeat", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = 1.0) -> None:
        """Stop pinging; waits up to ``wait_s`` for a ping in flight (the thread is a daemon)."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=wait_s)

    def _run(self) -> None:
        # Pings keep to a fixed schedule: a slow ping does not push the next one later.
        next_at = time.monotonic()
        with requests.Session() as session:
            while not self._stopping.is_set():
                try:
                    if self._is_healthy():
                        self._ping(session)
                except Exception:  # a bug here must cost one ping, not the dead-man switch
                    logger.exception("heartbeat: ping round failed")
                next_at += self.interval_s
                if self._stopping.wait(max(0.0, next_at - time.monotonic())):
                    return

    def _is_healthy(self) -> bool:
        try:
            healthy = bool(self._healthy())
        except Exception:
            logger.exception("heartbeat: the health check failed; counting sentinel unhealthy")
            healthy = False
        if healthy != self._was_healthy:
            if healthy:
                logger.info("sentinel healthy again: heartbeat pings to %s resume", self.masked_url)
            else:
                logger.warning(
                    "sentinel unhealthy: heartbeat pings to %s paused, so its receiver alarms",
                    self.masked_url,
                )
            self._was_healthy = healthy
        return healthy

    def _ping(self, session: requests.Session) -> None:
        try:
            response = session.get(self.url, timeout=self.timeout_s)
            status, reason = response.status_code, response.reason
            response.close()
        except requests.RequestException as exc:
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = "" if 200 <= status < 300 else f"HTTP {status} {reason or ''}".rstrip()
        now = time.time()
        if not error:
            if self._failing:
                logger.info("heartbeat ping to %s succeeded again", self.masked_url)
            self._failing = False
            self.last_ok_at = now
            self._record({LAST_OK_KEY: repr(now)})
            logger.debug("heartbeat ping to %s ok", self.masked_url)
            return
        error = secrets.mask(error.replace(self.url, self.masked_url))
        self.last_error, self._failing = error, True
        # One write: a reader never sees the error without its time.
        self._record({LAST_ERROR_KEY: error, LAST_ERROR_AT_KEY: repr(now)})
        logger.warning(
            "heartbeat ping to %s failed, next try in %.0fs: %s",
            self.masked_url,
            self.interval_s,
            error,
        )

    def _record(self, values: dict[str, str]) -> None:
        if self._store is None:
            return
        try:
            self._store.put_many(values)
        except Exception as exc:  # a closed or locked DB must not end the heartbeat
            logger.warning("heartbeat: cannot record %s: %s", ", ".join(values), exc)
