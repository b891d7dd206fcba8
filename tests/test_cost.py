"""The money an incident cost: its GPUs from onset to sentinel's action, resolution, or now."""

from __future__ import annotations

import pytest

from sentinel.model.cost import IncidentCost, format_money, gpu_hours, incident_cost, money
from sentinel.model.facts import RunFacts
from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Severity

T0 = 1_700_000_000.0
FACTS = RunFacts(gpus=4, price_per_gpu_hour=2.0)


def incident(*alerts: Alert, onset_time: float = T0) -> Incident:
    return Incident(
        id="run-1",
        rule=alerts[0].rule,
        severity=max(alert.severity for alert in alerts),
        opened_at=alerts[0].time,
        onset_step=None,
        onset_time=onset_time,
        alerts=list(alerts),
    )


def alert(time: float, rule: str = "nan_inf", **details: object) -> Alert:
    return Alert(rule=rule, severity=Severity.CRITICAL, message="m", time=time, details=details)


def test_onset_to_first_action() -> None:
    found = incident(alert(T0))
    found.record(T0 + 5580, "SIGTERM to the job's process group")
    found.record(T0 + 9000, "rolled back to checkpoint-200")
    found.resolved_at = T0 + 9500
    cost = incident_cost(found, FACTS, now=T0 + 20_000)
    assert cost is not None
    assert cost.until == "action"
    assert cost.hours == pytest.approx(1.55)
    assert cost.amount == pytest.approx(4 * 1.55 * 2.0)
    assert cost.text() == "12.40 (4 GPUs x 1.55 h from onset to action at 2.00/GPU-hour)"


def test_onset_to_resolution_without_action() -> None:
    found = incident(alert(T0))
    found.resolved_at = T0 + 1800
    cost = incident_cost(found, FACTS, now=T0 + 20_000)
    assert cost is not None
    assert (cost.until, cost.gpu_hours) == ("resolution", pytest.approx(2.0))


def test_open_incident_counts_to_now() -> None:
    cost = incident_cost(incident(alert(T0)), FACTS, now=T0 + 900)
    assert cost is not None
    assert (cost.until, cost.amount) == ("now", pytest.approx(2.0))


def test_onset_from_a_rule_that_states_an_earlier_one() -> None:
    """A stall alerts at its timeout; its evidence (no progress) began at the last step."""
    stall = alert(T0 + 1800, rule="stall", onset_time=T0)
    found = incident(stall, onset_time=T0 + 1800)
    found.record(T0 + 1800 + 10, "SIGTERM to the job's process group")
    cost = incident_cost(found, FACTS, now=T0 + 5000)
    assert cost is not None
    assert cost.start_time == T0
    assert cost.end_time - cost.start_time == pytest.approx(1810)


@pytest.mark.parametrize(
    "facts",
    [RunFacts(gpus=4), RunFacts(price_per_gpu_hour=2.0)],
    ids=["no-price", "no-gpu-count"],
)
def test_unknown_without_price_or_gpus(facts: RunFacts) -> None:
    assert incident_cost(incident(alert(T0)), facts, now=T0 + 900) is None


def test_gpus_attributed_by_the_gpu_source_count() -> None:
    facts = RunFacts(price_per_gpu_hour=3.0, job_gpus={"gpu:0", "gpu:3"})
    cost = incident_cost(incident(alert(T0)), facts, now=T0 + 3600)
    assert cost is not None
    assert (cost.gpus, cost.amount) == (2, pytest.approx(6.0))


def test_json_states_the_amount_and_its_parts() -> None:
    cost = IncidentCost(
        gpus=1, price_per_gpu_hour=1.5, start_time=T0, end_time=T0 + 7200, until="action"
    )
    data = cost.to_json()
    assert data["amount"] == pytest.approx(3.0)
    assert (data["gpus"], data["until"]) == (1, "action")
    assert data["gpu_hours"] == pytest.approx(2.0)
    assert data["text"] == "3.00 (1 GPU x 2.00 h from onset to action at 1.50/GPU-hour)"


@pytest.mark.parametrize(
    ("gpus", "seconds", "price", "expected"),
    [(4, 3600.0, 2.0, "8.00"), (8, 900.0, 2.5, "5.00"), (1, 60.0, 1.0, "0.02")],
    ids=["hour", "quarter-hour", "minute-rounds"],
)
def test_money_for_an_interval(gpus: int, seconds: float, price: float, expected: str) -> None:
    assert format_money(money(gpu_hours(gpus, seconds), price)) == expected
