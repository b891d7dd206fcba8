"""Incident reports in a real state dir: the markdown and the JSON state the money lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sentinel.evidence.report import write_report
from sentinel.model.cost import incident_cost
from sentinel.model.facts import RunFacts
from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Sample, Severity

T0 = 1_700_000_000.0
RECENT = {"loss": [Sample("loss", 2.1, 14), Sample("loss", float("nan"), 15)]}


def nan_incident() -> Incident:
    alert = Alert(
        rule="nan_inf",
        severity=Severity.CRITICAL,
        message="loss is NaN at step 15",
        time=T0,
        step=15,
        metric="loss",
        value=float("nan"),
    )
    incident = Incident(
        id="run-1",
        rule="nan_inf",
        severity=Severity.CRITICAL,
        opened_at=T0,
        onset_step=15,
        onset_time=T0,
        alerts=[alert],
    )
    incident.record(T0 + 5580, "SIGTERM to the job's process group")
    return incident


def written(tmp_path: Path, facts: RunFacts | None) -> tuple[str, dict[str, object]]:
    incident = nan_incident()
    if facts is None:
        md_path = write_report(incident, RECENT, tmp_path)
    else:
        cost = incident_cost(incident, facts, now=T0 + 9000)
        md_path = write_report(incident, RECENT, tmp_path, cost=cost)
    data = json.loads((tmp_path / "reports" / "run-1.json").read_text())
    return md_path.read_text(), data


def test_markdown_states_the_money_lost(tmp_path: Path) -> None:
    markdown, _ = written(tmp_path, RunFacts(gpus=4, price_per_gpu_hour=2.0))
    assert "- money lost: 12.40 (4 GPUs x 1.55 h from onset to action at 2.00/GPU-hour)" in markdown


def test_json_carries_the_cost_object(tmp_path: Path) -> None:
    _, data = written(tmp_path, RunFacts(gpus=4, price_per_gpu_hour=2.0))
    cost = data["cost"]
    assert isinstance(cost, dict)
    assert cost["amount"] == pytest.approx(12.4)
    assert (cost["gpus"], cost["until"], cost["price_per_gpu_hour"]) == (4, "action", 2.0)
    assert cost["gpu_hours"] == pytest.approx(6.2)


@pytest.mark.parametrize(
    "facts",
    [RunFacts(gpus=4), None],
    ids=["no-price", "caller-passes-no-cost"],
)
@pytest.mark.slow
def test_unknown_cost_says_what_to_set(tmp_path: Path, facts: RunFacts | None) -> None:
    markdown, data = written(tmp_path, facts)
    assert "- money lost: unknown: set [cost] price_per_gpu_hour" in markdown
    assert data["cost"] is None


def test_rewriting_a_report_updates_its_money(tmp_path: Path) -> None:
    incident = nan_incident()
    incident.actions.clear()
    facts = RunFacts(gpus=1, price_per_gpu_hour=1.0)
    write_report(incident, RECENT, tmp_path, cost=incident_cost(incident, facts, T0 + 3600))
    md_path = write_report(
        incident, RECENT, tmp_path, cost=incident_cost(incident, facts, T0 + 7200)
    )
    assert "money lost: 2.00 (1 GPU x 2.00 h from onset to now" in md_path.read_text()
