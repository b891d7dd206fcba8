"""Carrying out a stop the machine decided: the signals, on a thread of their own.

The stop signal goes to the job's whole tree, SIGKILL to what outlives the grace
(``stopping``), on a thread whose outcome, and the evidence taken before the first
signal, come back through the inbox; what they say goes into the stop's incident. When
to stop, and what follows the job's exit, is the machine's (``machine``).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from sentinel.config import Settings
from sentinel.process.identity import ProcessIdentity
from sentinel.process.signal_tree import TreeStop
from sentinel.service.health import Service
from sentinel.service.watch import Watch
from sentinel.supervisor import stopping
from sentinel.supervisor.events import Put, Stop
from sentinel.supervisor.holders import Handle, Holder


class JobStops:
    """Sends the signals of a stop and notes how it went (see the module's docstring)."""

    def __init__(self, holder: Holder, *, watch: Watch, service: Service, put: Put) -> None:
        self.holder = holder
        self.watch = watch
        self.service = service
        self._put = put

    def signal(self, identity: ProcessIdentity, stop: Stop, settings: Settings) -> None:
        """The stop signal to the job's whole tree under ``identity``, then SIGKILL after
        the grace, on a thread of its own; the evidence first where the stop's rule wants it."""
        first = stopping.evidence_first(
            settings, stop, identity, members=self.holder.members, put=self._put
        )
        stopping.stop_in_background(
            identity, stop, settings.job, members=self.holder.members, put=self._put, first=first
        )

    def resume(
        self, identity: ProcessIdentity, stop: Stop, settings: Settings, left_s: float
    ) -> None:
        """A stop a sentinel that died signalled: what is left of its grace, then SIGKILL
        to what still runs."""
        stopping.stop_in_background(
            identity, stop, settings.job,
            members=self.holder.members, put=self._put, resumed_grace_s=left_s,
        )  # fmt: skip

    def kill_now(self, job: Handle | None) -> None:
        """A forced stop: SIGKILL to the job's process group, if it is still the job."""
        if job is not None and job.identity is not None and job.identity.matches():
            os.killpg(job.identity.pid, signal.SIGKILL)

    def terminated(self, stop: Stop | None, result: TreeStop) -> None:
        """The stop sequence's outcome (``stopping``), for the incident's record."""
        if not result.signalled:
            self.service.metrics.action("stop", ok=False)
        note = stopping.outcome_note(stop, result)
        if note is not None and stop is not None and stop.incident is not None:
            stop.incident.record(time.time(), note)
            self.watch.update(stop.incident)

    def evidence(self, stop: Stop | None, taken: Any) -> None:
        """What the job was doing, taken before the first signal (``stopping``)."""
        incident = stopping.record_evidence(stop, taken)
        if incident is not None:
            self.watch.update(incident)
