"""gpu_idle: the job's GPUs idle for a window while it runs warn once, with the money wasted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
import pytest

from sentinel.engine.core import Engine
from sentinel.model.facts import RunFacts
from sentinel.model.machine import GPU_JOB, GPU_MEM_USED, GPU_UTIL
from sentinel.model.records import Alert, Sample, Severity
from sentinel.parsing import LineParser
from sentinel.rules.gpu_idle import GpuIdleConfig, GpuIdleDetector

T0 = 1_700_000_000.0
GPU0, GPU1, GPU2 = "gpu:0", "gpu:1", "gpu:2"
IDLE, BUSY = 0.0, 97.0


def detector(price: float | None = None, gpus: int | None = None, **config: Any) -> GpuIdleDetector:
    rule = GpuIdleDetector(GpuIdleConfig(**config))
    rule.facts = RunFacts(price_per_gpu_hour=price, gpus=gpus)
    return rule


def started(rule: GpuIdleDetector, gpus: Sequence[str]) -> GpuIdleDetector:
    """The job started at T0 - 120 s; a reading at T0 - 60 s attributed ``gpus`` to it."""
    rule.job_started(T0 - 120)
    for gpu in gpus:
        rule.observe(Sample(GPU_JOB, 1.0), gpu, T0 - 60)
    return rule


def run(
    rule: GpuIdleDetector,
    utils: Mapping[str, Sequence[float]],
    every_s: float = 60.0,
    from_s: float = 0.0,
    job: Mapping[str, float] | None = None,
) -> list[Alert]:
    """Readings every ``every_s`` from T0 + ``from_s``: each GPU's util, then its gpu_job."""
    alerts: list[Alert] = []
    for i in range(max(len(values) for values in utils.values())):
        now = T0 + from_s + i * every_s
        for gpu, values in sorted(utils.items()):
            if i < len(values):
                alerts += rule.observe(Sample(GPU_UTIL, values[i], 40 + i), gpu, now)
                attached = 1.0 if job is None else job.get(gpu, 1.0)
                alerts += rule.observe(Sample(GPU_JOB, attached), gpu, now)
    return alerts


def test_money_wasted_for_a_known_timeline() -> None:
    rule = started(detector(price=2.5), [GPU0, GPU1, GPU2])
    alerts = run(rule, {GPU0: [IDLE] * 20, GPU1: [IDLE] * 20, GPU2: [BUSY] * 20})
    (alert,) = alerts
    # Both idle from T0: at T0 + 900 s that is 1800 GPU-seconds, 0.5 GPU-hours, 1.25 at 2.50 each.
    assert alert.time == T0 + 900
    assert alert.severity is Severity.WARNING
    assert (alert.metric, alert.value, alert.source, alert.step) == (GPU_UTIL, IDLE, GPU0, 55)
    assert alert.details["onset_time"] == T0
    assert alert.details["wasted"] == {"gpu_hours": 0.5, "money": 1.25}
    assert alert.details["idle_gpus"] == [GPU0, GPU1]
    assert alert.message.startswith(
        "2 of 3 GPUs idle for 15 min while the job runs (gpu:0, gpu:1):"
        " 1.25 wasted so far (at 2.50/GPU-hour)"
    )


def test_without_a_price_the_waste_is_in_gpu_hours() -> None:
    rule = started(detector(), [GPU0, GPU1])
    (alert,) = run(rule, {GPU0: [IDLE] * 20, GPU1: [BUSY] * 20})
    assert alert.details["wasted"] == {"gpu_hours": 0.25, "money": None}
    assert "1 of 2 GPUs idle for 15 min" in alert.message
    assert "0.25 GPU-hours wasted so far" in alert.message
    assert "wasted so far (at" not in alert.message  # no price: no money


def test_configured_gpu_count_is_the_whole() -> None:
    rule = started(detector(gpus=8), [GPU0, GPU1])
    (alert,) = run(rule, {GPU0: [IDLE] * 20, GPU1: [IDLE] * 20})
    assert alert.message.startswith("2 of 8 GPUs idle")


@pytest.mark.parametrize(
    ("utils", "job"),
    [
        ({GPU0: [IDLE] * 15}, None),  # the last reading at 840 s
        ({GPU0: [IDLE] * 10 + [BUSY] + [IDLE] * 15}, None),  # 840 s after the busy reading
        ({GPU0: [5.0] * 30}, None),  # at the bar is not under it
        ({GPU0: [IDLE] * 30}, {GPU0: 0.0}),  # another job's GPU
    ],
    ids=["before-the-window", "busy-reading-restarts-the-clock", "at-the-bar", "not-the-jobs"],
)
def test_silent(utils: dict[str, list[float]], job: dict[str, float] | None) -> None:
    rule = detector()
    rule.job_started(T0 - 120)
    if job is None:
        rule.observe(Sample(GPU_JOB, 1.0), GPU0, T0 - 60)
    assert run(rule, utils, job=job) == []


def test_not_before_the_job_started() -> None:
    rule = detector()
    rule.observe(Sample(GPU_JOB, 1.0), GPU0, T0 - 60)
    assert run(rule, {GPU0: [IDLE] * 30}) == []


def test_job_exit_resolves_the_episode_and_nothing_follows() -> None:
    rule = started(detector(price=4.0), [GPU0])
    assert len(run(rule, {GPU0: [IDLE] * 16})) == 1  # idle 0 s to 900 s
    (resolve,) = rule.job_exited(1, T0 + 1800, expected=False)
    assert resolve.resolves and resolve.severity is Severity.INFO
    assert resolve.details["wasted"] == {"gpu_hours": 0.5, "money": 2.0}
    assert resolve.message == "the job exited: no GPU of the job idle any more; 2.00 wasted in all"
    assert run(rule, {GPU0: [IDLE] * 40}, from_s=1860) == []


def test_job_exit_without_an_episode_is_silent() -> None:
    rule = started(detector(), [GPU0])
    run(rule, {GPU0: [IDLE] * 10})
    assert rule.job_exited(0, T0 + 600, expected=False) == []


def test_one_alert_per_episode_and_resolved_when_every_gpu_is_busy() -> None:
    rule = started(detector(price=1.0), [GPU0, GPU1])
    utils = {
        GPU0: [IDLE] * 25 + [BUSY] * 10,  # idle 0 s to 1440 s, busy at 1500 s
        GPU1: [BUSY] * 5 + [IDLE] * 21 + [BUSY] * 9,  # idle 300 s to 1500 s, busy at 1560 s
    }
    alerts = run(rule, utils)
    assert [(a.resolves, a.time - T0, a.source) for a in alerts] == [
        (False, 900, GPU0),
        (True, 1560, GPU1),  # gpu:1 joined at 1200 s; gpu:0 busy at 1500 s is not the end
    ]
    (alert, resolve) = alerts
    assert alert.details["idle_gpus"] == [GPU0]
    # 1500 s of gpu:0 and 1260 s of gpu:1.
    assert resolve.details["wasted"]["gpu_hours"] == pytest.approx(2760 / 3600)
    assert resolve.details["wasted"]["money"] == pytest.approx(2760 / 3600)


def test_a_gpu_leaving_the_job_ends_its_idleness() -> None:
    rule = started(detector(), [GPU0])
    alerts = run(rule, {GPU0: [IDLE] * 20}, job={GPU0: 1.0})
    alerts += run(rule, {GPU0: [IDLE] * 20}, from_s=1200, job={GPU0: 0.0})
    assert [(a.resolves, a.time - T0) for a in alerts] == [(False, 900), (True, 1200)]
    assert "gpu:0 left the job" in alerts[1].message


def test_a_new_attempt_starts_counting_again() -> None:
    rule = started(detector(), [GPU0])
    assert len(run(rule, {GPU0: [IDLE] * 20})) == 1
    started(rule, [GPU0])
    (alert,) = run(rule, {GPU0: [IDLE] * 20}, from_s=2000)
    assert alert.time == T0 + 2900
    assert alert.details["onset_time"] == T0 + 2000


def test_through_the_engine() -> None:
    engine = Engine([detector()], LineParser())
    engine.facts = RunFacts(price_per_gpu_hour=3.0)
    engine.job_started(T0 - 60)
    alerts: list[Alert] = []
    for i in range(16):
        for gpu in (GPU0, GPU1):
            reading = [Sample(GPU_UTIL, IDLE), Sample(GPU_MEM_USED, 1e9), Sample(GPU_JOB, 1.0)]
            alerts += engine.feed_system(gpu, reading, T0 + 60 * i)
    (alert,) = alerts
    # The engine's facts attribute both GPUs before the rule sees their first util reading.
    assert alert.time == T0 + 900
    assert alert.details["idle_gpus"] == [GPU0, GPU1]
    assert alert.details["wasted"] == {"gpu_hours": 0.5, "money": 1.5}
    assert alert.message.startswith("2 of 2 GPUs idle for 15 min")


def test_watches_only_util_and_attribution() -> None:
    assert detector().watches == frozenset({GPU_UTIL, GPU_JOB})


@pytest.mark.parametrize(
    "bad",
    [{"idle_util_percent": 0}, {"idle_util_percent": 101}, {"sustain_s": 0}, {"typo": 1}],
    ids=["zero-bar", "bar-above-100", "zero-window", "unknown-key"],
)
def test_config_rejects_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        GpuIdleConfig(**bad)
