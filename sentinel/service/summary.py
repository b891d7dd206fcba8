"""The morning after: what ``run``, ``watch`` and the demo say when they end.

A timeline of every incident (its alerts and what sentinel did, in order, and the diagnosis of
a critical one), the result in one line, the checkpoint each restart resumed from, and where
the reports and the alert journal are. Read by a person who slept through the night.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sentinel.evidence.report import clock, report_path
from sentinel.model.incidents import Incident, alert_lines
from sentinel.model.untrusted import printable
from sentinel.store.verdict import EXIT_GIVE_UP, EXIT_NODE_FAULT, EXIT_ROLLED_BACK


def timeline(incidents: Sequence[Incident]) -> list[str]:
    """Each incident's alerts and actions in time order, with a critical one's diagnosis."""
    lines: list[str] = []
    for incident in incidents:
        events = alert_lines(incident.alerts) + incident.actions
        for at, text in sorted(events, key=lambda event: event[0]):
            lines.append(f"  {clock(at)}  {printable(text)}")  # it may quote the job
        if incident.diagnosis is not None and incident.severity == "critical":
            lines.append("  diagnosis:")
            lines.extend(f"    {printable(line)}" for line in incident.diagnosis.lines())
    return lines


def result_line(status: int, restarts: int, elapsed_s: float, *, relaunches: bool) -> str:
    """The run's end in one line."""
    after = f" after {restarts} restart(s), in {elapsed_s:.1f} s"
    if status == EXIT_GIVE_UP:
        return f"Result: sentinel gave up (exit {status}: do not retry){after}."
    if not relaunches and status == EXIT_ROLLED_BACK:
        return (
            f"Result: rolled back; the verdict asks whoever started the job to restart it{after}."
        )
    if not relaunches and status == EXIT_NODE_FAULT:
        return f"Result: a hardware or node fault (exit {status}: retry elsewhere){after}."
    if not relaunches:
        # ``watch``'s own exit status, not the job's (which it often cannot know): it said
        # "the job finished with exit status 0" under a job that had crashed.
        return f"Result: sentinel stopped watching (exit {status}){after}."
    if status == 0:
        return f"Result: the job finished with exit status 0{after}."
    return f"Result: the job ended with exit status {status}{after}."


def summary(
    incidents: Sequence[Incident],
    *,
    status: int,
    restarts: int,
    elapsed_s: float,
    relaunches: bool,
    resumed_from: Sequence[str],
    state_dir: Path,
) -> str:
    """The whole block ``run`` and ``watch`` print when they end."""
    lines = ["", "Timeline"]
    lines += timeline(incidents) or ["  nothing happened: no alert"]
    lines += ["", result_line(status, restarts, elapsed_s, relaunches=relaunches)]
    for number, where in enumerate(resumed_from, start=1):
        lines.append(f"  restart {number} resumed from {printable(where)}")
    reports = [
        report_path(state_dir, incident.id)
        for incident in incidents
        if report_path(state_dir, incident.id).is_file()
    ]
    lines.append("")
    lines += [f"Report: {printable(str(path))}" for path in reports]
    lines.append(f"Alert journal: {printable(str(state_dir / 'alerts.jsonl'))}")
    return "\n".join(lines) + "\n"
