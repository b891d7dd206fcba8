"""The record of what happened: the alert journal and incident reports.

Every alert goes to ``<state_dir>/alerts.jsonl`` as one JSON object a line
(the public schema). Every critical incident gets a short report in
``<state_dir>/reports/<incident>.md`` and ``.json``: its timeline, the last
samples before onset, what sentinel did, and the money the incident cost
(``sentinel.model.cost.incident_cost``) when the owner counts it. It links what its folder,
``reports/<incident>/``, holds: the evidence taken before a stop (``evidence``) and
the chart (``chart``).

Both go through ``sentinel.model.secrets``: a token quoted in an alert (the job's own
output, an error from a webhook) is masked before it reaches the disk. The journal keeps
the job's text as it was otherwise; the report, Markdown for people (and the body of an
email), shows it literally (``sentinel.model.untrusted``): credential-shaped words masked,
control characters escaped, no link, image or HTML it could make, URLs shown unlinkable.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from sentinel.evidence import chart
from sentinel.evidence.capture import EVIDENCE_FILE, incident_dir
from sentinel.evidence.chart import CHART_PNG, CHART_SVG, sparkline
from sentinel.model import secrets
from sentinel.model.cost import UNKNOWN_COST, IncidentCost
from sentinel.model.incidents import Incident, alert_lines
from sentinel.model.records import Alert, Sample, json_number
from sentinel.model.untrusted import defang_urls, markdown_literal, printable
from sentinel.store.state import open_own, open_private, private_dir

#: The folder of the state dir that holds the incident reports.
REPORTS_DIR = "reports"


def report_path(state_dir: Path, incident_id: str) -> Path:
    """Where the markdown report of incident ``incident_id`` is written."""
    return state_dir / REPORTS_DIR / f"{incident_id}.md"


def clock(epoch_s: float) -> str:
    """An epoch time as a short UTC wall-clock string for humans."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M:%S.%f")[:-3]


class Journal:
    """Appends alerts to ``alerts.jsonl``, one flushed line each."""

    def __init__(self, state_dir: Path) -> None:
        private_dir(state_dir)
        self.path = state_dir / "alerts.jsonl"
        self._lock = threading.Lock()
        fd = open_own(self.path, os.O_WRONLY | os.O_APPEND)
        self._file: IO[str] = open(fd, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)

    def append(self, alert: Alert) -> None:
        line = json.dumps(secrets.mask_data(alert.to_json()), allow_nan=False) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def write_report(
    incident: Incident,
    recent: Mapping[str, Sequence[Sample]],
    state_dir: Path,
    *,
    cost: IncidentCost | None = None,
    charted: bool = chart.AVAILABLE,
) -> Path:
    """Write (or rewrite) the incident's markdown and JSON reports; returns the markdown path.

    ``cost`` is the money lost to the incident; None when it is unknown (no price
    or no GPU count), which the reports say. ``charted``: a chart is being drawn.
    """
    reports = private_dir(state_dir / REPORTS_DIR)
    data = incident.to_json()
    data["recent_samples"] = {
        name: [{"step": s.step, "value": json_number(s.value)} for s in samples]
        for name, samples in recent.items()
    }
    data["cost"] = None if cost is None else cost.to_json()
    data = secrets.mask_data(data)
    markdown = secrets.mask(render_markdown(incident, recent, cost=cost))
    markdown += files_section(state_dir, incident.id, charted=charted)
    json_path = reports / f"{incident.id}.json"
    md_path = report_path(state_dir, incident.id)
    _atomic_write(json_path, json.dumps(data, indent=2, allow_nan=False) + "\n")
    _atomic_write(md_path, markdown)
    return md_path


def files_section(state_dir: Path, incident_id: str, *, charted: bool = chart.AVAILABLE) -> str:
    """Links to what the incident's folder holds: the evidence taken before the stop, the
    chart (named while it is being drawn, when ``charted``); "" when there is neither."""
    folder = incident_dir(state_dir, incident_id)
    names = [name for name in (EVIDENCE_FILE, CHART_PNG, CHART_SVG) if (folder / name).exists()]
    if charted and CHART_PNG not in names:
        names += [CHART_PNG, CHART_SVG]
    if not names:
        return ""
    lines = ["", "## Evidence and chart", ""]
    lines += [f"- [{name}]({incident_id}/{name})" for name in names]
    if CHART_PNG in names:
        lines += ["", f"![loss, grad-norm, learning rate, throughput]({incident_id}/{CHART_PNG})"]
    return "\n".join(lines) + "\n"


def incident_files(
    state_dir: Path, incident_id: str, *, charted: bool = chart.AVAILABLE
) -> list[str]:
    """What a message about the incident carries: its evidence, if taken, and its chart
    (drawn by the time the message is sent) when ``charted``."""
    folder = incident_dir(state_dir, incident_id).absolute()
    found = [str(folder / EVIDENCE_FILE)] if (folder / EVIDENCE_FILE).exists() else []
    if charted or (folder / CHART_PNG).exists():
        found.append(str(folder / CHART_PNG))
    return found


def literal(text: str) -> str:
    """Text from outside sentinel (the job's words, a file's name) as Markdown that shows
    it and does nothing else: credentials masked, controls escaped, no link, URLs defanged."""
    return markdown_literal(defang_urls(printable(secrets.mask_tokens(text))))


def render_markdown(
    incident: Incident,
    recent: Mapping[str, Sequence[Sample]],
    *,
    cost: IncidentCost | None = None,
) -> str:
    """The incident's report for humans: what, when, why, what sentinel did, what it cost."""
    first = incident.first
    lines = [
        f"# {incident.severity.upper()} {incident.rule} — incident {incident.id}",
        "",
        f"- first alert: {literal(first.message)}",
        f"- onset step: {incident.onset_step if incident.onset_step is not None else 'unknown'}",
        f"- opened: {clock(incident.opened_at)} UTC",
    ]
    if incident.resolved_at is not None:
        lines.append(f"- closed: {clock(incident.resolved_at)} UTC")
    lines.append(f"- money lost: {UNKNOWN_COST if cost is None else cost.text()}")
    if len(incident.rules) > 1:
        lines.append(f"- rules: {', '.join(incident.rules)}")
    if incident.diagnosis is not None:
        lines += ["", "## Diagnosis", ""]
        lines += [f"- {literal(line)}" for line in incident.diagnosis.lines()]
    else:
        advice = first.details.get("advice")
        if advice:
            lines.append(f"- diagnosis: {literal(str(advice))}")
    lines += ["", "## Timeline", ""]
    events = alert_lines(incident.alerts, upper=False) + incident.actions
    for time, text in sorted(events, key=lambda event: event[0]):
        lines.append(f"- {clock(time)} {literal(text)}")
    if recent:
        lines += ["", "## Last samples before onset", ""]
        for name, samples in sorted(recent.items()):
            shown = ", ".join(f"{s.step}: {s.value:g}" for s in samples)
            code = printable(name).replace("`", "'")
            lines.append(f"- `{code}` {sparkline([s.value for s in samples])}  ({shown})")
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(tmp, path)
