"""The statistical rules on real runs (``tests/fixtures/divergence``, made by
``make_divergence_runs.py``): an LR jump that never recovers is rolled back to before the
jump, a warmup divergence warns well before the NaN, a per-epoch rhythm is the run's normal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.model.records import Alert, Severity

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "divergence"


def expected(run: str) -> dict[str, Any]:
    return json.loads((RUNS / run / "expected.json").read_text(encoding="utf-8"))


def raised(path: Path) -> list[Alert]:
    result = replay([path], load_settings(None, environ={}))
    opened = [alert for alert in result.alerts if not alert.resolves]
    return [alert for alert in opened if alert.severity > Severity.INFO]


@pytest.mark.parametrize("artifact", ["trainer_state.json", "train.log"])
def test_an_lr_jump_that_never_recovers_is_rolled_back_to_before_the_jump(artifact: str) -> None:
    truth = expected("lr_jump")
    logging = truth["hyperparameters"]["logging_steps"]
    alerts = raised(RUNS / "lr_jump" / artifact)
    criticals = [alert for alert in alerts if alert.severity == Severity.CRITICAL]
    # The jump of the logged rate acts with the loss risen two logged values on; the
    # divergence of the loss, confirmed 10 values on, names the same onset.
    assert [alert.rule for alert in criticals] == ["lr_jump", "divergence"]
    critical = criticals[0]
    assert critical.onset_step is not None
    assert critical.step is not None and critical.step <= truth["jump_step"] + 2 * logging
    # The onset is the last step logged at the old rate: the rate changed after it, and a
    # checkpoint saved at that step already holds the new one (transformers logs the rate a
    # step ran at, and saves after the scheduler's step). (The train.log's steps come from
    # the progress bars.)
    assert truth["jump_step"] - logging <= critical.onset_step < truth["jump_step"]
    clean = max(step for step in truth["checkpoint_steps"] if step < critical.onset_step)
    assert clean == truth["last_clean_checkpoint"]
    assert all(alert.step is not None and alert.step >= critical.onset_step for alert in alerts)


@pytest.mark.parametrize("artifact", ["trainer_state.json", "train.log"])
def test_the_divergence_names_the_learning_rate_jump_behind_it(artifact: str) -> None:
    """The diagnosis reads the jump the rule saw (the last 8 samples no longer hold it)."""
    truth = expected("lr_jump")
    logging = truth["hyperparameters"]["logging_steps"]
    result = replay([RUNS / "lr_jump" / artifact], load_settings(None, environ={}))
    (critical,) = [a for a in result.alerts if a.rule == "divergence" and not a.resolves]
    step, before, after = critical.details["lr_jump"]
    assert truth["jump_step"] - logging <= step <= truth["jump_step"]
    assert after / before == pytest.approx(120, rel=0.01)
    assert critical.details["diagnosis"]["cause"].startswith(
        "the loss or grad-norm rose after the logged learning rate jumped 120x"
    )


@pytest.mark.parametrize("artifact", ["trainer_state.json", "train.log"])
def test_a_warmup_divergence_is_stopped_five_logged_steps_before_the_first_nan(
    artifact: str,
) -> None:
    """The loss millions of times its median with the grad-norm thousands of times its own
    on the same record: a blow-up, critical on that first value, long before the NaN."""
    truth = expected("warmup_diverge")
    logging = truth["hyperparameters"]["logging_steps"]
    alerts = raised(RUNS / "warmup_diverge" / artifact)
    nan = next(alert for alert in alerts if alert.rule == "nan_inf")
    first = next(alert for alert in alerts if alert.severity == Severity.CRITICAL)
    assert (first.rule, first.details["kind"]) == ("loss_spike", "blow_up")
    # On the record of the first alert of all (its loss may warn before its grad-norm is read).
    assert first.step == alerts[0].step
    assert first.step is not None and nan.step is not None
    assert (nan.step - first.step) // logging >= 5


def test_a_per_epoch_rhythm_is_the_runs_normal() -> None:
    truth = expected("rhythm")
    alerts = raised(RUNS / "rhythm" / "metrics.csv")
    assert [alert for alert in alerts if alert.severity == Severity.CRITICAL] == []
    # The first epoch may look odd (nothing to compare it with yet); the rhythm after never.
    assert [a.step for a in alerts if (a.step or 0) >= truth["steps_per_epoch"]] == []
