"""grad_norm_run: grad-norm high for a run of steps, or clipping on most steps, warns once."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import pydantic
import pytest

from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.grad_norm_run import GradNormRunConfig, GradNormRunDetector

NAN = math.nan
INF = math.inf
NOW = 1_700_000_000.0
WARN, INFO = Severity.WARNING, Severity.INFO
CALM = [1.0] * 5


def feed(detector: GradNormRunDetector, samples: Sequence[Sample]) -> list[Alert]:
    alerts: list[Alert] = []
    for sample in samples:
        alerts += detector.observe(sample, "train.log", NOW)
    return alerts


def norms(values: Sequence[float], first_step: int = 1) -> list[Sample]:
    return [Sample("grad_norm", value, first_step + i) for i, value in enumerate(values)]


def run(values: Sequence[float], **config: Any) -> list[Alert]:
    return feed(GradNormRunDetector(GradNormRunConfig(**config)), norms(values))


def summary(alerts: Sequence[Alert]) -> list[tuple[Severity, int | None, int | None, bool]]:
    return [(alert.severity, alert.step, alert.onset_step, alert.resolves) for alert in alerts]


def noisy(count: int, low: float, high: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(low, high) for _ in range(count)]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([*CALM, 20.0, 20.0, 20.0], [(WARN, 8, 6, False)]),
        ([*CALM, 20.0, 20.0, 1.0, 20.0, 20.0, 1.0], [(WARN, 9, 6, False)]),
        ([*CALM, 20.0, 20.0, 1.0, 1.0, 20.0, 20.0, 1.0, 1.0], []),
        ([*CALM, 10.0, 10.0, 10.0], []),
        ([1.06, 347424.0, 458866.0, 507514.0, NAN, NAN], [(WARN, 4, 2, False)]),
        ([*CALM, 20.0, NAN, 20.0, INF, 20.0], [(WARN, 10, 6, False)]),
        ([*CALM, 20.0, 20.0, 20.0, *[1.0] * 5], [(WARN, 8, 6, False), (INFO, 13, 6, True)]),
        (
            [*CALM, 20.0, 20.0, 20.0, *[1.0] * 4, 20.0, *[1.0] * 5],
            [(WARN, 8, 6, False), (INFO, 18, 6, True)],
        ),
        (
            [*CALM, *[20.0] * 3, *[1.0] * 5, *[20.0] * 3],
            [(WARN, 8, 6, False), (INFO, 13, 6, True), (WARN, 16, 14, False)],
        ),
        ([*CALM, *[20.0] * 30], [(WARN, 8, 6, False)]),
    ],
    ids=[
        "absolute-run-fires-at-third-consecutive-step",
        "runs-of-two-one-dip-apart-fire",
        "runs-of-two-two-dips-apart-never-fire",
        "at-threshold-is-not-above",
        "diverging-series-fires-before-the-nan",
        "non-finite-values-are-skipped",
        "resolves-after-five-normal-values",
        "high-value-restarts-the-resolve-count",
        "separate-runs-are-separate-episodes",
        "one-alert-for-a-long-run",
    ],
)
def test_absolute_runs(
    values: list[float], expected: list[tuple[Severity, int, int, bool]]
) -> None:
    assert summary(run(values)) == expected


def test_absolute_alert_says_the_numbers() -> None:
    (alert,) = run([*CALM, 20.0, 30.0, 40.0])
    assert alert.rule == "grad_norm_run"
    assert alert.message == "grad_norm above 10 for 3 consecutive steps since step 6 (now 40)"
    assert alert.metric == "grad_norm"
    assert alert.value == 40.0
    assert alert.details["kind"] == "absolute"
    assert alert.details["threshold"] == 10.0
    assert alert.details["values"] == [*CALM, 20.0, 30.0, 40.0]
    assert alert.details["steps"] == list(range(1, 9))
    assert alert.details["onset_step"] == 6


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([*[1.0] * 20, 6.0, 6.0, 6.0], [(WARN, 23, 21, False)]),
        ([*[1.0] * 20, 6.0, 6.0], []),
        ([*[1.0] * 20, 4.9, 4.9, 4.9], []),
        ([*[1.0] * 9, 6.0, 6.0, 6.0], []),
        ([*[1.0] * 10, *[6.0] * 30], [(WARN, 13, 11, False)]),
    ],
    ids=[
        "relative-run-fires",
        "relative-run-of-two-silent",
        "under-relative-factor-silent",
        "relative-needs-min-history",
        "run-values-are-not-learned-into-the-median",
    ],
)
def test_relative_runs(
    values: list[float], expected: list[tuple[Severity, int, int, bool]]
) -> None:
    assert summary(run(values)) == expected


def test_relative_alert_details() -> None:
    (alert,) = run([*[1.0] * 20, 6.0, 7.0, 8.0])
    assert alert.details["kind"] == "relative"
    assert alert.details["median"] == 1.0
    assert alert.details["threshold"] == 5.0
    assert alert.message == (
        "grad_norm 8 at step 23 is 8.0x its rolling median 1,"
        " above 5x for 3 consecutive steps since step 21"
    )


def test_clipping_on_most_steps_warns() -> None:
    (alert,) = run([0.9, *[1.2] * 19], max_grad_norm=1.0)
    assert summary([alert]) == [(WARN, 20, 2, False)]
    assert alert.message == (
        "clipping engaged on 19 of the last 20 steps (grad_norm >= max_grad_norm 1.0):"
        " the learning rate is likely too high"
    )
    assert alert.details["kind"] == "clipping"
    assert alert.details["clipped"] == 19
    assert alert.details["threshold"] == 1.0
    assert alert.details["values"] == [0.9, *[1.2] * 19]


@pytest.mark.parametrize(
    ("clipped", "fires"),
    [(17, False), (18, True), (20, True)],
    ids=["17-of-20", "18-of-20", "20-of-20"],
)
def test_clip_fraction_is_the_bar(clipped: int, fires: bool) -> None:
    values = [0.5] * (20 - clipped) + [1.0] * clipped
    assert bool(run(values, max_grad_norm=1.0)) is fires


def test_clipping_needs_a_full_clip_window() -> None:
    assert run([1.5] * 19, max_grad_norm=1.0) == []


def test_clipping_and_runs_share_one_episode() -> None:
    alerts = run([*[1.5] * 20, 20.0, 20.0, 20.0], max_grad_norm=1.0)
    assert [alert.details["kind"] for alert in alerts] == ["clipping"]


def test_clipping_resolves_once_under_the_fraction_for_five_steps() -> None:
    # 19/20 and 18/20 clipped still hold the episode; 17/20 at step 23 is the first calm one.
    alerts = run([*[1.5] * 20, *[0.5] * 7], max_grad_norm=1.0)
    assert summary(alerts) == [(WARN, 20, 1, False), (INFO, 27, 1, True)]


@pytest.mark.parametrize(
    ("values", "config"),
    [
        (noisy(2000, 0.9, 1.1), {}),
        (noisy(2000, 0.89, 1.09), {"max_grad_norm": 1.0}),
    ],
    ids=["healthy-noisy-series", "healthy-clipping-45-percent"],
)
def test_healthy_series_is_silent(values: list[float], config: dict[str, Any]) -> None:
    if "max_grad_norm" in config:
        clipped = sum(value >= 1.0 for value in values) / len(values)
        assert 0.4 < clipped < 0.5
    assert run(values, **config) == []


@pytest.mark.parametrize(
    ("config", "lr_values"),
    [({}, [0.1 * i for i in range(1, 11)] + [1.0] * 10), ({"warmup_steps": 10}, [])],
    ids=["lr-still-rising", "warmup-steps"],
)
def test_warmup_is_ignored(config: dict[str, Any], lr_values: list[float]) -> None:
    detector = GradNormRunDetector(GradNormRunConfig(max_grad_norm=1.0, **config))
    grad_norms = [50.0] * 9 + [1.0] * 4 + [20.0] * 3  # high through step 9, a run at 14-16
    samples: list[Sample] = []
    for step in range(1, 17):
        if step <= len(lr_values):
            samples.append(Sample("lr", lr_values[step - 1], step))
        samples.append(Sample("grad_norm", grad_norms[step - 1], step))
    assert summary(feed(detector, samples)) == [(WARN, 16, 14, False)]


def test_watches_grad_norm_and_lr() -> None:
    assert GradNormRunDetector(GradNormRunConfig()).watches == frozenset({"grad_norm", "lr"})


def test_job_started_resets_run_and_episode() -> None:
    detector = GradNormRunDetector(GradNormRunConfig())
    assert feed(detector, norms([1.0, 20.0, 20.0])) == []
    detector.job_started(NOW)
    assert feed(detector, norms([1.0, 20.0], first_step=3)) == []  # the run starts again
    assert summary(feed(detector, norms([20.0, 20.0], first_step=5))) == [(WARN, 6, 4, False)]
    detector.job_started(NOW)
    # The least grad-norm is forgotten too: a fresh attempt never under the bar has
    # shown no normal under it yet.
    assert feed(detector, norms([20.0] * 3, first_step=3)) == []


def test_alert_time_is_the_sample_time() -> None:
    detector = GradNormRunDetector(GradNormRunConfig(sustain=1))
    assert detector.observe(Sample("grad_norm", 1.0, 6, time=120.0), "m.jsonl", NOW) == []
    (alert,) = detector.observe(Sample("grad_norm", 20.0, 7, time=123.5), "m.jsonl", NOW)
    assert (alert.time, alert.source, alert.step) == (123.5, "m.jsonl", 7)


@pytest.mark.parametrize(
    "config",
    [
        {"threshold": 0},
        {"sustain": 0},
        {"factor": 1.0},
        {"window": 0},
        {"min_history": 0},
        {"min_history": 60},
        {"max_grad_norm": 0},
        {"clip_fraction": 0},
        {"clip_fraction": 1.5},
        {"clip_window": 0},
        {"resolve_after": 0},
    ],
    ids=[
        "threshold-0",
        "sustain-0",
        "factor-1",
        "window-0",
        "min-history-0",
        "min-history-over-window",
        "max-grad-norm-0",
        "clip-fraction-0",
        "clip-fraction-over-1",
        "clip-window-0",
        "resolve-0",
    ],
)
def test_config_rejects_bad_values(config: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        GradNormRunConfig(**config)


def test_a_relative_run_inside_the_runs_own_wobble_is_not_high() -> None:
    # A tiny grad-norm that wobbles 0.001-0.009: three values of 0.008 are 5.3x the median.
    wobble = [0.001, 0.005, 0.002, 0.009, 0.0015, 0.001, 0.004, 0.002, 0.006, 0.0015]
    assert run([*wobble * 5, 0.008, 0.008, 0.008]) == []
    # Against a steady level the same run is high.
    alerts = run([*[0.0015] * 50, 0.008, 0.008, 0.008])
    assert [(alert.details["kind"], alert.onset_step) for alert in alerts] == [("relative", 51)]


def with_rising_lr(values: Sequence[float]) -> list[Sample]:
    samples: list[Sample] = []
    for step, value in enumerate(values, start=1):
        samples += [Sample("lr", 1e-4 * step, step), Sample("grad_norm", value, step)]
    return samples


def test_warmup_relaxes_but_a_run_far_above_the_early_values_warns_once() -> None:
    detector = GradNormRunDetector(GradNormRunConfig())
    values = [1.4, 1.2, 2.0, 1.3, 1.9e4, 4.4e4, 6.6e4, 1.7e5, 1.2e5]
    alerts = feed(detector, with_rising_lr(values))
    assert summary(alerts) == [(WARN, 7, 5, False)]
    assert alerts[0].details["kind"] == "warmup"
    assert "10x the least it has been, 1.2" in alerts[0].message


def test_warmup_high_values_that_are_not_a_run_only_learn() -> None:
    detector = GradNormRunDetector(GradNormRunConfig())
    # Big early norms falling, and single jumps: normal in warmup.
    values = [50.0, 20.0, 5.0, 1.0, 15.0, 1.0, 0.9, 12.0, 13.0, 1.0]
    assert feed(detector, with_rising_lr(values)) == []


def test_in_warmup_a_batch_with_no_gradient_is_no_yardstick() -> None:
    """A real GRPO run (tests/corpus/healthy/unsloth-grpo-bimodal-gradnorm): on steps where
    every group had one reward the grad-norm is 1e-4 and less, amid 0.37-0.9; 10x such a
    value is no "far above the run's own early values". A grad-norm falling 10x a value at
    most still lowers the yardstick: the warmup run above still warns."""
    values = [0.7478, 0.458, 0.3709, 2.784e-05, 0.4626, 0.4445, 1.434e-04, 0.4498, 1.659e-04]
    values += [0.6747, 0.6072, 0.4049, 0.385, 0.6862, 0.9363]
    assert feed(GradNormRunDetector(GradNormRunConfig()), with_rising_lr(values)) == []
    falling = [2.0, 0.5, 0.1, 0.05, 0.9, 1.2, 1.1]
    alerts = feed(GradNormRunDetector(GradNormRunConfig()), with_rising_lr(falling))
    assert [(a.details["kind"], a.onset_step) for a in alerts] == [("warmup", 5)]


def test_the_absolute_bar_needs_a_run_that_has_been_under_it() -> None:
    # An fp16 run logging scaled norms: 1e6 from the first step is its normal.
    assert run([2.1e6, 2.2e6, 1.4e6, 1.5e6, 1.6e6, 1.8e6]) == []
    alerts = run([2.0, 15.0, 15.0, 15.0])
    assert [(alert.details["kind"], alert.onset_step) for alert in alerts] == [("absolute", 2)]


def test_a_run_whose_normal_sits_near_the_absolute_bar_is_judged_by_its_own_level() -> None:
    # A BERT fine-tune (healthy corpus): grad-norm wobbling 4.6-16 around 8.5 from the start.
    values = [8.39, 9.29, 4.57, 7.94, 15.88, 8.24, 11.75, 8.63, 12.61, 10.1, 13.76, 9.0]
    assert run(values) == []
    # Far above that level it is still high.
    alerts = run([*values, 60.0, 70.0, 80.0])
    assert [(alert.details["kind"], alert.onset_step) for alert in alerts] == [("relative", 13)]


def test_a_leap_of_orders_of_magnitude_warns_on_its_own_value() -> None:
    """A real fairseq fconv run (facebookresearch/fairseq issue #41), a value every 1,000
    steps: gnorm 2.05, 1.71, 2.75, then 100,616 at step 4000; its loss exploded at 5000.
    Three values above the bar would have been 3,000 steps."""
    detector = GradNormRunDetector(GradNormRunConfig())
    values = [2.054, 1.7149, 2.7501, 100615.8788]
    (alert,) = feed(
        detector, [Sample("grad_norm", v, 1000 * (i + 1)) for i, v in enumerate(values)]
    )
    assert (alert.severity, alert.step, alert.details["kind"]) == (Severity.WARNING, 4000, "leap")
    assert "3.66e+04x the highest it has been (2.75)" in alert.message


@pytest.mark.parametrize(
    ("before", "jump", "raised"),
    [
        pytest.param([1.0] * 12, 1500.0, True, id="1500x-its-median"),
        pytest.param([1.0] * 12, 500.0, False, id="500x-waits-for-a-run"),
        pytest.param([2.0, 2.0], 5000.0, False, id="two-values-are-no-level"),
    ],
)
def test_a_leap_needs_a_level_and_three_orders_of_magnitude(
    before: list[float], jump: float, raised: bool
) -> None:
    alerts = run([*before, jump])
    assert [a.details["kind"] for a in alerts] == (["leap"] if raised else [])


def test_a_leap_that_stays_is_one_episode() -> None:
    alerts = run([1.0] * 12 + [1500.0, 1600.0, 1700.0, 1800.0])
    assert [a.details["kind"] for a in alerts] == ["leap"]


def test_one_dip_under_the_bar_does_not_end_a_run() -> None:
    """A real HF run's grad-norm exploding with its loss rising: 0.24, 0.27, 1.36, 1.28, then
    17.2, 7.1, 21.8, 23.0, 3.77, 14.4. Each dip under 10 ended the run of 3 it needed."""
    values = [0.24, 0.27, 1.36, 1.28, 17.2, 7.1, 21.8, 23.0, 3.77, 14.4]
    alerts = [a for a in run(values) if not a.resolves]
    assert [(a.severity, a.step, a.onset_step) for a in alerts] == [(Severity.WARNING, 8, 5)]
    assert "3 of 4 logged steps since step 5" in alerts[0].message


def test_two_dips_in_a_row_end_the_run() -> None:
    assert [a for a in run([0.3, 0.3, 0.3, 17.0, 5.0, 4.0, 18.0, 19.0]) if not a.resolves] == []
