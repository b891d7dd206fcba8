"""loss_plateau: a loss flat for a whole window and still near its initial level raises one info."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import pydantic
import pytest

from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.loss_plateau import LossPlateauConfig, LossPlateauDetector, window_level

NAN = math.nan
NOW = 1_700_000_000.0
INFO = Severity.INFO


def feed(detector: LossPlateauDetector, samples: Sequence[Sample]) -> list[Alert]:
    alerts: list[Alert] = []
    for sample in samples:
        alerts += detector.observe(sample, "train.log", NOW)
    return alerts


def losses(values: Sequence[float], first_step: int = 1) -> list[Sample]:
    return [Sample("loss", value, first_step + i) for i, value in enumerate(values)]


def run(values: Sequence[float], **config: Any) -> list[Alert]:
    return feed(LossPlateauDetector(LossPlateauConfig(**config)), losses(values))


def summary(alerts: Sequence[Alert]) -> list[tuple[Severity, int | None, int | None, bool]]:
    return [(alert.severity, alert.step, alert.onset_step, alert.resolves) for alert in alerts]


def flat(count: int, level: float, noise: float = 0.02, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [level + rng.uniform(-noise, noise) for _ in range(count)]


def gaussian(count: int, sigma: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0, sigma) for _ in range(count)]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (flat(500, 2.3), [(INFO, 200, 1, False)]),
        (flat(199, 2.3), []),
        ([10.0 * (1 - 0.0001 * step) for step in range(1, 601)], []),
        ([5.0 - 0.04 * step for step in range(100)] + flat(500, 1.0), []),
        ([-1.0] * 400, []),
    ],
    ids=[
        "flat-from-start-fires-once",
        "shorter-than-window-silent",
        "slow-steady-decrease-never-fires",
        "converged-low-flat-loss-silent",
        "negative-loss-not-judged",
    ],
)
def test_plateaus(values: list[float], expected: list[tuple[Severity, int, int, bool]]) -> None:
    assert summary(run(values)) == expected


def test_plateau_from_start_says_so() -> None:
    (alert,) = run([2.3] * 200)
    assert alert.rule == "loss_plateau"
    assert alert.details["kind"] == "plateau"
    assert alert.details["from_start"] is True
    assert alert.details["initial_level"] == 2.3
    assert alert.details["values"] == [2.3] * 10
    assert alert.message == (
        "loss flat at 2.3 over 200 logged values since step 1, the start of the run"
        " (improved 0.0%, less than 1%; 100% of its initial 2.3)"
    )


def test_a_loss_that_climbed_over_the_window_is_no_plateau() -> None:
    """A loss that rose past ``max_rise`` x where the window began has not flattened: it
    climbed (``divergence``'s finding); one that rose less is flat, and says it rose."""
    assert run([2.0 + 0.01 * i for i in range(400)]) == []
    (alert,) = run([2.0] * 100 + [2.2] * 200)
    assert "rose 10.0%, improved by nothing" in alert.message


def test_plateau_after_progress_is_not_from_start() -> None:
    # 2.3 is 92% of the initial 2.5: still high. The window is flat as soon as most of
    # its first ten values are at the plateau: the window of steps 47-246.
    (alert,) = run([2.5] * 50 + [2.3] * 300)
    assert (alert.step, alert.onset_step) == (246, 47)
    assert alert.details["from_start"] is False
    assert "since step 47" in alert.message


def test_resolves_when_the_loss_improves_past_the_bar() -> None:
    # The bar is 0.99 x 2.3; with five values at 2.2 the median of the last ten is 2.25.
    alerts = run([2.3] * 200 + [2.2] * 10)
    assert summary(alerts) == [(INFO, 200, 1, False), (INFO, 205, 1, True)]
    assert alerts[1].details["kind"] == "recovered"


def test_a_new_plateau_needs_a_whole_new_window() -> None:
    alerts = run([2.3] * 200 + [2.2] * 400)
    assert summary(alerts) == [(INFO, 200, 1, False), (INFO, 205, 1, True), (INFO, 405, 206, False)]
    assert alerts[2].details["from_start"] is False


@pytest.mark.parametrize(
    "values",
    [
        flat(20_000, 2.3, noise=0.1, seed=1),
        [2.3 * (1 + gauss) for gauss in gaussian(20_000, 0.05, seed=2)],
        [(2.3, 2.375)[flip > 0] for flip in gaussian(20_000, 1.0, seed=3)],
    ],
    ids=["uniform-4pct", "gaussian-10pct", "two-levels"],
)
@pytest.mark.slow
def test_a_flat_noisy_loss_is_one_episode_that_stays_open(values: list[float]) -> None:
    # Its medians of ten cross a 1% bar by chance: that must not resolve the plateau
    # (it opened and resolved once a window, 118 times in 10 s of a log flood).
    (opened,) = run(values)
    assert opened.details["kind"] == "plateau"
    assert not opened.resolves


@pytest.mark.parametrize("noise", [0.0, 0.05, 0.1], ids=["clean", "noise-5pct", "noise-10pct"])
def test_a_noisy_plateau_resolves_on_a_real_drop(noise: float) -> None:
    values = [2.3 * (1 + gauss) for gauss in gaussian(300, noise / 2, seed=4)]
    values += [1.9 * (1 + gauss) for gauss in gaussian(100, noise / 2, seed=5)]
    opened, resolved = run(values)
    assert (opened.resolves, resolved.resolves) == (False, True)
    assert resolved.step is not None and 300 < resolved.step <= 310


def test_window_level_is_the_median_and_the_dip_of_its_edge_medians() -> None:
    assert window_level([2.3] * 200, 10) == (2.3, 0.0)
    values = [2.0] * 10 + [1.0] * 6 + [2.0] * 10
    # The medians of ten dip to 1.5 (five 1.0 among ten) and to 1.0 at the run of six.
    assert window_level(values, 10) == (2.0, 1.0)


@pytest.mark.parametrize(
    ("config", "lr_values", "expected"),
    [
        ({}, [0.001 * step for step in range(51)] + [0.05] * 300, [(INFO, 250, 51, False)]),
        ({"warmup_steps": 100}, [], [(INFO, 299, 100, False)]),
    ],
    ids=["lr-still-rising", "warmup-steps"],
)
def test_warmup_is_ignored(
    config: dict[str, Any], lr_values: list[float], expected: list[tuple[Severity, int, int, bool]]
) -> None:
    detector = LossPlateauDetector(LossPlateauConfig(**config))
    samples: list[Sample] = []
    # The LR is logged from step 0, so that step 1 already knows it is rising.
    for step in range(350):
        if step < len(lr_values):
            samples.append(Sample("lr", lr_values[step], step))
        if step:
            samples.append(Sample("loss", 2.3, step))
    alerts = feed(detector, samples)
    assert summary(alerts) == expected
    assert alerts[0].details["from_start"] is True


def test_non_finite_values_are_skipped() -> None:
    # A NaN at every tenth step: the 200th finite value is at step 222.
    values = [NAN if step % 10 == 0 else 2.3 for step in range(1, 300)]
    assert summary(run(values)) == [(INFO, 222, 1, False)]


def test_severity_is_configurable() -> None:
    (alert,) = run([2.3] * 200, severity="warning")
    assert alert.severity is Severity.WARNING


def test_job_started_forgets_the_window() -> None:
    detector = LossPlateauDetector(LossPlateauConfig())
    assert feed(detector, losses([2.3] * 150)) == []
    detector.job_started(NOW)
    assert feed(detector, losses([2.3] * 199, first_step=100)) == []
    (alert,) = feed(detector, losses([2.3], first_step=299))
    assert (alert.onset_step, alert.details["from_start"]) == (100, False)


def test_job_started_keeps_the_runs_initial_level() -> None:
    detector = LossPlateauDetector(LossPlateauConfig())
    feed(detector, losses([5.0] * 10))
    detector.job_started(NOW)
    assert feed(detector, losses([2.0] * 300, first_step=5000)) == []


def test_watches_loss_and_lr() -> None:
    assert LossPlateauDetector(LossPlateauConfig()).watches == frozenset({"loss", "lr"})


@pytest.mark.parametrize(
    "config",
    [
        {"window": 3},
        {"edge_values": 0},
        {"window": 20, "edge_values": 11},
        {"min_improvement": -0.01},
        {"min_improvement": 1.0},
        {"high_fraction": 0},
        {"high_fraction": 1.5},
    ],
    ids=[
        "window-3",
        "edge-0",
        "edges-overlap",
        "negative-improvement",
        "improvement-1",
        "high-fraction-0",
        "high-fraction-over-1",
    ],
)
def test_config_rejects_bad_values(config: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        LossPlateauConfig(**config)


def test_default_severity_is_info() -> None:
    assert LossPlateauConfig().severity is Severity.INFO
