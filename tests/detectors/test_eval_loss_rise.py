"""eval_loss_rise: eval loss climbing from its best while train loss falls warns once."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pydantic
import pytest

from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.eval_loss_rise import TASK_METRICS, EvalLossRiseConfig, EvalLossRiseDetector

NOW = 1_700_000_000.0
EVAL_EVERY = 100


def feed(detector: EvalLossRiseDetector, samples: Sequence[Sample]) -> list[Alert]:
    alerts: list[Alert] = []
    for sample in samples:
        alerts += detector.observe(sample, "train.log", NOW)
    return alerts


def run(
    evals: Sequence[float],
    train: Sequence[float] | None = None,
    *,
    first_eval_step: int = EVAL_EVERY,
) -> list[Sample]:
    """An eval every 100 steps; before each, 10 train losses (one every 10 steps)."""
    samples: list[Sample] = []
    for i, value in enumerate(evals):
        step = first_eval_step + i * EVAL_EVERY
        if train is not None:
            samples += [Sample("loss", train[i], step - 90 + 10 * k) for k in range(10)]
        samples.append(Sample("eval_loss", value, step))
    return samples


def falling(n: int, start: float = 3.0, by: float = 0.1) -> list[float]:
    return [start - by * i for i in range(n)]


def rising(n: int, start: float = 1.0, by: float = 0.1) -> list[float]:
    return [start + by * i for i in range(n)]


def detector(**config: Any) -> EvalLossRiseDetector:
    return EvalLossRiseDetector(EvalLossRiseConfig(**config))


OVERFIT = [3.0, 2.8, 2.7, 2.69, 2.75, 2.83, 2.91, 2.95, 3.0, 3.1]


def test_overfit_curve_fires_once_at_the_third_rise_with_the_best_step() -> None:
    alerts = feed(detector(), run(OVERFIT, falling(len(OVERFIT))))
    assert len(alerts) == 1
    (alert,) = alerts
    assert alert.rule == "eval_loss_rise"
    assert alert.severity is Severity.WARNING
    assert not alert.resolves
    assert alert.step == 700
    assert alert.onset_step == 500  # the first eval after the best
    assert alert.metric == "eval_loss"
    assert alert.value == 2.91
    assert alert.details["best_step"] == 400
    assert alert.details["best_value"] == 2.69
    assert alert.details["kind"] == "rises"
    assert alert.details["values"] == [2.69, 2.75, 2.83, 2.91]
    assert alert.details["train_at_best"] == pytest.approx(2.7)
    assert alert.details["train_now"] == pytest.approx(2.4)
    assert alert.message == (
        "eval_loss rose 3 evaluations in a row to 2.91, 8% above its best 2.69 at step 400,"
        " while train loss fell from 2.7 to 2.4: overfitting;"
        " the best checkpoint is the one at step 400"
    )


def test_margin_above_the_best_fires_without_consecutive_rises() -> None:
    # 2.3 is 15% above 2.0, after a dip; 2.25, 12%, the second evaluation past the margin.
    evals = [3.0, 2.5, 2.0, 2.05, 2.02, 2.01, 2.03, 2.3, 2.25]
    (alert,) = feed(detector(), run(evals, falling(len(evals))))
    assert alert.step == 900
    assert alert.onset_step == 400
    assert alert.details["kind"] == "margin"
    assert alert.details["best_step"] == 300
    assert "12% above its best 2 at step 300" in alert.message


def test_one_evaluation_past_the_margin_that_comes_back_is_no_rise() -> None:
    evals = [3.0, 2.5, 2.0, 2.05, 2.02, 2.01, 2.03, 2.3, 2.02, 2.03]
    assert feed(detector(), run(evals, falling(len(evals)))) == []
    assert feed(detector(margin_evals=1), run(evals, falling(len(evals))))[0].step == 800


#: A crystal-graph regression's validation loss (its first 30 epochs of 300, healthy: new
#: bests kept coming to epoch 265), on a validation set of a few hundred structures: one
#: epoch 2-4x the one before now and then, and back.
CGCNN_VALID = [
    70.66, 58.69, 59.80, 125.75, 47.12, 73.27, 85.77, 66.59, 59.10, 43.13, 33.05, 48.42,
    70.31, 32.33, 34.03, 60.45, 34.04, 39.62, 31.81, 35.78, 41.49, 39.59, 33.11, 66.97,
    37.44, 77.32, 27.84, 44.23, 32.07, 28.00,
]  # fmt: skip


def test_a_rise_within_the_excursions_the_run_came_back_from_is_no_rise() -> None:
    """Its first excursion (125.75 over 58.69, one evaluation) came back: the next ones, as
    far above their best (73, 86 over 47), are the run's own wobble, not an overfit."""
    train = falling(len(CGCNN_VALID), start=145.0, by=3.0)
    assert feed(detector(), run(CGCNN_VALID, train)) == []


def test_an_overfit_past_the_runs_own_excursions_still_warns() -> None:
    """After excursions of 20% that came back, a climb to 40% above the best that stays."""
    evals = [3.0, 2.5, 2.0, 2.4, 1.9, 2.28, 1.8, 2.16, 1.7, 1.9, 2.1, 2.3, 2.38, 2.4]
    alerts = feed(detector(), run(evals, falling(len(evals))))
    assert [(a.step, a.details["best_value"]) for a in alerts] == [(1400, 1.7)]
    # 41% above 1.7: past the 20% the run came back from, and its zigzag's own noise.
    assert alerts[0].value == 2.4


def test_a_margin_inside_the_evals_own_wobble_is_no_rise() -> None:
    # Keras on MNIST (healthy corpus): each eval 10-30% off the one before, new bests keep
    # coming.
    evals = [0.5, 0.050, 0.033, 0.037, 0.032, 0.031, 0.034, 0.026, 0.031, 0.023, 0.030, 0.023]
    assert feed(detector(), run(evals, falling(len(evals)))) == []
    # The same margin after a steady stretch is a rise.
    steady = [0.050, 0.033, 0.0232, 0.0231, 0.0230, 0.0231, 0.0230, 0.030, 0.029]
    (alert,) = feed(detector(), run(steady, falling(len(steady))))
    assert alert.details["kind"] == "margin"


@pytest.mark.parametrize(
    ("evals", "train"),
    [
        ([3.0, 2.9, 2.95, 2.8, 2.85, 2.7, 2.75, 2.6, 2.62, 2.5], falling(10)),
        ([3.0, 2.9, 2.95, 2.97, 2.85, 2.7], falling(6)),
        ([2.0, 2.02, 2.05, 2.09], rising(4)),
        ([2.0, 2.02, 2.05, 2.3], [1.5] * 4),
    ],
    ids=[
        "noisy-but-improving",
        "two-rises-then-better",
        "train-loss-rising-too",
        "train-loss-flat",
    ],
)
def test_not_overfitting_is_silent(evals: list[float], train: list[float]) -> None:
    assert feed(detector(), run(evals, train)) == []


def test_without_train_loss_eval_alone_is_enough() -> None:
    (alert,) = feed(detector(), run(OVERFIT))
    assert alert.step == 700
    assert alert.details["train_now"] is None
    assert "no train loss logged" in alert.message


def test_best_eval_before_any_train_loss_compares_with_the_first_train_level_after_it() -> None:
    samples = [Sample("eval_loss", 2.0, 100)]  # evaluated before training logged anything
    samples += run([2.05, 2.1, 2.15], [1.5, 1.4, 1.3], first_eval_step=200)
    (alert,) = feed(detector(), samples)
    assert alert.step == 400
    assert alert.details["train_at_best"] == 1.5
    assert alert.details["train_now"] == 1.3


def test_new_best_resolves_the_episode() -> None:
    evals = [*OVERFIT[:7], 2.6]
    alerts = feed(detector(), run(evals, falling(len(evals))))
    assert [(a.resolves, a.severity, a.step) for a in alerts] == [
        (False, Severity.WARNING, 700),
        (True, Severity.INFO, 800),
    ]
    assert "new best 2.6" in alerts[1].message


def test_rises_after_a_resolve_open_a_new_episode() -> None:
    evals = [*OVERFIT[:7], 2.6, 2.65, 2.7, 2.8]
    alerts = feed(detector(), run(evals, falling(len(evals))))
    assert [(a.resolves, a.step, a.onset_step) for a in alerts] == [
        (False, 700, 500),
        (True, 800, None),
        (False, 1100, 900),
    ]
    assert alerts[2].details["best_step"] == 800


def test_rises_from_config() -> None:
    (alert,) = feed(detector(rises=2, noise_sigmas=0.0), run(OVERFIT, falling(len(OVERFIT))))
    assert alert.step == 600


def test_evals_in_warmup_are_ignored() -> None:
    # The eval at step 100 (in warmup) would be the best, and 2.0 100% above it.
    evals = [1.0, 2.0, 2.05, 2.1]
    assert len(feed(detector(), run(evals))) == 1
    assert feed(detector(warmup_steps=150), run(evals)) == []


def test_an_evaluation_with_the_rates_first_value_was_in_a_warmup_seen_after_it() -> None:
    """A real YOLOv8 fine-tune (its results.csv, an evaluation an epoch): the learning rate
    rises for 34 epochs, seen rising only at its second value; its epoch-1 evaluation, the
    lowest until then, stood as "the best" and was the checkpoint to keep."""
    evals = [1.0, 2.0, 2.05, 2.1, 2.15]
    samples: list[Sample] = []
    for index, value in enumerate(evals):
        step = index + 1
        rate = 1e-4 * step if step <= 3 else 3e-4
        samples += [Sample("lr", rate, step), Sample("eval_loss", value, step)]
    assert feed(detector(), samples) == []


def test_the_same_evaluation_twice_counts_once() -> None:
    samples = run([2.0, 2.1, 2.2])
    samples += [Sample("eval_loss", 2.3, 300)]  # a re-read of step 300, as a rise
    assert feed(detector(), samples) == []


def test_non_finite_eval_is_ignored() -> None:
    evals = [2.69, math.nan, 2.75, 2.83, 2.91]
    (alert,) = feed(detector(), run(evals))
    assert alert.details["values"] == [2.69, 2.75, 2.83, 2.91]


@pytest.mark.parametrize("metrics", ["val_acc_loss", ["val_acc_loss"]], ids=["string", "list"])
def test_watches_eval_train_and_lr(metrics: str | list[str]) -> None:
    watched = detector(metrics=metrics).watches
    assert watched is not None and {"val_acc_loss", "loss", "lr"} <= watched
    assert watched - {"val_acc_loss", "loss", "lr"} == TASK_METRICS.keys()


def test_job_started_forgets_the_best() -> None:
    rose = detector()
    assert len(feed(rose, run(OVERFIT))) == 1
    rose.job_started(NOW)
    # The restarted attempt evaluates from step 100 again and rises from a new best.
    (alert,) = feed(rose, run([2.0, 2.1, 2.2, 2.3]))
    assert alert.details["best_step"] == 100


def test_an_earlier_step_starts_a_new_run_judged_from_its_own_best() -> None:
    """Keras' CSVLogger appending runs to one file: the second run starts again at the
    first step, far above the first run's best, and falls; it is not overfitting."""
    first = run(falling(5, start=2.0), falling(5, start=2.5))  # best 1.6 at step 500
    second = run(falling(9, start=3.0), falling(9, start=3.5))  # down to 2.2 at step 900
    assert feed(detector(), first + second) == []
    # Overfitting inside the second run is still caught, against the second run's best.
    (alert,) = feed(detector(), first + run(OVERFIT, falling(10, start=3.5)))
    assert alert.details["best_step"] == 400


@pytest.mark.parametrize(
    "bad",
    [
        {"rises": 0},
        {"margin": 0.0},
        {"margin": -0.1},
        {"train_window": 0},
        {"metrics": ""},
        {"metrics": "loss"},
        {"metrics": ["eval_loss", "val_loss"]},
        {"metrics": [""]},
        {"severity": "loud"},
        {"patience": 3},
    ],
    ids=[
        "no-rises",
        "zero-margin",
        "negative-margin",
        "no-train-window",
        "empty-metric",
        "metric-is-train-metric",
        "two-eval-metrics",
        "empty-metric-in-a-list",
        "unknown-severity",
        "unknown-key",
    ],
)
def test_config_rejects_bad_values(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        EvalLossRiseConfig(**bad)


#: A Whisper-small fine-tune's evaluations (its trainer_state.json): the eval loss rises at
#: every evaluation after the first while the WER it is judged by falls to its best at
#: step 4000, the checkpoint the run kept.
WHISPER = [(0.307, 34.63), (0.356, 33.13), (0.421, 32.59), (0.452, 32.01), (0.468, 32.10)]


def _with_task(metric: str, pairs: list[tuple[float, float]]) -> list[Sample]:
    samples: list[Sample] = []
    for index, (loss, task) in enumerate(pairs):
        step = 1000 * (index + 1)
        samples += [
            Sample("loss", 0.5 - 0.05 * index - 0.001 * k, step - 90 + 10 * k) for k in range(10)
        ]
        samples += [Sample("eval_loss", loss, step), Sample(metric, task, step)]
    return samples


def test_an_eval_loss_that_rises_while_the_task_metric_improves_is_no_overfit() -> None:
    assert feed(detector(), _with_task("eval_wer", WHISPER)) == []
    # The same eval loss, with a WER that got worse since its best: an overfit.
    worse = [(loss, 30.0 + index) for index, (loss, _) in enumerate(WHISPER)]
    (alert,) = feed(detector(), _with_task("eval_wer", worse))
    assert (alert.step, alert.details["best_step"]) == (3000, 1000)  # 2 evaluations 10% up


def test_a_higher_better_task_metric_that_improves_keeps_it_quiet() -> None:
    rising = [(loss, 0.80 + 0.01 * index) for index, (loss, _) in enumerate(WHISPER)]
    assert feed(detector(), _with_task("eval_accuracy", rising)) == []


def test_a_log_whose_last_evaluation_is_past_the_margin_warns_at_its_end() -> None:
    """A 3-epoch BERT fine-tune (its trainer_state.json): the last evaluation 12% above its
    best, the accuracy down: no second evaluation comes to confirm it live."""
    evals = [0.8084, 0.8074, 0.9018]
    accuracy = [0.681, 0.682, 0.674]
    samples = _with_task("eval_accuracy", list(zip(evals, accuracy, strict=True)))
    rule = detector()
    assert feed(rule, samples) == []
    (alert,) = rule.log_ended(NOW, [])
    assert (alert.step, alert.details["best_step"]) == (3000, 2000)
    assert alert.message.endswith("(at the log's last evaluation)")
    # With the accuracy up at the last evaluation, or the last evaluation back under the
    # margin, nothing.
    better = _with_task("eval_accuracy", list(zip(evals, [0.681, 0.682, 0.69], strict=True)))
    rule = detector()
    feed(rule, better)
    assert rule.log_ended(NOW, []) == []
    rule = detector()
    feed(
        rule, _with_task("eval_accuracy", list(zip([0.8084, 0.8074, 0.85], accuracy, strict=True)))
    )
    assert rule.log_ended(NOW, []) == []


def test_three_small_rises_within_the_evals_own_wobble_are_no_overfit() -> None:
    """Keras' CIFAR-10 example at epochs 39-48 (keras-team/keras issue 8680): the
    validation loss wobbles by 0.02-0.05 an epoch; 0.634 -> 0.637 -> 0.658 -> 0.678 is
    three rises, but under where it stood four epochs before (0.687)."""
    evals = [0.6673, 0.6600, 0.6830, 0.6429, 0.6869, 0.6340, 0.6367, 0.6579, 0.6780, 0.6450]
    train = [0.7744, 0.7758, 0.7737, 0.7729, 0.7743, 0.7655, 0.7670, 0.7712, 0.7676, 0.7610]
    assert feed(detector(), run(evals, train)) == []
