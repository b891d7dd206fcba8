"""nan_inf: the first non-finite value of any watched metric opens one critical episode."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pytest

from sentinel.detectors.nan_inf import NanInfConfig, NanInfDetector
from sentinel.records import Alert, Sample, Severity

NAN = math.nan
INF = math.inf
NOW = 1_700_000_000.0


def feed(detector: NanInfDetector, samples: Sequence[Sample]) -> list[Alert]:
    alerts: list[Alert] = []
    for sample in samples:
        alerts += detector.observe(sample, "train.log", NOW)
    return alerts


def steps(name: str, values: Sequence[float], first_step: int = 1) -> list[Sample]:
    return [Sample(name, value, first_step + i) for i, value in enumerate(values)]


@pytest.mark.parametrize(
    ("value", "json_value"),
    [(NAN, "nan"), (INF, "inf"), (-INF, "-inf")],
    ids=["nan", "+inf", "-inf"],
)
def test_fires_once_on_non_finite_value(value: float, json_value: str) -> None:
    detector = NanInfDetector(NanInfConfig())
    alerts = feed(detector, steps("loss", [2.0, 1.9, value, 1.8]))
    assert len(alerts) == 1
    alert = alerts[0]
    assert alert.rule == "nan_inf"
    assert alert.severity is Severity.CRITICAL
    assert alert.step == 3
    assert alert.onset_step == 3
    assert alert.metric == "loss"
    assert not alert.resolves
    assert alert.to_json()["value"] == json_value


@pytest.mark.parametrize(
    ("value", "json_value"),
    [(NAN, "nan"), (INF, "inf"), (-INF, "-inf")],
    ids=["nan", "+inf", "-inf"],
)
def test_alert_json_is_strict_json(value: float, json_value: str) -> None:
    detector = NanInfDetector(NanInfConfig())
    (alert,) = feed(detector, [Sample("loss", value, 5)])
    text = json.dumps(alert.to_json(), allow_nan=False)
    decoded = json.loads(text)
    assert decoded["value"] == json_value
    assert decoded["rule"] == "nan_inf"
    assert decoded["severity"] == "critical"
    assert decoded["step"] == 5
    assert set(decoded) == {
        "rule",
        "severity",
        "step",
        "metric",
        "value",
        "message",
        "time",
        "source",
    }


def test_any_metric_is_watched_grad_norm_nan_while_loss_finite() -> None:
    detector = NanInfDetector(NanInfConfig())
    samples = [
        Sample("loss", 2.0, 10),
        Sample("grad_norm", 1.5, 10),
        Sample("loss", 2.0, 20),
        Sample("grad_norm", NAN, 20),
    ]
    alerts = feed(detector, samples)
    assert [(a.metric, a.step) for a in alerts] == [("grad_norm", 20)]


def test_one_alert_per_episode_across_metrics_and_repeats() -> None:
    detector = NanInfDetector(NanInfConfig())
    samples = [
        Sample("loss", NAN, 7),
        Sample("grad_norm", NAN, 7),
        Sample("loss", NAN, 8),
        Sample("grad_norm", INF, 8),
    ]
    alerts = feed(detector, samples)
    assert len(alerts) == 1
    assert alerts[0].onset_step == 7


def test_onset_step_is_the_first_non_finite_step() -> None:
    detector = NanInfDetector(NanInfConfig())
    (alert,) = feed(detector, steps("loss", [2.0] * 41 + [NAN], first_step=0))
    assert alert.step == 41
    assert alert.onset_step == 41
    assert "41" in alert.message


def test_alert_time_is_the_sample_time_when_it_has_one() -> None:
    detector = NanInfDetector(NanInfConfig())
    (alert,) = detector.observe(Sample("loss", NAN, 3, time=123.5), "m.jsonl", NOW)
    assert alert.time == 123.5
    assert alert.source == "m.jsonl"


def test_alert_time_is_now_when_sample_has_no_time() -> None:
    detector = NanInfDetector(NanInfConfig())
    (alert,) = detector.observe(Sample("loss", NAN, 3), "stdout", NOW)
    assert alert.time == NOW


@pytest.mark.parametrize(
    ("config", "metric", "fires"),
    [
        (NanInfConfig(metrics=["loss"]), "loss", True),
        (NanInfConfig(metrics=["loss"]), "grad_norm", False),
        (NanInfConfig(ignore=["loss_scale"]), "loss_scale", False),
        (NanInfConfig(ignore=["loss_scale"]), "loss", True),
        (NanInfConfig(metrics=["loss"], ignore=["loss"]), "loss", False),
    ],
    ids=[
        "watched-metric",
        "unwatched-metric",
        "ignored-metric",
        "not-ignored-metric",
        "ignore-beats-metrics",
    ],
)
def test_metrics_and_ignore_select_what_is_watched(
    config: NanInfConfig, metric: str, fires: bool
) -> None:
    detector = NanInfDetector(config)
    alerts = feed(detector, [Sample(metric, INF, 4)])
    assert bool(alerts) is fires


def test_resolves_after_resolve_after_finite_values() -> None:
    detector = NanInfDetector(NanInfConfig(resolve_after=3))
    alerts = feed(detector, steps("loss", [NAN, 1.0, 1.0], first_step=1))
    assert len(alerts) == 1
    (resolved,) = feed(detector, [Sample("loss", 1.0, 4)])
    assert resolved.resolves
    assert resolved.rule == "nan_inf"
    assert resolved.severity is Severity.INFO
    assert resolved.step == 4


def test_resolve_waits_for_every_offending_metric() -> None:
    detector = NanInfDetector(NanInfConfig(resolve_after=2))
    feed(detector, [Sample("loss", NAN, 1), Sample("grad_norm", NAN, 1)])
    alerts = feed(detector, steps("loss", [1.0, 1.0, 1.0], first_step=2))
    assert alerts == []
    (resolved,) = feed(detector, steps("grad_norm", [1.0, 1.0], first_step=2))
    assert resolved.resolves


def test_non_finite_during_recovery_restarts_the_count() -> None:
    detector = NanInfDetector(NanInfConfig(resolve_after=3))
    alerts = feed(detector, steps("loss", [NAN, 1.0, 1.0, NAN, 1.0, 1.0], first_step=1))
    assert len(alerts) == 1  # still one episode, not resolved yet
    assert not alerts[0].resolves
    (resolved,) = feed(detector, [Sample("loss", 1.0, 7)])
    assert resolved.resolves


def test_new_episode_after_resolve_fires_again() -> None:
    detector = NanInfDetector(NanInfConfig(resolve_after=1))
    alerts = feed(detector, steps("loss", [NAN, 1.0, INF], first_step=1))
    assert [(a.resolves, a.step) for a in alerts] == [(False, 1), (True, 2), (False, 3)]


def test_finite_values_alone_raise_nothing() -> None:
    detector = NanInfDetector(NanInfConfig())
    assert feed(detector, steps("loss", [2.0, 1e30, -1e30, 0.0])) == []


def test_job_started_resets_the_episode() -> None:
    detector = NanInfDetector(NanInfConfig())
    assert len(feed(detector, [Sample("loss", NAN, 50)])) == 1
    detector.job_started(NOW)
    alerts = feed(detector, [Sample("loss", NAN, 40)])
    assert len(alerts) == 1
    assert alerts[0].onset_step == 40
