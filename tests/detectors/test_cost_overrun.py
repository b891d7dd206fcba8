"""cost_overrun: spend against the budget on a simulated clock, and the projection at completion.

The scenarios use 4 GPUs at 2.00 per GPU-hour: the job burns 8.00 an hour, so a
100.00 budget is 80% spent after exactly 10 h (36,000 s) and 100% after 12.5 h.
"""

from __future__ import annotations

from collections.abc import Callable

import pydantic
import pytest

from sentinel.engine.core import Engine
from sentinel.model.facts import RunFacts
from sentinel.model.machine import GPU_JOB
from sentinel.model.records import Alert, Sample, Severity
from sentinel.parsing import LineParser
from sentinel.rules.cost_overrun import CostOverrunConfig, CostOverrunDetector

T0 = 1_700_000_000.0
GPUS = 4
PRICE = 2.0
HOUR_S = 3600.0
#: Seconds at which a 100.00 budget is 80%, 100% and 120% spent at 8.00 an hour.
WARN_S = 36_000.0
CRITICAL_S = 45_000.0
KILL_S = 54_000.0


def started(
    *,
    gpus: int | None = GPUS,
    price: float | None = PRICE,
    max_steps: int | None = None,
    **settings: object,
) -> CostOverrunDetector:
    config = CostOverrunConfig.model_validate({"budget": 100.0, **settings})
    detector = CostOverrunDetector(config)
    detector.facts = RunFacts(gpus=gpus, price_per_gpu_hour=price, max_steps=max_steps)
    detector.job_started(T0)
    return detector


def ticks(
    detector: CostOverrunDetector, start_s: float, end_s: float, every_s: float = 60.0
) -> list[Alert]:
    """Tick from ``start_s`` to ``end_s`` (inclusive) after T0; the alerts raised."""
    alerts: list[Alert] = []
    offset = start_s
    while offset <= end_s:
        alerts += detector.tick(T0 + offset)
        offset += every_s
    return alerts


def by_metric(alerts: list[Alert], metric: str) -> list[Alert]:
    return [alert for alert in alerts if alert.metric == metric]


# -- spend against the budget ------------------------------------------------------------


def test_nothing_below_the_warn_fraction() -> None:
    assert ticks(started(), 60, WARN_S - 60) == []


def test_warns_at_exactly_80_percent() -> None:
    detector = started()
    ticks(detector, 60, WARN_S - 60)
    (alert,) = detector.tick(T0 + WARN_S)
    assert alert.severity is Severity.WARNING
    assert alert.metric == "cost"
    assert alert.value == pytest.approx(80.0)
    assert alert.details["gpu_hours"] == pytest.approx(40.0)
    assert alert.details["budget"] == 100.0
    assert "spent 80.00 of the 100.00 budget (80%)" in alert.message


def test_warning_then_critical_each_once() -> None:
    alerts = ticks(started(), 60, CRITICAL_S + 3 * HOUR_S)
    assert [(a.severity, a.time - T0) for a in alerts] == [
        (Severity.WARNING, WARN_S),
        (Severity.CRITICAL, CRITICAL_S),
    ]
    assert all("on_critical" not in a.details for a in alerts)


def test_kill_fraction_raises_a_critical_that_asks_to_stop_the_job() -> None:
    alerts = ticks(started(kill_fraction=1.2), 60, KILL_S + HOUR_S)
    assert [a.time - T0 for a in alerts] == [WARN_S, CRITICAL_S, KILL_S]
    kill = alerts[-1]
    assert kill.severity is Severity.CRITICAL
    assert kill.details["on_critical"] == "stop"
    assert kill.value == pytest.approx(120.0)


def test_jump_past_every_level_raises_only_the_highest() -> None:
    alerts = started(kill_fraction=1.2).tick(T0 + KILL_S + 1)
    assert [(a.severity, a.details.get("on_critical")) for a in alerts] == [
        (Severity.CRITICAL, "stop")
    ]


def test_on_critical_defaults_to_notify() -> None:
    assert CostOverrunConfig().on_critical == "notify"


# -- what is counted -------------------------------------------------------------------------


def test_gpu_count_changing_mid_run_is_integrated_piecewise() -> None:
    """2 GPUs for the first half hour, 4 for the second: 3 GPU-hours (6.00), not 4 (8.00).

    The count a tick sees holds from that tick on.
    """
    detector = started(gpus=2, budget=7.5)  # warns at 6.00
    alerts = ticks(detector, 60, 1740)
    detector.facts.gpus = 4
    alerts += ticks(detector, 1800, 2 * HOUR_S)
    alert = alerts[0]
    assert alert.severity is Severity.WARNING
    assert alert.time == T0 + HOUR_S
    assert alert.value == pytest.approx(6.0)
    assert alert.details["gpu_hours"] == pytest.approx(3.0)


def test_gpus_attributed_late_are_charged_from_the_start() -> None:
    """The GPU source attributes the GPUs a minute in; the job held them from its start."""
    detector = CostOverrunDetector(CostOverrunConfig(budget=10.0))  # warns at 8.00
    engine = Engine([detector], LineParser())
    engine.facts = RunFacts(price_per_gpu_hour=PRICE)
    engine.job_started(T0)
    alerts = engine.tick(T0 + 30)  # no GPU known yet
    for index in range(GPUS):
        alerts += engine.feed_system(f"gpu:{index}", [Sample(GPU_JOB, 1.0)], T0 + 60)
    offset = 120.0
    while offset <= 2 * HOUR_S:
        alerts += engine.tick(T0 + offset)
        offset += 60
    alert = alerts[0]
    assert alert.severity is Severity.WARNING
    assert alert.time == T0 + HOUR_S  # 4 GPUs x 1 h x 2.00 = 8.00
    assert alert.details["gpus"] == GPUS


def test_gpus_attributed_mid_run_count_from_the_moment_the_source_reports_them() -> None:
    """GPUs 0-1 from the start, 2-3 from 1,770 s, between two ticks a minute apart."""
    detector = CostOverrunDetector(CostOverrunConfig(budget=7.5))  # warns at 6.00
    engine = Engine([detector], LineParser())
    engine.facts = RunFacts(price_per_gpu_hour=PRICE)
    engine.job_started(T0)
    alerts: list[Alert] = []
    for index in (0, 1):
        alerts += engine.feed_system(f"gpu:{index}", [Sample(GPU_JOB, 1.0)], T0)
    for offset in range(60, 2 * int(HOUR_S) + 1, 60):
        alerts += engine.tick(T0 + offset)
        if offset == 1740:
            for index in (2, 3):
                alerts += engine.feed_system(f"gpu:{index}", [Sample(GPU_JOB, 1.0)], T0 + 1770)
    alert = alerts[0]
    assert alert.time == T0 + HOUR_S
    assert alert.details["gpu_hours"] == pytest.approx((2 * 1770 + 4 * 1830) / HOUR_S)


def test_restarts_accumulate_and_the_gap_between_attempts_is_not_charged() -> None:
    detector = started(budget=10.0)  # warns at 8.00: 1 h of 4 GPUs
    alerts = ticks(detector, 60, 1800)
    alerts += detector.job_exited(1, T0 + 1800, expected=True)
    alerts += ticks(detector, 1860, 3000)  # sentinel between attempts: nothing held
    detector.job_started(T0 + 3000)
    alerts += ticks(detector, 3060, 3 * HOUR_S)
    alert = alerts[0]
    assert alert.severity is Severity.WARNING
    assert alert.time == T0 + 3000 + 1800
    assert alert.value == pytest.approx(8.0)


def test_levels_are_raised_once_per_run_not_once_per_attempt() -> None:
    detector = started()
    alerts = ticks(detector, 60, WARN_S)
    detector.job_started(T0 + WARN_S)  # restarted without an exit report
    alerts += ticks(detector, WARN_S + 60, WARN_S + 600)
    assert [a.severity for a in alerts] == [Severity.WARNING]


@pytest.mark.parametrize(
    "settings",
    [
        {"price": None},
        {"gpus": None},
        {"budget": None},
    ],
    ids=["no-price", "no-gpu-count", "no-budget"],
)
def test_silent_without_price_gpus_or_budget(settings: dict[str, object]) -> None:
    detector = started(max_steps=10_000, **settings)
    alerts: list[Alert] = []
    for offset in range(0, int(KILL_S), 60):
        alerts += detector.observe(Sample("loss", 1.0, offset // 10), "stdout", T0 + offset)
        alerts += detector.tick(T0 + offset)
    assert alerts == []


# -- projection at completion ---------------------------------------------------------------

MAX_STEPS = 10_000


def run_steps(
    detector: CostOverrunDetector,
    rate_at: Callable[[float], float],
    end_s: float,
    every_s: float = 10.0,
) -> list[Alert]:
    """Log ``loss`` every ``every_s`` with steps advancing at ``rate_at(offset)`` steps/s."""
    alerts: list[Alert] = []
    progress = 0.0
    offset = 0.0
    while offset <= end_s:
        alerts += detector.observe(Sample("loss", 1.0, round(progress)), "stdout", T0 + offset)
        alerts += detector.tick(T0 + offset)
        progress += every_s * rate_at(offset)
        offset += every_s
    return alerts


def dip(offset_s: float) -> float:
    """1 step/s, half that from 3,000 s, then 2 steps/s from 6,000 s."""
    if offset_s < 3000:
        return 1.0
    return 0.5 if offset_s < 6000 else 2.0


def halving(offset_s: float) -> float:
    return 1.0 if offset_s < 3000 else 0.5


# A steady run at 1 step/s takes 10,000 s: 22.22 at 8.00 an hour.
STEADY_BUDGET = 25.0


def test_steady_throughput_within_budget_never_projects_an_overrun() -> None:
    detector = started(budget=STEADY_BUDGET, max_steps=MAX_STEPS)
    alerts = run_steps(detector, lambda _: 1.0, 10_000)
    assert by_metric(alerts, "projected_cost") == []


def test_halved_throughput_projects_the_overrun_long_before_the_money_is_spent() -> None:
    detector = started(budget=STEADY_BUDGET, max_steps=MAX_STEPS)
    alerts = run_steps(detector, halving, 17_000)
    (projected,) = [a for a in by_metric(alerts, "projected_cost") if not a.resolves]
    # Half the budget (12.50) is spent at 5,625 s; the halving began at 3,000 s.
    assert 3000 < projected.time - T0 < 5625
    assert projected.severity is Severity.WARNING
    assert projected.value is not None
    assert projected.value > STEADY_BUDGET * 1.2
    assert projected.details["spent"] < STEADY_BUDGET / 2
    assert projected.details["steps_per_s"] < 0.8
    assert f"of {MAX_STEPS} at" in projected.message
    assert "over the 25.00 budget by" in projected.message
    # It came before any spend level: the point of projecting.
    assert alerts.index(projected) == 0


def test_projection_resolves_when_throughput_recovers() -> None:
    detector = started(budget=STEADY_BUDGET, max_steps=MAX_STEPS)
    alerts = by_metric(run_steps(detector, dip, 8000), "projected_cost")
    assert [(a.severity, a.resolves) for a in alerts] == [
        (Severity.WARNING, False),
        (Severity.INFO, True),
    ]
    assert alerts[1].value is not None
    assert alerts[1].value <= STEADY_BUDGET


def test_projection_does_not_resolve_an_incident_about_money_already_spent() -> None:
    """Spend warns at 30% (7.50, at 3,375 s) before the projection; the recovery is silent."""
    detector = started(budget=STEADY_BUDGET, max_steps=MAX_STEPS, warn_fraction=0.3)
    alerts = run_steps(detector, dip, 8000)
    assert [(a.metric, a.resolves) for a in alerts] == [
        ("cost", False),
        ("projected_cost", False),
    ]


def test_slow_steps_project_once_enough_of_them_are_seen() -> None:
    """Five-minute steps: 200 of them cost 133.33, over the 100.00 budget by a third."""
    detector = started(max_steps=200)
    alerts = run_steps(detector, lambda _: 1 / 300, 20_000, every_s=300)
    (alert,) = alerts
    assert alert.metric == "projected_cost"
    assert alert.time == T0 + 10 * 300  # projection_min_steps
    assert alert.value == pytest.approx(200 * 300 / HOUR_S * GPUS * PRICE)


def test_projection_waits_for_minimum_evidence() -> None:
    """Ten minutes at a crawl (compilation, warmup) project nothing on their own."""
    detector = started(budget=STEADY_BUDGET, max_steps=MAX_STEPS)
    alerts = run_steps(detector, lambda _: 0.05, 590)
    assert alerts == []
    alerts = run_steps(detector, lambda _: 0.05, 1200)
    assert [a.metric for a in alerts] == ["projected_cost"]


def test_no_projection_without_total_steps() -> None:
    detector = started(budget=STEADY_BUDGET, max_steps=None)
    assert by_metric(run_steps(detector, halving, 10_000), "projected_cost") == []


# -- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"warn_fraction": 1.0}, "warn_fraction .* must be less than critical_fraction"),
        ({"warn_fraction": 0.9, "critical_fraction": 0.8}, "must be less than critical_fraction"),
        ({"kill_fraction": 0.9}, "kill_fraction .* must be at least critical_fraction"),
        ({"budget": 0}, "greater than 0"),
        ({"projected_margin": -0.1}, "greater than or equal to 0"),
        ({"budgett": 10}, "Extra inputs are not permitted"),
    ],
    ids=[
        "warn-equals-critical",
        "warn-above-critical",
        "kill-below-critical",
        "zero-budget",
        "negative-margin",
        "typo",
    ],
)
def test_invalid_config_is_rejected(settings: dict[str, object], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        CostOverrunConfig.model_validate(settings)
