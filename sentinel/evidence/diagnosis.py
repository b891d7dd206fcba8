"""What the evidence suggests: the runbooks' reading of an incident.

``diagnose`` looks at which rules fired together and at the metrics just
before onset, and says, as an on-call engineer would read it at 3 AM: the
likely cause, what to do, the step (and sample range) to inspect, and a
sparkline of the metric around onset (``grad_norm ▁▁▂▃▅▇█ nan``).

The readings follow the field's runbooks:

- a jump in the logged learning rate, or a warmup still rising, before a blow-up: the
  schedule, named with the step where the LR changed, next to the grad-norm evidence. A
  reading that names a jump moves the incident's onset back to the last step logged at the
  old rate: the rollback goes to a checkpoint saved before it, as one saved at that step
  may already hold the new rate (``explain``); any other reading moves it back to just
  after the last healthy value logged before it (``last_logged_before``): a checkpoint
  saved between that value and the first bad one may hold the fault already;
- a grad-norm run or spike just before a NaN: an optimisation blow-up;
- a NaN in the first steps with no divergence before it: the data;
- a NaN out of the blue after a healthy stretch: a bad batch at that step, an fp16
  overflow or a numerics edge case (the step and its samples to inspect);
- a loss flat from the start: data or label masking, frozen parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sentinel.evidence.chart import sparkline
from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Sample
from sentinel.rules import DETECTORS, Reading, Recent
from sentinel.rules.lr_jumps import jump_reading, lr_evidence, named_jump

#: Points of the sparkline around onset.
SPARK_POINTS = 12
#: Samples of each metric up to an alert's step that its incident is read from
#: (``Engine.recent_at(alert.step, DIAGNOSIS_SAMPLES)``): the same whatever else the batch
#: the alert came in held, and enough to hold a learning-rate jump a few values before
#: the onset with the rate before it.
DIAGNOSIS_SAMPLES = 16


@dataclass(frozen=True)
class Diagnosis:
    """The reading of one incident."""

    cause: str
    advice: str
    #: The step whose batch to look at first (the onset of the evidence).
    inspect_step: int | None = None
    #: Global sample indices ``[first, last]`` of that step, when the batch size is known.
    sample_range: tuple[int, int] | None = None
    #: ``metric ▁▂▃▅█ nan`` around onset.
    sparkline: str = ""

    def lines(self) -> list[str]:
        """The diagnosis as a few short lines for messages and reports."""
        out = [f"{self.cause}: {self.advice}"]
        if self.inspect_step is not None:
            where = f"inspect step {self.inspect_step}"
            if self.sample_range is not None:
                first, last = self.sample_range
                where += f" (samples {first}-{last} in the order the data loader served them)"
            out.append(where)
        if self.sparkline:
            out.append(self.sparkline)
        return out

    def text(self) -> str:
        return "\n".join(self.lines())

    def to_json(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "advice": self.advice,
            "inspect_step": self.inspect_step,
            "sample_range": list(self.sample_range) if self.sample_range else None,
            "sparkline": self.sparkline,
        }


def diagnose(
    incident: Incident,
    recent: Mapping[str, Sequence[Sample]],
    *,
    samples_per_step: int | None = None,
) -> Diagnosis:
    """Read an incident: which rules fired together, and the metrics just before onset.

    ``recent`` holds the last samples of each metric up to the incident's latest
    step; ``samples_per_step`` (batch size x accumulation x ranks) turns the step
    to inspect into a sample range.
    """
    worst = incident.worst
    cause, advice, metric = _reading(incident, recent)
    inspect = _evidence_onset(incident)
    return Diagnosis(
        cause=cause,
        advice=advice,
        inspect_step=inspect,
        sample_range=_sample_range(inspect, samples_per_step),
        sparkline=_spark(metric or worst.metric, recent),
    )


def _evidence_onset(incident: Incident) -> int | None:
    """The first step of the rules' own evidence: the batch to look at (the incident's
    onset may have moved back further, to before a jump of the logged rate)."""
    steps = [
        alert.onset_step if alert.onset_step is not None else alert.step
        for alert in incident.alerts
        if not alert.resolves
    ]
    known = [step for step in steps if step is not None]
    return min(known) if known else incident.onset_step


def explain(
    incident: Incident,
    alert: Alert,
    recent: Mapping[str, Sequence[Sample]],
    *,
    samples_per_step: int | None = None,
    written_after: Callable[[int], float | None] | None = None,
) -> None:
    """Diagnose ``incident`` anew with ``alert`` just folded in; the alert carries it.
    When the reading names a jump of the logged rate, the incident's onset moves back to
    the last step logged at the old rate (``rate_changed_after``); otherwise to just after
    the last healthy value logged before it (``last_logged_before``), and its onset time to
    a time before which that value was not logged yet (``written_after``: the engine's): a
    checkpoint placed by time (Keras's ``model_06.keras``, whose epoch went NaN but showed
    it only at its end) is after the onset when written after that value's line may have been."""
    incident.diagnosis = diagnose(incident, recent, samples_per_step=samples_per_step)
    alert.details["diagnosis"] = incident.diagnosis.to_json()
    changed = rate_changed_after(incident, recent, incident.diagnosis)
    healthy = changed if changed is not None else last_logged_before(incident, recent)
    if healthy is None:
        return
    if changed is not None:
        if incident.onset_step is None or changed < incident.onset_step:
            incident.onset_step = changed
    elif incident.onset_step is not None:
        incident.onset_step = min(incident.onset_step, healthy + 1)
    seen = written_after(healthy) if written_after is not None else None
    if seen is not None and seen < incident.onset_time:
        incident.onset_time = seen


def last_logged_before(incident: Incident, recent: Recent) -> int | None:
    """The last step the incident's metric was logged at before its onset, where its onset
    is the first bad value logged: the failure began after that step, somewhere up to the
    onset. A run that logs every 10 steps and saves every 25 has a checkpoint between its
    last healthy value and its first bad one (step 325 between 320 and 330) that may
    already hold the fault: the rollback goes to one saved at or before the last healthy
    step. None where nothing was logged before the onset, or where the onset is itself the
    last healthy step (``lr_jump``'s: the last step logged at the old rate)."""
    first = incident.first
    onset = incident.onset_step
    if onset is None or first.rule == "lr_jump" or first.metric is None:
        return None
    steps = [s.step for s in recent.get(first.metric, ()) if s.step is not None and s.step < onset]
    return max(steps) if steps else None


def rate_changed_after(incident: Incident, recent: Recent, diagnosis: Diagnosis) -> int | None:
    """The step of the last rate logged before the jump ``diagnosis`` names, where it names
    one (its cause says what ``lr_evidence`` says of that jump); None otherwise."""
    jump = named_jump(incident, recent)
    if jump is None or jump[3] is None or jump_reading(*jump)[0] not in diagnosis.cause:
        return None
    return jump[3]


def _reading(incident: Incident, recent: Recent) -> Reading:
    """(cause, advice, metric to draw) for the incident: the first reading of the whole
    incident that a rule in it gives (in their ``incident_reading`` order, a learning-rate
    jump's reading among them), else the reading of its worst alert by that alert's rule."""
    worst = incident.worst
    lr = lr_evidence(incident, recent)
    rules = [DETECTORS[rule] for rule in incident.rules if rule in DETECTORS]
    divergent = frozenset(rule.rule for rule in rules if rule.divergent)
    readers = [(_LR_READING, _lr_reading)]
    readers += [
        (rule.incident_reading, rule.read_incident)
        for rule in rules
        if rule.incident_reading is not None
    ]
    for _, read in sorted(readers, key=lambda reader: reader[0]):
        reading = read(incident, recent, lr, divergent)
        if reading is not None:
            return reading
    own = DETECTORS.get(worst.rule)
    reading = own.read_alert(worst, recent) if own is not None else None
    if reading is not None:
        return reading
    advice = str(worst.details.get("advice") or "")
    return (worst.rule.replace("_", " "), advice or "see the timeline", worst.metric)


#: Where the reading of a learning-rate jump comes among the rules' readings of an incident:
#: after a NaN's (which names the jump itself), before a divergence's.
_LR_READING = 10


def _lr_reading(
    incident: Incident, recent: Recent, lr: tuple[str, str] | None, divergent: frozenset[str]
) -> Reading | None:
    """The loss or grad-norm rose after a jump (or during a warmup) of the logged learning
    rate: the schedule is the likely cause."""
    if lr is None or not divergent:
        return None
    what, advice = lr
    when = "after" if what.startswith("the logged learning rate jumped") else "while"
    return (f"the loss or grad-norm rose {when} {what}", advice, incident.worst.metric)


def _sample_range(step: int | None, samples_per_step: int | None) -> tuple[int, int] | None:
    """Global indices of the samples step ``step`` (1-based, as HF counts) consumed."""
    if step is None or samples_per_step is None or step < 1:
        return None
    return (step - 1) * samples_per_step, step * samples_per_step - 1


def _spark(metric: str | None, recent: Mapping[str, Sequence[Sample]]) -> str:
    if metric is None or metric not in recent:
        return ""
    values = [sample.value for sample in recent[metric]][-SPARK_POINTS:]
    return f"{metric} {sparkline(values)}" if values else ""
