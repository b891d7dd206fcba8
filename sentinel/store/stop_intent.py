"""A stop as a transaction: what sentinel decided, kept where a sentinel that dies in the
middle of carrying it out is followed by one that finishes it.

The record rides in ``verdict.json`` (``verdict.py``) as its ``"stop"`` object, through
three phases (the manual (docs/), "A stop survives sentinel's own death"):

- ``stopping``: with the "deciding" mark, right before the first signal: the incident
  and its onset, the job's pid and start time, the signal and its grace. Best effort and
  unsynced: a failed write never delays the stop.
- ``rolling_back``: once the job is gone (it may save during the grace, so what to set
  aside is only known then) and before the first move, written durably: the quarantine
  folder's label and the checkpoint to resume from. Each move is recorded in that folder's
  manifest as it happens (``checkpoints.rollback``).
- ``restarting``: with the final verdict: the restart budget as it now stands, so that the
  next attempt resumes from the planned checkpoint even when it is another sentinel that
  starts it.

``pending`` tells a sentinel that starts whether the last one left a stop unfinished.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sentinel.model.incidents import (
    Incident,
    alert_memory,
    incident_from_memory,
    incident_memory,
)
from sentinel.model.untrusted import json_value
from sentinel.store import verdict

log = logging.getLogger(__name__)

STOPPING = "stopping"
ROLLING_BACK = "rolling_back"
RESTARTING = "restarting"
PHASES = (STOPPING, ROLLING_BACK, RESTARTING)

#: Sentinels that may start on an unfinished stop before the next one gives up (exit 90).
MAX_TRIES = 3


@dataclass(frozen=True)
class StopIntent:
    """One stop sentinel decided on and what of it is done (see the module's docstring)."""

    phase: str
    incident: dict[str, Any]
    #: Whether a rollback and a restart follow the stop (the rule's ``on_critical``).
    restart: bool
    #: The attempt stopped, and its job (pid, start time) where known.
    attempt: int
    job: tuple[int, float] | None
    signal: str
    grace_s: float
    signalled_at: float
    #: The restart budget the stopped attempt was started under (``Restarts.to_state``);
    #: from ``restarting`` on, the budget after this rollback.
    restarts: dict[str, str] = field(default_factory=dict)
    #: The quarantine folder's label, from ``rolling_back`` on.
    label: str | None = None
    #: The checkpoint to resume from ("" for a planned start from scratch), and its step.
    resume: str | None = None
    resume_step: int | None = None
    #: Sentinels that started on this stop unfinished.
    tries: int = 0

    @classmethod
    def begin(
        cls,
        incident: Incident,
        *,
        restart: bool,
        attempt: int,
        job: tuple[int, float] | None,
        signal: str,
        grace_s: float,
        restarts: dict[str, str],
    ) -> StopIntent:
        """The record of a stop about to be signalled."""
        return cls(
            STOPPING,
            compact_incident(incident),
            restart,
            attempt,
            job,
            signal,
            grace_s,
            time.time(),
            dict(restarts),
        )

    @property
    def rule(self) -> str:
        return str(self.incident.get("rule", ""))

    def the_incident(self) -> Incident:
        """The incident the stop was for, as the record keeps it."""
        data = dict(self.incident)
        data["alerts"] = [
            {**alert, "value": _number(alert.get("value"))} for alert in data.get("alerts") or []
        ]
        return incident_from_memory(data)

    def planned(self, label: str, resume: str | None, step: int | None) -> StopIntent:
        return replace(self, phase=ROLLING_BACK, label=label, resume=resume, resume_step=step)

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "incident": self.incident,
            "restart": self.restart,
            "attempt": self.attempt,
            "job": None if self.job is None else list(self.job),
            "signal": self.signal,
            "grace_s": self.grace_s,
            "signalled_at": self.signalled_at,
            "restarts": self.restarts,
            "label": self.label,
            "resume": self.resume,
            "resume_step": self.resume_step,
            "tries": self.tries,
        }

    @classmethod
    def from_json(cls, data: Any) -> StopIntent | None:
        """The record ``to_json`` wrote; None (logged) where it is not one."""
        try:
            phase = data["phase"]
            if phase not in PHASES:
                raise ValueError(f"phase {phase!r}")
            job = data.get("job")
            step = data.get("resume_step")
            intent = cls(
                phase=phase,
                incident=dict(data["incident"]),
                restart=bool(data["restart"]),
                attempt=int(data["attempt"]),
                job=None if job is None else (int(job[0]), float(job[1])),
                signal=str(data["signal"]),
                grace_s=_finite(data["grace_s"], "grace_s"),
                signalled_at=_finite(data["signalled_at"], "signalled_at"),
                restarts={str(k): str(v) for k, v in dict(data.get("restarts") or {}).items()},
                label=None if data.get("label") is None else str(data["label"]),
                resume=None if data.get("resume") is None else str(data["resume"]),
                resume_step=None if step is None else int(step),
                tries=int(data.get("tries") or 0),
            )
            intent.the_incident()
        except (KeyError, TypeError, ValueError, IndexError) as error:
            log.warning("the stop recorded in verdict.json is unreadable (%r): ignored", error)
            return None
        return intent


def _finite(value: Any, name: str) -> float:
    """A time or a duration of the record: a finite number (NaN would pass ``float`` and
    then fail the record's next write, which allows no NaN)."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} {value!r}")
    return number


def compact_incident(incident: Incident) -> dict[str, Any]:
    """What the record keeps of ``incident``: who it is, its onset, its first alert."""
    first = [_json_safe(alert_memory(incident.first))] if incident.alerts else []
    return {**incident_memory(incident), "alerts": first, "actions": [], "open_rules": []}


def _deciding(intent: StopIntent) -> dict[str, Any]:
    """The "deciding" record's fields for ``intent``: the rule, the step of its first alert,
    the attempt, when it was signalled, and the stop itself."""
    first = intent.incident.get("alerts") or [{}]
    return {
        "rule": intent.rule,
        "step": first[0].get("step"),
        "attempt": intent.attempt,
        "time": intent.signalled_at,
        "stop": intent.to_json(),
    }


def mark_stopping(state_dir: Path, intent: StopIntent) -> bool:
    """Before the first signal: the "deciding" mark, holding ``intent`` (best effort)."""
    return verdict.mark_deciding(state_dir, **_deciding(intent))


def mark_ended(state_dir: Path, intent: StopIntent) -> bool:
    """A stop that no verdict follows: the "deciding" mark, keeping no stop to finish."""
    return verdict.mark_deciding(state_dir, **{**_deciding(intent), "stop": None})


def write(state_dir: Path, intent: StopIntent) -> None:
    """The record as it now stands, still deciding, synced. Raises ``OSError``."""
    if intent.phase == RESTARTING:  # the verdict is final: only its stop changes
        try:
            verdict.update_stop(state_dir, intent.to_json())
        except verdict.VerdictUnreadable as error:
            raise OSError(str(error)) from None
        return
    verdict.write_deciding(state_dir, **_deciding(intent))


def pending(state_dir: Path, *, last_attempt: int | None, relaunches: bool) -> StopIntent | None:
    """The stop the last sentinel on ``state_dir`` left unfinished; None when there is none.

    Unfinished: the verdict still says "deciding" with a stop in it; or (``run``) it is
    final, rolled back, for the attempt that ran last (``last_attempt``): the next attempt
    was never started. ``watch`` leaves that to whoever starts the job.
    """
    record = verdict.read(state_dir)
    if record is None or record.stop is None:
        return None
    intent = StopIntent.from_json(record.stop)
    if intent is None:
        return None
    if record.state == verdict.DECIDING:
        return intent
    rolled_back = record.code == verdict.EXIT_ROLLED_BACK and intent.phase == RESTARTING
    if rolled_back and relaunches and last_attempt is not None and last_attempt <= intent.attempt:
        return intent
    return None


def _json_safe(value: Any) -> Any:
    """``value`` with every float that JSON cannot hold (NaN, Inf) written as its name."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


def _number(value: Any) -> float | None:
    """A value ``_json_safe`` kept: its float again."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


#: The stop a dry run would have made: its checkpoints from the onset on are not clean.
DRY_RUN_NAME = "dry-run-stop.json"


@dataclass(frozen=True)
class DryRunStop:
    """What ``note_dry_run`` kept: the rule, the onset, and when sentinel would have acted."""

    rule: str
    onset_step: int | None
    onset_time: float | None
    time: float


def note_dry_run(state_dir: Path, incident: Incident, now: float) -> None:
    """A dry run would have stopped the job for ``incident``: nothing was set aside, so
    ``sentinel checkpoints`` must not call a save from its onset on clean (best effort)."""
    record = {
        "rule": incident.rule,
        "onset_step": incident.onset_step,
        "onset_time": incident.onset_time,
        "time": now,
    }
    try:
        verdict.replace_file(state_dir / DRY_RUN_NAME, json.dumps(_json_safe(record)) + "\n")
    except OSError as error:
        log.warning("could not note the dry run's stop in %s: %s", state_dir, error)


def forget_dry_run(state_dir: Path) -> None:
    """A real stop governs from now on: the dry run's record goes (best effort)."""
    try:
        (state_dir / DRY_RUN_NAME).unlink(missing_ok=True)
    except OSError as error:
        log.warning("could not remove %s: %s", state_dir / DRY_RUN_NAME, error)


def dry_run_stop(state_dir: Path) -> DryRunStop | None:
    """The last stop a dry run would have made on ``state_dir``; None when none (or it
    cannot be read)."""
    try:
        data = json_value((state_dir / DRY_RUN_NAME).read_text(encoding="utf-8"))
        step = data.get("onset_step")
        return DryRunStop(
            rule=str(data["rule"]),
            onset_step=step if isinstance(step, int) else None,
            onset_time=_number(data.get("onset_time")),
            time=float(data["time"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        log.warning("%s is unreadable (%s): ignored", state_dir / DRY_RUN_NAME, error)
        return None


def unresolved(state_dir: Path) -> StopIntent | None:
    """The last stop whose poisoned checkpoints may still be in place: one left unfinished
    ("deciding"), or one that ended without a rollback the job resumed from (a give-up, a
    node fault). None after a rollback-and-restart (what the job writes from then on is
    clean) and where there is no record."""
    record = verdict.read(state_dir)
    if record is None or record.stop is None:
        return None
    if record.state == verdict.FINAL and record.code == verdict.EXIT_ROLLED_BACK:
        return None
    return StopIntent.from_json(record.stop)
