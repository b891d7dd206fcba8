"""systemd's notify protocol (sd_notify(3)), written to its documented datagram form.

One datagram of newline-separated ``KEY=VALUE`` lines to the AF_UNIX socket named by
``$NOTIFY_SOCKET``: a path (``/run/systemd/notify``) or an abstract name (``@...``,
the ``@`` standing for a NUL). systemd documents the protocol as stable and ships a
self-contained reference of it, so sentinel needs neither a C library nor a package.
Without ``$NOTIFY_SOCKET`` (not under ``Type=notify``) every call does nothing.

The watchdog: with ``$WATCHDOG_USEC`` set, and ``$WATCHDOG_PID`` unset or ours,
systemd expects ``WATCHDOG=1`` at least that often; sentinel sends it at half that
interval, and only from the detection loop after a cycle that ran, so a wedged loop
gets sentinel restarted. A cycle that ran but could not write its state is still a
good cycle (say so in ``STATUS=``): a full disk must never get sentinel killed.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

#: What systemd sets for its own use; a job sentinel launches must not inherit them,
#: or its own sd_notify calls would speak for sentinel's unit.
NOTIFY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def strip_notify_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` without systemd's notify variables (for the job in ``run`` mode)."""
    return {key: value for key, value in env.items() if key not in NOTIFY_ENV}


def format_status(
    *,
    step: int | None,
    attempt: int,
    open_incidents: int,
    problem: str | None = None,
) -> str:
    """The one line of ``systemctl status``: ``step 1234, attempt 2, 1 open incident``.

    ``problem`` is what went wrong with sentinel itself (a state write that failed),
    appended so that a person sees it without failing the watchdog.
    """
    parts = [
        f"step {step}" if step is not None else "no step yet",
        f"attempt {attempt}",
        f"{open_incidents} open incident" + ("" if open_incidents == 1 else "s"),
    ]
    text = ", ".join(parts)
    return f"{text}; {problem}" if problem else text


def _socket_address(value: str) -> str | None:
    """The AF_UNIX address of ``$NOTIFY_SOCKET``, None for a kind sentinel cannot speak."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None  # vsock:..., or garbage


def _watchdog_interval_s(env: Mapping[str, str], pid: int) -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds, when the watchdog is on and meant for ``pid``."""
    usec_text = env.get("WATCHDOG_USEC", "")
    if not usec_text:
        return None
    watchdog_pid = env.get("WATCHDOG_PID", "")
    try:
        usec = int(usec_text)
        if watchdog_pid and int(watchdog_pid) != pid:
            return None  # set for another process (our parent's, left in the environment)
    except ValueError:
        log.warning(
            "ignoring systemd's watchdog: WATCHDOG_USEC=%r, WATCHDOG_PID=%r",
            usec_text,
            watchdog_pid,
        )
        return None
    if usec <= 0:
        return None
    return usec / 1e6 / 2


class SystemdNotifier:
    """Tells systemd how sentinel is doing; does nothing when not run under ``Type=notify``.

    ``env`` is the environment to read (``os.environ`` by default), ``pid`` our own pid
    for ``$WATCHDOG_PID``, ``clock`` monotonic time (injected in tests). A send that
    fails is logged once and never raised: systemd's bookkeeping never stops the watch.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if env is None else env
        self._clock = clock
        self._address: str | None = None
        notify_socket = env.get("NOTIFY_SOCKET", "")
        if notify_socket:
            self._address = _socket_address(notify_socket)
            if self._address is None:
                log.warning("NOTIFY_SOCKET=%r: not a path or @name; not notifying", notify_socket)
        own_pid = os.getpid() if pid is None else pid
        interval = _watchdog_interval_s(env, own_pid) if self._address is not None else None
        #: Seconds between two ``WATCHDOG=1``: half of ``$WATCHDOG_USEC``; None when off.
        self.watchdog_interval_s = interval
        self._socket: socket.socket | None = None
        self._last_ping: float | None = None
        self._last_status: str | None = None
        self._failing = False

    @property
    def enabled(self) -> bool:
        """Whether there is a systemd to tell."""
        return self._address is not None

    def ready(self, status: str | None = None) -> bool:
        """``READY=1``: config and state are loaded, sentinel is watching."""
        return self._send(["READY=1", *self._status_lines(status)])

    def status(self, text: str) -> bool:
        """``STATUS=``: one line for ``systemctl status``; an unchanged line is not resent."""
        if self._address is not None and text == self._last_status:
            return True
        return self._send(self._status_lines(text))

    def good_cycle(self) -> bool:
        """The detection loop ran a cycle: ``WATCHDOG=1`` if half the watchdog's time is up.

        True when a keep-alive went out.
        """
        interval = self.watchdog_interval_s
        if interval is None:
            return False
        now = self._clock()
        if self._last_ping is not None and now - self._last_ping < interval:
            return False
        if not self._send(["WATCHDOG=1"]):
            return False
        self._last_ping = now
        return True

    def extend_timeout(self, seconds: float, status: str | None = None) -> bool:
        """``EXTEND_TIMEOUT_USEC=``: ask for ``seconds`` more (while draining on stop)."""
        usec = max(1, round(seconds * 1e6))
        return self._send([f"EXTEND_TIMEOUT_USEC={usec}", *self._status_lines(status)])

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: sentinel is shutting down."""
        return self._send(["STOPPING=1", *self._status_lines(status)])

    def close(self) -> None:
        """Close the socket (a later send opens another)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _status_lines(self, text: str | None) -> list[str]:
        if text is None:
            return []
        self._last_status = text
        return ["STATUS=" + " ".join(text.splitlines())]

    def _send(self, lines: list[str]) -> bool:
        address = self._address
        if address is None:
            return False
        data = ("\n".join(lines) + "\n").encode()
        try:
            if self._socket is None:
                self._socket = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                )
            # sendto each time rather than connect once: a restarted systemd binds a new socket.
            self._socket.sendto(data, address)
        except OSError as error:
            if not self._failing:
                log.warning("cannot notify systemd (%s): %s", address.replace("\0", "@"), error)
            self._failing = True
            self._last_status = None  # resend it once systemd hears again
            return False
        if self._failing:
            log.info("notifying systemd works again")
        self._failing = False
        return True
