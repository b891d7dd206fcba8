"""What ``stall`` says about a silence: the warning or critical, its numbers and evidence."""

from __future__ import annotations

from dataclasses import dataclass

from sentinel.model.records import Alert, Severity
from sentinel.rules.stall_evidence import Evidence, Timeouts

#: What each verdict of the evidence means, in the message.
_MEANING = {
    "hang": "it looks hung",
    "busy": "the job is busy (a long save or evaluation?)",
    "none": "nothing tells a hang from a long save",
}


@dataclass(frozen=True, slots=True)
class Silence:
    """A silence without progress: how long, after which step, since when, and the run's
    learned rhythm the timeouts came from (None while they are not learned)."""

    silent_s: float
    last_step: int | None
    since: float
    rhythm: str | None


def silence_alert(
    rule: str,
    now: float,
    silence: Silence,
    level: Severity,
    timeouts: Timeouts,
    evidence: Evidence,
) -> Alert:
    """The warning or critical about ``silence``, at ``now``."""
    silent_s, last_step = silence.silent_s, silence.last_step
    verdict = evidence.verdict
    seen = evidence.describe()
    if last_step is None:
        head = f"no step and no output for {silent_s:.0f} s"
    else:
        head = f"no step after {last_step} for {silent_s:.0f} s"
    if level is Severity.CRITICAL and verdict == "busy":
        message = (
            f"no step for {silent_s:.0f} s although the job is busy ({seen}): an endless"
            " loop or an evaluation far longer than any before"
        )
    else:
        if level is Severity.CRITICAL:
            basis = f"hard timeout {timeouts.hard_s:.0f} s"
        else:
            basis = f"soft timeout {timeouts.soft_s:.0f} s"
        if silence.rhythm is not None:
            basis += f", {silence.rhythm}"
        message = f"{head} ({basis}); {seen}: {_MEANING[verdict]}"
    return Alert(
        rule=rule,
        severity=level,
        message=message,
        time=now,
        step=last_step,
        metric="silence_s",
        value=round(silent_s, 3),
        onset_step=None if last_step is None else last_step + 1,
        details={
            "evidence": evidence.to_json(),
            "onset_time": silence.since,
            "soft_timeout_s": timeouts.soft_s,
            "hard_timeout_s": timeouts.hard_s,
            "busy_timeout_s": timeouts.busy_s,
            "learned": timeouts.learned,
        },
    )
