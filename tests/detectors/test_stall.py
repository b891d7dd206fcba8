"""stall: silence past the soft timeout warns, past the hard one is critical; progress resolves."""

from __future__ import annotations

from collections.abc import Callable

import pydantic
import pytest

from sentinel.detectors.stall import StallConfig, StallDetector
from sentinel.records import Alert, Line, Sample, Severity

T0 = 1_700_000_000.0
SOFT = 600.0
HARD = 1800.0


def started(at: float = T0) -> StallDetector:
    detector = StallDetector(StallConfig(soft_timeout_s=SOFT, hard_timeout_s=HARD))
    detector.job_started(at)
    return detector


def ticks(detector: StallDetector, offsets: list[float]) -> list[Alert]:
    alerts: list[Alert] = []
    for offset in offsets:
        alerts += detector.tick(T0 + offset)
    return alerts


@pytest.mark.parametrize(
    "silent_s", [0.0, 1.0, SOFT / 2, SOFT - 0.001], ids=["zero", "1s", "half-soft", "just-below"]
)
def test_silence_below_soft_raises_nothing(silent_s: float) -> None:
    assert ticks(started(), [silent_s]) == []


def test_soft_timeout_warns_once() -> None:
    alerts = ticks(started(), [SOFT, SOFT + 1, SOFT + 100, HARD - 1])
    assert len(alerts) == 1
    assert alerts[0].severity is Severity.WARNING
    assert alerts[0].rule == "stall"
    assert not alerts[0].resolves


def test_hard_timeout_escalates_to_one_critical() -> None:
    alerts = ticks(started(), [SOFT, HARD, HARD + 1, HARD * 3])
    assert [a.severity for a in alerts] == [Severity.WARNING, Severity.CRITICAL]


def test_jump_straight_past_hard_gives_only_critical() -> None:
    alerts = ticks(started(), [HARD + 5])
    assert [a.severity for a in alerts] == [Severity.CRITICAL]
    assert alerts[0].value == pytest.approx(HARD + 5)


def test_alert_names_last_step_and_onset_is_the_next_step() -> None:
    detector = started()
    detector.observe(Sample("loss", 2.0, 41), "stdout", T0 + 10)
    (alert,) = ticks(detector, [10 + SOFT])
    assert alert.step == 41
    assert alert.onset_step == 42
    assert alert.metric == "silence_s"


@pytest.mark.parametrize(
    "progress",
    [
        lambda d: d.output(Line("stdout", "still alive", T0 + 500)),
        lambda d: d.observe(Sample("loss", 2.0, 11), "stdout", T0 + 500),
    ],
    ids=["output-line", "new-step"],
)
def test_progress_resets_the_silence(progress: Callable[[StallDetector], object]) -> None:
    detector = started()
    detector.observe(Sample("loss", 2.0, 10), "stdout", T0)
    progress(detector)
    assert ticks(detector, [SOFT + 100]) == []  # 600 s after T0, only 100 s after progress
    assert [a.severity for a in ticks(detector, [500 + SOFT])] == [Severity.WARNING]


def test_repeated_same_step_is_not_progress() -> None:
    detector = started()
    detector.observe(Sample("loss", 2.0, 10), "stdout", T0)
    detector.observe(Sample("loss", 2.0, 10), "stdout", T0 + 500)
    detector.observe(Sample("grad_norm", 1.0, 10), "stdout", T0 + 550)
    alerts = ticks(detector, [SOFT])
    assert [a.severity for a in alerts] == [Severity.WARNING]


def test_lower_step_is_not_progress() -> None:
    detector = started()
    detector.observe(Sample("loss", 2.0, 10), "stdout", T0)
    detector.observe(Sample("loss", 2.0, 9), "stdout", T0 + 500)
    assert [a.severity for a in ticks(detector, [SOFT])] == [Severity.WARNING]


def test_progress_after_warning_resolves() -> None:
    detector = started()
    detector.observe(Sample("loss", 2.0, 10), "stdout", T0)
    ticks(detector, [SOFT])
    (resolved,) = detector.observe(Sample("loss", 2.0, 11), "stdout", T0 + SOFT + 5)
    assert resolved.resolves
    assert resolved.rule == "stall"
    assert resolved.severity is Severity.INFO
    assert resolved.step == 11


def test_output_after_critical_resolves_once() -> None:
    detector = started()
    ticks(detector, [HARD])
    first = detector.output(Line("stdout", "back", T0 + HARD + 1))
    second = detector.output(Line("stdout", "again", T0 + HARD + 2))
    assert [a.resolves for a in first] == [True]
    assert second == []


def test_progress_without_a_stall_resolves_nothing() -> None:
    detector = started()
    assert detector.output(Line("stdout", "hello", T0 + 5)) == []
    assert detector.observe(Sample("loss", 1.0, 1), "stdout", T0 + 6) == []


def test_stall_again_after_resolve_warns_again() -> None:
    detector = started()
    ticks(detector, [SOFT])
    detector.output(Line("stdout", "back", T0 + SOFT + 1))
    alerts = ticks(detector, [2 * SOFT + 1])
    assert [a.severity for a in alerts] == [Severity.WARNING]


def test_nothing_before_job_started_or_first_data() -> None:
    detector = StallDetector(StallConfig(soft_timeout_s=SOFT, hard_timeout_s=HARD))
    assert detector.tick(T0) == []
    assert detector.tick(T0 + HARD * 10) == []


def test_samples_before_job_started_do_not_start_the_clock() -> None:
    # The engine starts the clock (job_started): live at launch, in replay at the first timestamp.
    detector = StallDetector(StallConfig(soft_timeout_s=SOFT, hard_timeout_s=HARD))
    detector.observe(Sample("loss", 2.0, 1, time=T0), "m.jsonl", 0.0)
    assert ticks(detector, [SOFT, HARD * 2]) == []


def test_job_started_resets_level_and_clock() -> None:
    detector = started()
    ticks(detector, [HARD])
    detector.job_started(T0 + HARD + 10)
    assert ticks(detector, [HARD + 10 + SOFT - 1]) == []
    assert [a.severity for a in ticks(detector, [HARD + 10 + SOFT])] == [Severity.WARNING]


@pytest.mark.parametrize(
    ("soft", "hard"), [(600.0, 600.0), (600.0, 300.0)], ids=["hard-equals-soft", "hard-below-soft"]
)
def test_config_rejects_hard_not_after_soft(soft: float, hard: float) -> None:
    with pytest.raises(pydantic.ValidationError, match="hard_timeout_s must be greater"):
        StallConfig(soft_timeout_s=soft, hard_timeout_s=hard)


def test_config_defaults_are_ten_and_thirty_minutes() -> None:
    config = StallConfig()
    assert (config.soft_timeout_s, config.hard_timeout_s) == (600.0, 1800.0)
