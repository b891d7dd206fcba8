"""recovery: after a rollback, the resumed attempt is judged at the onset step against the
run's level before it, at any cadence and history length; a first attempt is never judged."""

from __future__ import annotations

import json

import pytest

from sentinel.config import load_settings
from sentinel.engine.core import Engine, build_detectors
from sentinel.model.facts import Resumed
from sentinel.model.records import Alert, Severity
from sentinel.parsing import LineParser


def _engine() -> Engine:
    settings = load_settings(None, environ={})
    return Engine(build_detectors(settings), LineParser(), data_clock=True)


def _feed(engine: Engine, steps: list[int], loss: object) -> list[Alert]:
    found: list[Alert] = []
    for step in steps:
        value = loss(step) if callable(loss) else loss
        line = json.dumps({"step": step, "loss": value})
        found += engine.feed_texts("train.log", [line], 0.0)
    return [alert for alert in found if alert.rule == "recovery"]


def _healthy(step: int) -> float:
    return 2.0 / (1 + step / 50)


def _restart(engine: Engine, onset: int, resumed_at: int) -> None:
    engine.job_started(0.0, resumed_at, Resumed(2, resumed_at, onset, "nan_inf"))


@pytest.mark.parametrize("every", [1, 10, 100])
@pytest.mark.parametrize("history", [2, 5, 40])
def test_a_restart_back_at_the_level_is_said_recovered_and_one_far_above_is_critical(
    every: int, history: int
) -> None:
    onset = 1000
    resumed_at = onset - every * max(1, history // 2)
    before = list(range(onset - every * history, onset, every))
    after = list(range(resumed_at, onset + 3 * every + 1, every))

    well = _engine()
    assert _feed(well, before, _healthy) == []
    _restart(well, onset, resumed_at)
    said = _feed(well, after, _healthy)
    assert [a.severity for a in said] == [Severity.INFO], said
    assert "recovered" in said[0].message and said[0].step is not None
    assert said[0].step >= onset

    sick = _engine()
    _feed(sick, before, _healthy)
    _restart(sick, onset, resumed_at)
    said = _feed(sick, after, lambda step: 13.2)
    assert [a.severity for a in said] == [Severity.CRITICAL], said
    alert = said[0]
    assert alert.message.startswith("the restart did not restore health: loss 13.2 at step")
    # Rolls back further: the checkpoint it resumed from is at the new onset.
    assert alert.onset_step == resumed_at
    assert alert.step is not None and alert.step >= onset


def test_nothing_is_judged_before_the_onset_step_a_resume_may_bump_and_settle() -> None:
    engine = _engine()
    _feed(engine, list(range(0, 100, 5)), _healthy)
    _restart(engine, onset=100, resumed_at=80)
    # A bump right after the resume (no optimizer state), settled by the onset.
    bumped = _feed(engine, [80, 85, 90, 95], 9.0)
    assert bumped == []
    said = _feed(engine, [100, 105], _healthy)
    assert [a.severity for a in said] == [Severity.INFO]


def test_a_first_attempt_and_a_restart_without_rollback_are_never_judged() -> None:
    engine = _engine()
    assert _feed(engine, list(range(0, 200, 5)), lambda step: 13.2 if step > 100 else 1.0) == []
    engine.job_started(0.0, 0)
    assert _feed(engine, list(range(0, 200, 5)), 13.2) == []


def test_an_attempt_that_ends_before_its_second_value_is_judged_on_its_one() -> None:
    engine = _engine()
    _feed(engine, [500, 1000, 1500, 2000, 2500], _healthy)  # a run that logs 6 values in all
    _restart(engine, onset=3000, resumed_at=2500)
    assert _feed(engine, [3000], 13.2) == []
    said = [a for a in engine.job_exited(0, 0.0, expected=False) if a.rule == "recovery"]
    assert [a.severity for a in said] == [Severity.CRITICAL]
    assert "13.2 at step 3000" in said[0].message


def test_within_the_runs_noise_is_recovered() -> None:
    engine = _engine()
    noisy = [1.0, 1.6, 0.9, 1.5, 1.0, 1.7, 0.95, 1.4, 1.05, 1.6]
    _feed(engine, list(range(10, 110, 10)), lambda step: noisy[step // 10 - 1])
    _restart(engine, onset=110, resumed_at=100)
    said = _feed(engine, [110, 120], 1.55)
    assert [a.severity for a in said] == [Severity.INFO], said


def test_back_within_the_band_a_per_batch_loss_showed_is_recovered() -> None:
    """A real Lightning run's per-batch loss, read off its bar at 3 digits (each value
    drawn twice by the bar, so its steps show little wobble): 0.17-0.34 before its NaN at
    149. The attempt resumed at 140 came back at 0.26, in that band: recovered. It was
    called unrecovered against 1.5 x the band's least (0.171), and rolled back 40 steps."""
    values = [0.24, 0.24, 0.31, 0.31, 0.22, 0.22, 0.27, 0.27, 0.33, 0.33]
    values += [0.25, 0.25, 0.34, 0.34, 0.171, 0.171, 0.30, 0.30, 0.26]
    steps = list(range(130, 149))
    engine = _engine()
    _feed(engine, steps, lambda step: values[step - 130])
    _restart(engine, onset=149, resumed_at=140)
    said = _feed(engine, [149, 150], lambda step: 0.2632)
    assert [a.severity for a in said] == [Severity.INFO], said
    sick = _engine()
    _feed(sick, steps, lambda step: values[step - 130])
    _restart(sick, onset=149, resumed_at=140)
    said = _feed(sick, [149, 150], lambda step: 0.9)
    assert [a.severity for a in said] == [Severity.CRITICAL], said
