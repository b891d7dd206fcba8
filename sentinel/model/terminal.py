"""Where the job's output left the terminal's cursor, so that sentinel's log lines start a line.

``run`` passes the job's stdout and stderr through to its own, and a progress bar is drawn
without a newline (``\\r`` and the bar, redrawn in place): a log line sentinel wrote then
would be glued to the half-drawn bar. The passthrough says what it wrote (``job_wrote``); the
log handler that writes to a terminal asks ``take_mid_line`` before a record and starts a
new line first when the job's last output ended mid-line. Both sides are threads of one
process: a lock keeps the flag and the write it guards together.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_mid_line = False


def job_wrote(chunk: bytes) -> None:
    """The passthrough wrote ``chunk`` to a terminal."""
    global _mid_line
    if chunk:
        with _lock:
            _mid_line = not chunk.endswith(b"\n")


def take_mid_line() -> bool:
    """Whether the job's last output to a terminal ended mid-line; a line is started after."""
    global _mid_line
    with _lock:
        was, _mid_line = _mid_line, False
    return was


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` (a file object, or None) is a terminal; False once closed."""
    try:
        return stream is not None and bool(stream.isatty())
    except (OSError, ValueError):  # closed
        return False
