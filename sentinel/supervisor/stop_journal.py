"""The stop under way, written down as it goes, so that a sentinel that dies in the middle
of it is followed by one that finishes it (the record: ``store.stop_intent``).

The machine (``machine``) opens the record as it enters STOPPING, before the first
signal; in SETTLING, ``Restarts`` writes the plan once the job is gone and before the first
move, and the final verdict closes it. A sentinel that starts on a record left open takes
it up (``take_up``), entering the machine where it says, before it reports ready.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from sentinel.model.incidents import Incident
from sentinel.process.identity import ProcessIdentity
from sentinel.store import stop_intent
from sentinel.store.stop_intent import StopIntent

log = logging.getLogger(__name__)


class StopJournal:
    """The record of the stop under way (see the module's docstring)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        #: The stop under way; None when there is none.
        self.intent: StopIntent | None = None

    def stopping(
        self,
        incident: Incident,
        *,
        restart: bool,
        attempt: int,
        job: ProcessIdentity | None,
        signal: str,
        grace_s: float,
        restarts: dict[str, str],
    ) -> None:
        """Right before the first signal: the "deciding" mark with the stop (best effort)."""
        self.intent = StopIntent.begin(
            incident,
            restart=restart,
            attempt=attempt,
            job=None if job is None else (job.pid, job.create_time),
            signal=signal,
            grace_s=grace_s,
            restarts=restarts,
        )
        stop_intent.mark_stopping(self.state_dir, self.intent)
        stop_intent.forget_dry_run(self.state_dir)

    def dry_run(self, incident: Incident, now: float) -> None:
        """A dry run would have stopped the job for ``incident`` (``stop_intent.note_dry_run``)."""
        stop_intent.note_dry_run(self.state_dir, incident, now)

    def take_up(self, intent: StopIntent) -> StopIntent:
        """A stop the last sentinel left unfinished is this one's now (one more try, synced)."""
        self.intent = replace(intent, tries=intent.tries + 1)
        self._write("taking up the unfinished stop")
        return self.intent

    @property
    def label(self) -> str | None:
        """The quarantine folder the stop's rollback uses, once planned."""
        return None if self.intent is None else self.intent.label

    @property
    def planned_resume(self) -> str | None:
        """The checkpoint the plan resumes from ("" for from scratch; None: not planned)."""
        return None if self.intent is None else self.intent.resume

    def planned(self, label: str, resume: str | None, step: int | None) -> None:
        """Before the rollback's first move: its folder and the checkpoint to resume from,
        synced. A failed write is logged: the rollback goes on (it protects the run more
        than its record does)."""
        if self.intent is None:
            return
        self.intent = self.intent.planned(label, resume, step)
        self._write("the rollback's plan")

    def closing(self, restarts: dict[str, str]) -> dict[str, object] | None:
        """What the final verdict keeps of the stop: the budget after it, for a restart
        another sentinel may have to make. The stop is over here."""
        intent, self.intent = self.intent, None
        if intent is None:
            return None
        return replace(intent, phase=stop_intent.RESTARTING, restarts=dict(restarts)).to_json()

    def ended(self) -> None:
        """A stop with no verdict to follow (``on_critical = "stop"``, a shutdown): the
        "deciding" mark keeps no stop for another sentinel to finish."""
        intent, self.intent = self.intent, None
        if intent is None:
            return
        stop_intent.mark_ended(self.state_dir, intent)

    def _write(self, what: str) -> None:
        assert self.intent is not None
        try:
            stop_intent.write(self.state_dir, self.intent)
        except OSError as error:
            log.error("could not record %s in %s: %s", what, self.state_dir, error)
