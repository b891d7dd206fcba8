"""The job's state as ``sentinel status`` and the log say it: Supervisor's process states,
read off the machine's phase (``machine.REPORTED``).

WAITING (``watch``: for the job to appear), STARTING (launched or found, younger than
``min_uptime_s``), RUNNING, STOPPING (sentinel asked it to stop), BACKOFF (waiting to
restart), and the final EXITED or FATAL.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    WAITING = "WAITING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    BACKOFF = "BACKOFF"
    EXITED = "EXITED"
    FATAL = "FATAL"
