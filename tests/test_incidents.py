"""Incidents: one per episode of a rule; repeats fold in, worse severity escalates."""

from __future__ import annotations

from sentinel.model.incidents import IncidentEvent, IncidentTracker
from sentinel.model.records import Alert, Severity
from sentinel.rules import STORIES

T0 = 1_700_000_000.0


def alert(
    rule: str = "nan_inf",
    severity: Severity = Severity.CRITICAL,
    *,
    time: float = T0,
    step: int | None = 10,
    onset_step: int | None = None,
    resolves: bool = False,
) -> Alert:
    return Alert(
        rule=rule,
        severity=severity,
        message="m",
        time=time,
        step=step,
        onset_step=onset_step,
        resolves=resolves,
    )


def test_first_alert_opens_an_incident() -> None:
    tracker = IncidentTracker("run", STORIES)
    result = tracker.observe(alert(step=7, onset_step=5))
    assert result is not None
    event, incident = result
    assert event is IncidentEvent.OPENED
    assert incident.rule == "nan_inf"
    assert incident.severity is Severity.CRITICAL
    assert incident.onset_step == 5
    assert incident.opened_at == T0
    assert incident.id == "run-1"
    assert tracker.open == {"nan_inf": incident}


def test_onset_falls_back_to_the_alert_step() -> None:
    tracker = IncidentTracker("run", STORIES)
    result = tracker.observe(alert(step=7))
    assert result is not None
    assert result[1].onset_step == 7


def test_repeated_alerts_fold_into_the_open_incident() -> None:
    tracker = IncidentTracker("run", STORIES)
    tracker.observe(alert(time=T0))
    assert tracker.observe(alert(time=T0 + 1)) is None
    assert tracker.observe(alert(time=T0 + 2)) is None
    (incident,) = tracker.open.values()
    assert len(incident.alerts) == 3
    assert incident.opened_at == T0


def test_lower_severity_folds_in_without_event() -> None:
    tracker = IncidentTracker("run", STORIES)
    tracker.observe(alert(severity=Severity.CRITICAL))
    assert tracker.observe(alert(severity=Severity.WARNING)) is None
    assert tracker.open["nan_inf"].severity is Severity.CRITICAL


def test_warning_then_critical_escalates() -> None:
    tracker = IncidentTracker("run", STORIES)
    opened = tracker.observe(alert("stall", Severity.WARNING))
    escalated = tracker.observe(alert("stall", Severity.CRITICAL, time=T0 + 60))
    assert opened is not None
    assert escalated is not None
    assert escalated[0] is IncidentEvent.ESCALATED
    assert escalated[1] is opened[1]
    assert escalated[1].severity is Severity.CRITICAL
    assert escalated[1].worst.severity is Severity.CRITICAL
    assert escalated[1].first.severity is Severity.WARNING


def test_different_rules_open_separate_incidents() -> None:
    tracker = IncidentTracker("run", STORIES)
    first = tracker.observe(alert("nan_inf"))
    second = tracker.observe(alert("stall", Severity.WARNING))
    assert first is not None
    assert second is not None
    assert second[0] is IncidentEvent.OPENED
    assert first[1].id != second[1].id
    assert set(tracker.open) == {"nan_inf", "stall"}


def test_resolve_closes_the_incident() -> None:
    tracker = IncidentTracker("run", STORIES)
    tracker.observe(alert("stall", Severity.WARNING))
    result = tracker.observe(alert("stall", Severity.INFO, time=T0 + 90, resolves=True))
    assert result is not None
    event, incident = result
    assert event is IncidentEvent.RESOLVED
    assert incident.resolved_at == T0 + 90
    assert tracker.open == {}
    assert tracker.closed == [incident]
    assert incident.alerts[-1].resolves


def test_resolve_without_open_incident_is_ignored() -> None:
    tracker = IncidentTracker("run", STORIES)
    assert tracker.observe(alert("stall", Severity.INFO, resolves=True)) is None
    assert tracker.closed == []


def test_new_episode_after_resolve_opens_a_new_incident() -> None:
    tracker = IncidentTracker("run", STORIES)
    tracker.observe(alert())
    tracker.observe(alert(severity=Severity.INFO, resolves=True))
    result = tracker.observe(alert(time=T0 + 500, step=90))
    assert result is not None
    assert result[0] is IncidentEvent.OPENED
    assert result[1].id == "run-2"
    assert result[1].onset_step == 90


def test_close_all_ends_every_open_incident() -> None:
    tracker = IncidentTracker("run", STORIES)
    tracker.observe(alert("nan_inf"))
    tracker.observe(alert("stall", Severity.WARNING))
    closed = tracker.close_all(T0 + 1000)
    assert sorted(incident.rule for incident in closed) == ["nan_inf", "stall"]
    assert all(incident.resolved_at == T0 + 1000 for incident in closed)
    assert tracker.open == {}
    assert len(tracker.closed) == 2
    assert tracker.close_all(T0 + 2000) == []


def test_incident_json_is_serialisable() -> None:
    import json

    tracker = IncidentTracker("run", STORIES)
    result = tracker.observe(alert(step=3))
    assert result is not None
    result[1].record(T0 + 1, "notified")
    data = json.loads(json.dumps(result[1].to_json(), allow_nan=False))
    assert data["rule"] == "nan_inf"
    assert data["onset_step"] == 3
    assert data["actions"] == [{"time": T0 + 1, "text": "notified"}]
    assert data["alerts"][0]["step"] == 3


def test_grad_norm_run_then_nan_join_one_incident_with_the_earliest_onset() -> None:
    tracker = IncidentTracker("run", STORIES)
    opened = tracker.observe(alert("grad_norm_run", Severity.WARNING, step=4, onset_step=2))
    assert opened is not None and opened[0] is IncidentEvent.OPENED
    spike = tracker.observe(alert("loss_spike", Severity.WARNING, step=5, onset_step=3))
    assert spike is None  # joins, no new page
    escalated = tracker.observe(alert("nan_inf", Severity.CRITICAL, step=19, onset_step=19))
    assert escalated is not None
    event, incident = escalated
    assert event is IncidentEvent.ESCALATED
    assert incident is opened[1]
    assert incident.rule == "nan_inf"  # the worst alert's rule decides the action
    assert incident.rules == ["grad_norm_run", "loss_spike", "nan_inf"]
    assert incident.onset_step == 2
    assert len(tracker.open) == 3 and len({id(i) for i in tracker.open.values()}) == 1


def test_joined_incident_resolves_only_when_every_rule_has() -> None:
    tracker = IncidentTracker("run", STORIES)
    tracker.observe(alert("grad_norm_run", Severity.WARNING, step=4))
    tracker.observe(alert("loss_spike", Severity.WARNING, step=5))
    assert tracker.observe(alert("grad_norm_run", Severity.INFO, step=9, resolves=True)) is None
    resolved = tracker.observe(alert("loss_spike", Severity.INFO, step=12, resolves=True))
    assert resolved is not None
    assert resolved[0] is IncidentEvent.RESOLVED
    assert tracker.open == {}
    assert len(tracker.closed) == 1


def test_rules_outside_a_group_never_join() -> None:
    tracker = IncidentTracker("run", STORIES)
    tracker.observe(alert("grad_norm_run", Severity.WARNING, step=4))
    other = tracker.observe(alert("throughput_drop", Severity.WARNING, step=5))
    assert other is not None and other[0] is IncidentEvent.OPENED
    assert other[1].id == "run-2"


def test_a_resolved_episode_is_not_joined_later() -> None:
    tracker = IncidentTracker("run", STORIES)
    tracker.observe(alert("grad_norm_run", Severity.WARNING, step=4))
    tracker.observe(alert("grad_norm_run", Severity.INFO, step=9, resolves=True))
    later = tracker.observe(alert("nan_inf", Severity.CRITICAL, step=50))
    assert later is not None and later[0] is IncidentEvent.OPENED
    assert later[1].onset_step == 50


def test_close_all_closes_a_joined_incident_once() -> None:
    tracker = IncidentTracker("run", STORIES)
    tracker.observe(alert("grad_norm_run", Severity.WARNING, step=4))
    tracker.observe(alert("nan_inf", Severity.CRITICAL, step=6))
    closed = tracker.close_all(T0 + 5)
    assert len(closed) == 1
    assert closed[0].resolved_at == T0 + 5
    assert tracker.open == {}


def test_a_collapsing_loss_scale_and_the_nan_it_ends_in_are_one_page() -> None:
    """fp16 overflow after overflow (loss_scale), then the NaN: one failure, one incident,
    its onset the first evidence. A loss that shifted and never came back (divergence) is
    a decision of its own (issue 21.1): its own incident."""
    tracker = IncidentTracker("run", STORIES)
    opened = tracker.observe(alert("loss_scale", Severity.CRITICAL, step=700, onset_step=650))
    assert opened is not None and opened[0] is IncidentEvent.OPENED
    assert tracker.observe(alert("nan_inf", Severity.CRITICAL, step=710)) is None
    diverged = tracker.observe(alert("divergence", Severity.CRITICAL, step=705))
    assert diverged is not None and diverged[0] is IncidentEvent.OPENED
    assert diverged[1] is not opened[1]
    assert opened[1].rules == ["loss_scale", "nan_inf"]
    assert opened[1].onset_step == 650
