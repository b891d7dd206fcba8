"""Notices and envelopes as sentinel makes them, for tests of what messages say.

``divergence()`` walks a real ``IncidentTracker`` and ``diagnose`` through the
story the issue names: a grad-norm run opens an incident, a NaN escalates it,
sentinel stops the job, rolls back and restarts; each step yields the notice
``incident_notice`` makes of it. ``notice()`` makes one notice of any kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sentinel.evidence.diagnosis import diagnose
from sentinel.model.incidents import IncidentEvent, IncidentTracker
from sentinel.model.records import Alert, Sample, Severity
from sentinel.notify.notices import Envelope, JobInfo, Notice, NoticeKind, incident_notice
from sentinel.rules import STORIES

#: 2023-11-14 22:13:20 UTC.
T0 = 1_700_000_000.0
JOB = JobInfo("llama-ft", "gpu-node-7", "r-20231114-2213", "https://wandb.ai/acme/llm/runs/abc123")
KEY = "llama-ft-1:escalated:7f3a9c"

_GRAD_NORMS = [1.1, 1.0, 1.2, 1.1, 1.3, 2.0, 4.5, 12.0, 25.0, 48.2, 96.0, float("nan")]
_LOSSES = [2.0 - 0.01 * index for index in range(11)] + [float("nan")]
#: The metrics up to the NaN at step 1342.
RECENT = {
    "grad_norm": [Sample("grad_norm", v, 1331 + i) for i, v in enumerate(_GRAD_NORMS)],
    "loss": [Sample("loss", v, 1331 + i) for i, v in enumerate(_LOSSES)],
}

ACTIONS = (
    "SIGTERM to the job's process group (pgid 4242)",
    "job stopped: exited 143 after 2.1 s",
    "rolled back to checkpoint-1200; quarantined checkpoint-1400 (after_onset) in /ckpt/quarantine",
    "restarting (1 of 2) in 5 s",
)


def _until(step: int) -> dict[str, list[Sample]]:
    return {
        name: [s for s in samples if s.step is not None and s.step <= step]
        for name, samples in RECENT.items()
    }


def divergence() -> tuple[Notice, Notice, Notice]:
    """grad_norm_run OPENED (warning), nan_inf ESCALATED (critical), then ACTIONS."""
    tracker = IncidentTracker("llama-ft", STORIES)
    run = Alert(
        "grad_norm_run",
        Severity.WARNING,
        "grad_norm above 10 for 3 logged steps (48.2)",
        T0,
        "train.log",
        step=1340,
        metric="grad_norm",
        value=48.2,
        onset_step=1338,
    )
    event = tracker.observe(run)
    assert event is not None and event[0] is IncidentEvent.OPENED
    incident = event[1]
    incident.diagnosis = diagnose(incident, _until(1340))
    opened = incident_notice(NoticeKind.OPENED, incident, run, recent=_until(1340))
    nan = Alert(
        "nan_inf",
        Severity.CRITICAL,
        "loss is NaN at step 1342",
        T0 + 3,
        "train.log",
        step=1342,
        metric="loss",
        value=float("nan"),
    )
    event = tracker.observe(nan)
    assert event is not None and event[0] is IncidentEvent.ESCALATED
    incident.diagnosis = diagnose(incident, RECENT)
    incident.record(T0 + 4, ACTIONS[0])
    escalated = incident_notice(NoticeKind.ESCALATED, incident, nan, recent=RECENT)
    for offset_s, text in zip((6.1, 7.0, 7.0), ACTIONS[1:], strict=True):
        incident.record(T0 + offset_s, text)
    acted = incident_notice(NoticeKind.ACTIONS, incident, nan, recent=RECENT, now=T0 + 7)
    return opened, escalated, acted


def notice(
    kind: NoticeKind,
    *,
    rule: str = "nan_inf",
    severity: Severity = Severity.CRITICAL,
    incident_id: str = "llama-ft-1",
    time: float = T0,
    alert: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Notice:
    """A notice of ``kind``; its alert is a NaN at step 1342 unless ``alert`` changes it."""
    schema: dict[str, Any] = {
        "rule": rule,
        "severity": str(severity),
        "step": 1342,
        "metric": "loss",
        "value": "nan",
        "message": "loss is NaN at step 1342",
        "time": time,
        "source": "train.log",
    }
    schema.update(alert or {})
    fields.setdefault("opened_at", T0)
    return Notice(kind, incident_id, rule, severity, schema, time, **fields)


def envelope(*notices: Notice, folded: dict[str, int] | None = None, key: str = KEY) -> Envelope:
    return Envelope(key, JOB, notices, dict(folded or {}))
