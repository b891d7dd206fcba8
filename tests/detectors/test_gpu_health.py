"""gpu_health: XIDs, uncorrected ECC, sustained throttling and heat, per GPU, one resolve."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic
import pytest

from sentinel.engine.core import Engine
from sentinel.model.machine import (
    GPU_CLOCK_EVENTS,
    GPU_ECC_UNCORRECTED,
    GPU_JOB,
    GPU_MEM_USED,
    GPU_TEMP,
    GPU_UTIL,
    GPU_XID,
)
from sentinel.model.records import Alert, Sample, Severity
from sentinel.parsing import LineParser
from sentinel.rules.gpu_health import GpuHealthConfig, GpuHealthDetector

T0 = 1_700_000_000.0
GPU0, GPU1 = "gpu:0", "gpu:1"
HW_THERMAL = 0x40
SW_POWER_CAP = 0x04
POWER_BRAKE = 0x80


def detector(**config: Any) -> GpuHealthDetector:
    return GpuHealthDetector(GpuHealthConfig(**config))


def feed(rule: GpuHealthDetector, readings: Sequence[tuple[float, str, str, float]]) -> list[Alert]:
    """Readings as (seconds after T0, GPU, sample name, value), with step 7."""
    alerts: list[Alert] = []
    for at_s, source, name, value in readings:
        alerts += rule.observe(Sample(name, value, 7), source, T0 + at_s)
    return alerts


def series(
    name: str, values: Sequence[float], source: str = GPU0, every_s: float = 5.0
) -> list[tuple[float, str, str, float]]:
    return [(i * every_s, source, name, value) for i, value in enumerate(values)]


def summary(alerts: Sequence[Alert]) -> list[tuple[Severity, bool, str]]:
    return [(alert.severity, alert.resolves, alert.source) for alert in alerts]


# -- XID ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("xid", "severity", "meaning"),
    [
        (79, Severity.CRITICAL, "GPU has fallen off the bus"),
        (48, Severity.CRITICAL, "double bit ECC error"),
        (95, Severity.CRITICAL, "uncontained ECC error"),
        (119, Severity.CRITICAL, "GSP RPC timeout"),
        (74, Severity.CRITICAL, "NVLink error"),
        (13, Severity.WARNING, "graphics engine exception"),
        (31, Severity.WARNING, "MMU fault"),
        (43, Severity.WARNING, "GPU stopped processing"),
        (45, Severity.WARNING, "preemptive cleanup"),
        (999, Severity.WARNING, "XID catalogue"),
    ],
    ids=[
        "79-bus",
        "48-dbe",
        "95-uncontained",
        "119-gsp",
        "74-nvlink",
        "13",
        "31",
        "43",
        "45",
        "unknown",
    ],
)
def test_xid_severity_and_meaning(xid: int, severity: Severity, meaning: str) -> None:
    (alert,) = feed(detector(), [(0, GPU1, GPU_XID, float(xid))])
    assert alert.severity is severity
    assert alert.message.startswith(f"XID {xid} on gpu:1: ")
    assert meaning in alert.message
    assert (alert.metric, alert.value, alert.source, alert.step) == (GPU_XID, xid, GPU1, 7)
    assert alert.details["xid"] == xid
    assert not alert.resolves


@pytest.mark.parametrize(
    ("config", "xid", "expected"),
    [
        ({"ignore_xids": [45]}, 45, []),
        ({"ignore_xids": [79]}, 79, []),
        ({"critical_xids": [13]}, 13, [Severity.CRITICAL]),
        ({"critical_xids": [13]}, 79, [Severity.WARNING]),
    ],
    ids=["ignored-warning", "ignored-critical", "configured-critical", "dropped-from-critical"],
)
def test_xid_lists_are_configurable(
    config: dict[str, Any], xid: int, expected: list[Severity]
) -> None:
    alerts = feed(detector(**config), [(0, GPU0, GPU_XID, float(xid))])
    assert [alert.severity for alert in alerts] == expected


def test_each_xid_is_one_alert_and_readings_do_not_repeat_it() -> None:
    readings = [
        (0, GPU0, GPU_XID, 13.0),
        *[(5 * i, GPU0, GPU_TEMP, 60.0) for i in range(1, 20)],
        (100, GPU0, GPU_XID, 43.0),
        (101, GPU1, GPU_XID, 79.0),
        *[(100 + 5 * i, gpu, GPU_TEMP, 60.0) for i in range(1, 20) for gpu in (GPU0, GPU1)],
    ]
    alerts = feed(detector(), readings)
    assert [(a.details["xid"], a.source, a.severity) for a in alerts] == [
        (13, GPU0, Severity.WARNING),
        (43, GPU0, Severity.WARNING),
        (79, GPU1, Severity.CRITICAL),
    ]


@pytest.mark.parametrize("via_tick", [False, True], ids=["on-a-reading", "on-a-tick"])
def test_a_warning_xid_resolves_after_the_quiet_period(via_tick: bool) -> None:
    rule = detector(xid_quiet_s=300)
    feed(rule, [(0, GPU0, GPU_XID, 13.0), (200, GPU0, GPU_XID, 45.0)])
    assert feed(rule, [(499, GPU0, GPU_TEMP, 60.0)]) == []  # 299 s after the last XID
    if via_tick:
        (resolve,) = rule.tick(T0 + 500)
    else:
        (resolve,) = feed(rule, [(500, GPU1, GPU_TEMP, 60.0)])
    assert resolve.resolves and resolve.severity is Severity.INFO
    assert resolve.source == GPU0
    assert "no XID from gpu:0 for 300 s" in resolve.message


def test_a_critical_xid_does_not_resolve_by_waiting() -> None:
    rule = detector(xid_quiet_s=300)
    feed(rule, [(0, GPU0, GPU_XID, 13.0), (10, GPU0, GPU_XID, 79.0)])
    assert rule.tick(T0 + 10_000) == []
    assert feed(rule, [(10_005, GPU0, GPU_TEMP, 60.0)]) == []


# -- ECC ---------------------------------------------------------------------------------


def test_uncorrected_ecc_increase_is_critical_once() -> None:
    alerts = feed(detector(), series(GPU_ECC_UNCORRECTED, [2, 2, 2, 3, 3, 5, 5]))
    (alert,) = alerts
    assert alert.severity is Severity.CRITICAL
    assert (alert.metric, alert.value, alert.source) == (GPU_ECC_UNCORRECTED, 3, GPU0)
    assert alert.time == T0 + 15
    assert alert.details["new_errors"] == 1
    assert "1 new uncorrected ECC error(s) on gpu:0" in alert.message


@pytest.mark.parametrize("values", [[4, 4, 4, 4], [0, 0, 0]], ids=["old-errors-only", "none"])
def test_uncorrected_ecc_flat_from_the_first_reading_is_silent(values: list[float]) -> None:
    assert feed(detector(), series(GPU_ECC_UNCORRECTED, values)) == []


# -- throttling --------------------------------------------------------------------------


def test_sustained_thermal_throttle_warns_once_naming_the_reason() -> None:
    # Readings every 5 s, throttled from t=10: 300 s of it at t=310.
    alerts = feed(detector(), series(GPU_CLOCK_EVENTS, [0, 0] + [HW_THERMAL] * 100))
    (alert,) = alerts
    assert alert.severity is Severity.WARNING
    assert alert.time == T0 + 310
    assert alert.details["throttle"] == ["thermal"]
    assert alert.details["reasons"] == ["hw_thermal_slowdown"]
    assert alert.details["onset_time"] == T0 + 10
    assert "thermal throttling for 300 s (hw_thermal_slowdown)" in alert.message


@pytest.mark.parametrize(
    "values",
    [
        [HW_THERMAL] * 50 + [0] + [HW_THERMAL] * 50,  # 250 s, a clear reading, 250 s
        [POWER_BRAKE] * 60,  # 295 s
        [SW_POWER_CAP] * 200,  # at the power cap: its rated speed
    ],
    ids=["interrupted", "brief", "sw-power-cap-alone"],
)
def test_throttling_not_sustained_or_not_counted_is_silent(values: list[float]) -> None:
    assert feed(detector(), series(GPU_CLOCK_EVENTS, values)) == []


def test_sw_power_cap_counts_when_configured() -> None:
    rule = detector(throttle_reasons=["sw_power_cap"], throttle_sustain_s=60)
    (alert,) = feed(rule, series(GPU_CLOCK_EVENTS, [SW_POWER_CAP | 0x01] * 20))
    assert alert.details["throttle"] == ["power"]
    assert alert.details["reasons"] == ["sw_power_cap"]


def test_throttle_resolves_once_clear_for_the_clear_period() -> None:
    values = [POWER_BRAKE | HW_THERMAL] * 70 + [0] * 20
    alerts = feed(detector(throttle_clear_s=60), series(GPU_CLOCK_EVENTS, values))
    assert [(a.resolves, a.time - T0) for a in alerts] == [(False, 300), (True, 405)]
    assert alerts[0].details["throttle"] == ["thermal", "power"]
    assert alerts[1].severity is Severity.INFO
    assert "gpu:0 throttling ended; every GPU healthy again" in alerts[1].message


def test_two_gpus_share_one_episode_resolved_when_both_are_clear() -> None:
    readings = sorted(
        series(GPU_CLOCK_EVENTS, [HW_THERMAL] * 70 + [0] * 30, GPU0)
        + series(GPU_CLOCK_EVENTS, [HW_THERMAL] * 90 + [0] * 30, GPU1)
    )
    alerts = feed(detector(throttle_clear_s=60), readings)
    # gpu:0 is clear at 405 s (60 s after its last throttled reading), gpu:1 at 505 s:
    # one resolve, once both are.
    assert [(a.source, a.resolves, a.time - T0) for a in alerts] == [
        (GPU0, False, 300),
        (GPU1, False, 300),
        (GPU1, True, 505),
    ]


# -- temperature -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("temps", "expected"),
    [
        ([80, 86, 80, 87, 80], []),
        ([80, 85, 86, 84, 83, 81, 79], [(Severity.WARNING, False, 10), (Severity.INFO, True, 30)]),
        ([80, 90, 90, 84, 82, 86, 90], [(Severity.WARNING, False, 10)]),
    ],
    ids=["single-readings-only", "sustained-then-cools", "hysteresis-holds-it-open"],
)
def test_temperature_with_hysteresis(
    temps: list[float], expected: list[tuple[Severity, bool, float]]
) -> None:
    alerts = feed(detector(), series(GPU_TEMP, temps))
    assert [(a.severity, a.resolves, a.time - T0) for a in alerts] == expected


def test_temperature_alert_names_the_gpu_and_value() -> None:
    (alert,) = feed(detector(), series(GPU_TEMP, [88, 89], GPU1))
    assert (alert.metric, alert.value, alert.source, alert.step) == (GPU_TEMP, 89, GPU1, 7)
    assert "gpu:1 at 89 C" in alert.message


def test_an_episode_of_another_kind_keeps_the_resolve_back() -> None:
    readings = [
        *series(GPU_TEMP, [90, 90, 70, 70]),  # hot episode: 5 s to 10 s
        (7, GPU1, GPU_XID, 13.0),  # warning XID: held 300 s
    ]
    rule = detector()
    alerts = feed(rule, sorted(readings))
    # gpu:0 cooled at 10 s, but gpu:1's XID episode was still open: no resolve then.
    assert [(a.resolves, a.source) for a in alerts] == [(False, GPU0), (False, GPU1)]
    (resolve,) = rule.tick(T0 + 400)
    assert resolve.resolves and resolve.source == GPU1


# -- the rule ----------------------------------------------------------------------------


def test_job_started_forgets_episodes_and_baselines() -> None:
    rule = detector()
    assert len(feed(rule, [*series(GPU_ECC_UNCORRECTED, [0, 1]), (20, GPU0, GPU_XID, 79.0)])) == 2
    rule.job_started(T0 + 30)
    # The count since driver load stays 1: the new attempt's baseline, no new error.
    assert feed(rule, [(40, GPU0, GPU_ECC_UNCORRECTED, 1.0), (45, GPU0, GPU_TEMP, 60.0)]) == []
    (alert,) = feed(rule, [(50, GPU0, GPU_ECC_UNCORRECTED, 2.0)])
    assert alert.severity is Severity.CRITICAL


def test_defaults_notify_on_critical_and_watch_only_health_samples() -> None:
    rule = detector()
    assert rule.config.on_critical == "notify"
    assert rule.watches == frozenset({GPU_XID, GPU_ECC_UNCORRECTED, GPU_CLOCK_EVENTS, GPU_TEMP})


def test_through_the_engine() -> None:
    engine = Engine([detector()], LineParser())
    alerts: list[Alert] = []
    for i in range(3):
        reading = [
            Sample(GPU_UTIL, 90.0),
            Sample(GPU_MEM_USED, 1e9),
            Sample(GPU_TEMP, 91.0),
            Sample(GPU_JOB, 1.0),
        ]
        alerts += engine.feed_system(GPU1, reading, T0 + 5 * i)
    alerts += engine.feed_system(GPU0, [Sample(GPU_XID, 79.0)], T0 + 12)
    assert summary(alerts) == [(Severity.WARNING, False, GPU1), (Severity.CRITICAL, False, GPU0)]
    assert engine.facts.job_gpus == {GPU1}


@pytest.mark.parametrize(
    "bad",
    [
        {"throttle_reasons": ["gpu_idle"]},
        {"max_temp_c": 0},
        {"temp_sustain": 0},
        {"xid_quiet_s": 0},
        {"on_critical": "reboot"},
        {"typo": 1},
    ],
    ids=["unknown-reason", "zero-temp", "zero-sustain", "zero-quiet", "bad-policy", "unknown-key"],
)
def test_config_rejects_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        GpuHealthConfig(**bad)
