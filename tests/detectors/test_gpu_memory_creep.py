"""gpu_memory_creep: memory climbing step over step, or near capacity, warns once per episode."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pydantic
import pytest

from sentinel.model.machine import GPU_JOB, GPU_MEM_TOTAL, GPU_MEM_USED
from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.gpu_memory_creep import GpuMemoryCreepConfig, GpuMemoryCreepDetector

NOW = 1_700_000_000.0
WARMUP = 10


def feed(detector: GpuMemoryCreepDetector, samples: Sequence[Sample]) -> list[Alert]:
    alerts: list[Alert] = []
    for sample in samples:
        alerts += detector.observe(sample, "train.log", NOW)
    return alerts


def steps(
    values: Sequence[float], name: str = "gpu_mem_gb", first_step: int = WARMUP
) -> list[Sample]:
    return [Sample(name, value, first_step + i) for i, value in enumerate(values)]


def detector(**config: Any) -> GpuMemoryCreepDetector:
    return GpuMemoryCreepDetector(GpuMemoryCreepConfig(**config))


def leak(n: int, start: float = 10.0, by: float = 0.1) -> list[float]:
    """``n`` values climbing ``by`` per step after ``start``."""
    return [start + by * (i + 1) for i in range(n)]


FLAT = [10.0] * 31  # steps 10..40


def test_linear_creep_fires_once_with_its_onset() -> None:
    alerts = feed(detector(), steps([*FLAT, *leak(60)]))
    assert len(alerts) == 1
    (alert,) = alerts
    assert alert.rule == "gpu_memory_creep"
    assert alert.severity is Severity.WARNING
    assert not alert.resolves
    assert alert.details["kind"] == "creep"
    # 16 of the window's 19 changes are rises (>= 80%) at step 56; the climb began at 41.
    assert alert.step == 56
    assert alert.onset_step == 41
    assert alert.metric == "gpu_mem_gb"
    assert alert.details["growth"] == pytest.approx(0.16)
    assert alert.details["growth_per_step"] == pytest.approx(1.6 / 19)
    assert alert.details["capacity"] is None
    assert alert.details["projected_steps"] is None
    assert len(alert.details["values"]) == 20
    assert "16%" in alert.message


def test_creep_with_a_known_capacity_projects_the_steps_left() -> None:
    (alert,) = feed(detector(capacity=20.0), steps([*FLAT, *leak(20)]))
    assert alert.step == 56
    per_step = 1.6 / 19
    assert alert.details["projected_steps"] == math.ceil((20.0 - 11.6) / per_step)
    assert f"about {alert.details['projected_steps']} steps" in alert.message


def test_leak_with_an_occasional_free_still_fires() -> None:
    values = [*FLAT, *leak(30)]
    values[45] -= 0.3  # one dip (a freed cache) in the climb
    (alert,) = feed(detector(), steps(values))
    assert alert.details["kind"] == "creep"


@pytest.mark.parametrize(
    "values",
    [
        [10.0] * 100,
        [10.0 + 0.01 * ((i * 7) % 5) for i in range(100)],
        [10.0 if i % 2 else 11.0 for i in range(100)],
        [10.0 + 0.5 * (i % 5) for i in range(100)],  # climbs 4 steps, freed on the 5th
        [10.0 + 0.25 * (i % 10) for i in range(100)],  # climbs 9 steps, freed on the 10th
        [10.0 + 0.004 * i for i in range(100)],  # +0.04% a step: 0.8% a window
    ],
    ids=["flat", "noisy-flat", "alternating", "sawtooth-5", "sawtooth-10", "slow-drift"],
)
def test_no_creep_is_silent(values: list[float]) -> None:
    assert feed(detector(), steps(values)) == []


def test_creep_resolves_once_memory_stops_rising_for_a_window() -> None:
    values = [*FLAT, *leak(30), *[13.0] * 30]  # climbs from step 41 to 70, flat after
    alerts = feed(detector(), steps(values))
    assert [(a.resolves, a.severity, a.step) for a in alerts] == [
        (False, Severity.WARNING, 56),
        (True, Severity.INFO, 78),  # the first window that grew less than 10%
    ]


def test_each_metric_is_its_own_series() -> None:
    samples = []
    for i, value in enumerate([*FLAT, *leak(30)]):
        # Interleaved with a flat metric: only gpu_mem_gb creeps.
        samples += [
            Sample("gpu_mem_gb", value, WARMUP + i),
            Sample("memory_reserved", 20.0, WARMUP + i),
        ]
    (alert,) = feed(detector(), samples)
    assert alert.metric == "gpu_mem_gb"
    assert alert.step == 56


@pytest.mark.parametrize(
    ("config", "samples", "capacity"),
    [
        ({"capacity": 80.0}, steps([70.0] * 30 + [76.5]), 80.0),
        ({}, [Sample("gpu_memory_total", 80.0, 1), *steps([70.0] * 30 + [76.5])], 80.0),
        ({}, steps([70.0] * 30 + [96.0], name="memory/max_reserved(%)"), 100.0),
    ],
    ids=["capacity-from-config", "capacity-from-logged-total", "percent-metric"],
)
def test_near_capacity_fires(
    config: dict[str, Any], samples: list[Sample], capacity: float
) -> None:
    (alert,) = feed(detector(**config), samples)
    assert alert.details["kind"] == "capacity"
    assert alert.details["capacity"] == capacity
    assert alert.step == WARMUP + 30
    assert alert.onset_step == WARMUP + 30
    assert alert.severity is Severity.WARNING
    assert "OOM ahead" in alert.message


def test_below_the_capacity_bar_is_silent() -> None:
    assert feed(detector(capacity=80.0), steps([70.0] * 30 + [75.9])) == []


def test_capacity_resolves_when_back_under_the_bar() -> None:
    alerts = feed(detector(capacity=80.0), steps([70.0] * 5 + [77.0, 78.0, 77.0, 70.0, 77.0]))
    assert [(a.resolves, a.step) for a in alerts] == [(False, 15), (True, 18), (False, 19)]


def test_near_capacity_while_creeping_stays_one_episode() -> None:
    (alert,) = feed(detector(capacity=14.0), steps([*FLAT, *leak(50)]))
    assert alert.details["kind"] == "creep"  # the later capacity warning adds no alert


@pytest.mark.parametrize(
    ("config", "samples"),
    [
        (
            {"warmup_steps": 30},
            steps([10.0 + 0.5 * i for i in range(30)] + [25.0] * 40, first_step=0),
        ),
        ({"capacity": 80.0}, steps([79.0] * 10 + [60.0] * 40, first_step=0)),
        (
            {},
            [Sample("lr", 1e-6 * (i + 1), 20 + i) for i in range(40)]
            + steps([10.0 + 0.5 * i for i in range(40)], first_step=20),
        ),
    ],
    ids=["creep-in-warmup-steps", "capacity-in-warmup-steps", "creep-while-lr-rises"],
)
def test_warmup_is_not_judged(config: dict[str, Any], samples: list[Sample]) -> None:
    assert feed(detector(**config), samples) == []


def test_default_warmup_is_ten_steps() -> None:
    assert GpuMemoryCreepConfig().warmup_steps == 10
    assert feed(detector(capacity=80.0), steps([79.0], first_step=9)) == []
    assert len(feed(detector(capacity=80.0), steps([79.0], first_step=10))) == 1


def test_non_finite_values_are_ignored() -> None:
    samples = steps([*FLAT, *leak(20)])
    samples.insert(35, Sample("gpu_mem_gb", math.nan, 45))
    (alert,) = feed(detector(), samples)
    assert alert.step == 56
    assert all(math.isfinite(value) for value in alert.details["values"])


def test_the_same_step_read_twice_counts_once() -> None:
    # Every reading twice (a log line and its JSON file): the repeats are no flat changes.
    samples = [sample for sample in steps([*FLAT, *leak(20)]) for _ in range(2)]
    (alert,) = feed(detector(), samples)
    assert alert.step == 56


@pytest.mark.parametrize(
    ("nvml", "expected"),
    [
        (False, {"gpu_mem", "gpu_mem_total", "lr"}),
        (True, {"gpu_mem", "gpu_mem_total", "lr", GPU_MEM_USED, GPU_MEM_TOTAL, GPU_JOB}),
    ],
    ids=["logged-only", "with-nvml"],
)
def test_watches_memory_capacity_metrics_and_lr(nvml: bool, expected: set[str]) -> None:
    rule = detector(metrics=["gpu_mem"], capacity_metrics=["gpu_mem_total"], nvml=nvml)
    assert rule.watches == frozenset(expected)


def test_job_started_forgets_the_series() -> None:
    creeping = detector()
    assert len(feed(creeping, steps([*FLAT, *leak(20)]))) == 1
    creeping.job_started(NOW)
    # The restarted attempt counts its steps from 10 again and creeps again: a new episode.
    (alert,) = feed(creeping, steps([*FLAT, *leak(20)]))
    assert alert.step == 56


@pytest.mark.parametrize(
    "bad",
    [
        {"window": 2},
        {"rising_fraction": 0.0},
        {"rising_fraction": 1.5},
        {"min_growth": 0.0},
        {"capacity": 0.0},
        {"capacity_fraction": 0.0},
        {"capacity_fraction": 1.5},
        {"warmup_steps": -1},
        {"leak": True},
    ],
    ids=[
        "tiny-window",
        "zero-rising-fraction",
        "rising-fraction-above-one",
        "zero-growth",
        "zero-capacity",
        "zero-capacity-fraction",
        "capacity-fraction-above-one",
        "negative-warmup",
        "unknown-key",
    ],
)
def test_config_rejects_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        GpuMemoryCreepConfig(**bad)


# -- NVML readings (gpu_mem_used_bytes per GPU) ---------------------------------------------

GIB = 2**30
GPU0, GPU1 = "gpu:0", "gpu:1"


def nvml(
    rule: GpuMemoryCreepDetector,
    used_gib: dict[str, list[float]],
    total_gib: dict[str, float] | None = None,
    job: dict[str, float] | None = None,
    per_step: int = 3,
    first_step: int | None = WARMUP,
) -> list[Alert]:
    """Readings every 5 s, ``per_step`` of them a step: each GPU's used, total, gpu_job."""
    totals = total_gib or {}
    attached = job or {}
    alerts: list[Alert] = []
    for i in range(max(len(values) for values in used_gib.values())):
        now = NOW + 5 * i
        step = None if first_step is None else first_step + i // per_step
        for gpu, values in sorted(used_gib.items()):
            reading = [
                Sample(GPU_MEM_USED, values[i] * GIB, step),
                Sample(GPU_MEM_TOTAL, totals.get(gpu, 80.0) * GIB, step),
                Sample(GPU_JOB, attached.get(gpu, 1.0), step),
            ]
            for sample in reading:
                alerts += rule.observe(sample, gpu, now)
    return alerts


def attached(rule: GpuMemoryCreepDetector, *gpus: str) -> GpuMemoryCreepDetector:
    """A reading before the series began attributed ``gpus`` to the job."""
    for gpu in gpus:
        rule.observe(Sample(GPU_JOB, 1.0), gpu, NOW - 5)
    return rule


def climbing(n: int, start_gib: float = 40.0, by_gib: float = 1.0) -> list[float]:
    return [start_gib + by_gib * i for i in range(n)]


def test_nvml_creep_on_one_gpu_of_two() -> None:
    rule = attached(detector(), GPU0, GPU1)
    alerts = nvml(rule, {GPU0: climbing(30), GPU1: [40.0] * 30})
    (alert,) = alerts
    assert alert.details["kind"] == "creep"
    assert (alert.source, alert.metric, alert.value) == (GPU0, GPU_MEM_USED, 59 * GIB)
    assert alert.time == NOW + 5 * 19  # the 20th level
    assert alert.details["capacity"] == 80 * GIB
    assert alert.message.startswith(
        "gpu_mem_used_bytes on gpu:0 climbed 48% over 20 values since step 10"
        " (40.00 GiB to 59.00 GiB"
    )


@pytest.mark.parametrize(
    ("used_gib", "total_gib", "gpu"),
    [
        ({GPU0: [70.0] * 5 + [76.5] * 5, GPU1: [70.0] * 10}, {}, GPU0),
        ({GPU0: [120.0] * 10, GPU1: [76.5] * 10}, {GPU0: 141.0}, GPU1),
    ],
    ids=["the-full-one", "capacity-of-its-own-gpu"],
)
def test_nvml_near_the_gpus_own_capacity(
    used_gib: dict[str, list[float]], total_gib: dict[str, float], gpu: str
) -> None:
    rule = attached(detector(), GPU0, GPU1)
    (alert,) = nvml(rule, used_gib, total_gib)
    assert alert.details["kind"] == "capacity"
    assert alert.source == gpu
    assert alert.details["capacity"] == 80 * GIB
    assert "on " + gpu + " at 76.50 GiB is 96% of capacity 80.00 GiB: OOM ahead" in alert.message


# The caching allocator reserves in steps while it finds its working set, then holds;
# empty_cache() or a different batch shape gives some back and takes it again.
STAIRCASE = [2.0] * 6 + [20.0] * 9 + [31.0] * 4 + [34.0] * 12 + [35.0] * 300
RESERVE_AND_RELEASE = [30.0 + 4.0 * ((i // 7) % 2) for i in range(300)]
JITTER = [35.0 + 0.002 * ((i * 7) % 5) for i in range(300)]


@pytest.mark.parametrize(
    "used_gib",
    [STAIRCASE, RESERVE_AND_RELEASE, JITTER, climbing(40, by_gib=0.01)],
    ids=["allocator-staircase", "reserve-and-release", "jitter", "growth-under-the-bar"],
)
def test_nvml_allocator_patterns_are_no_leak(used_gib: list[float]) -> None:
    rule = attached(detector(), GPU0)
    assert nvml(rule, {GPU0: used_gib}) == []


@pytest.mark.parametrize(
    ("job", "first_step"),
    [({GPU0: 0.0}, WARMUP), ({}, None), ({}, 0)],
    ids=["another-jobs-gpu", "before-the-first-step", "in-warmup-steps"],
)
def test_nvml_not_judged(job: dict[str, float], first_step: int | None) -> None:
    rule = detector()
    if job.get(GPU0, 1.0):
        attached(rule, GPU0)
    assert nvml(rule, {GPU0: climbing(30)}, job=job, first_step=first_step) == []


def test_nvml_creep_resolves_once_memory_holds_for_a_window() -> None:
    rule = attached(detector(), GPU0)
    alerts = nvml(rule, {GPU0: climbing(25) + [64.0] * 25})
    # Climbs until reading 24, then 20 readings on one level: clear at reading 44.
    assert [(a.resolves, a.time - NOW) for a in alerts] == [(False, 95), (True, 220)]
    assert alerts[1].source == GPU0


def test_nvml_gpu_leaving_the_job_resolves() -> None:
    rule = attached(detector(), GPU0)
    alerts = nvml(rule, {GPU0: [70.0] * 3 + [77.0] * 3})
    alerts += nvml(rule, {GPU0: [77.0] * 3}, job={GPU0: 0.0})
    assert [(a.resolves, a.details.get("kind")) for a in alerts] == [
        (False, "capacity"),
        (True, None),
    ]
    assert alerts[1].message == "GPU memory steady again (gpu:0 left the job)"


def test_nvml_off_ignores_gpu_readings() -> None:
    rule = attached(detector(nvml=False), GPU0)
    assert nvml(rule, {GPU0: [79.0] * 30}) == []
