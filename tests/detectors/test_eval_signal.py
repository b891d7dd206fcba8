"""The eval loss as the second signal of a persistent train-loss spike (issues 21, 22.4).

The run's shape is a Trainer's: the loss logged every 10 steps, an evaluation every 50.
The loss doubles for seven logged values (510-570) with a flat grad-norm, then comes back.
Replayed with the default rules from a real JSON-lines file: the eval loss rising at the
next evaluation (550) makes it critical; an eval loss that stays flat leaves a warning.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.model.records import Severity
from sentinel.rules.eval_signal import EvalSignal


def trainer_log(path: Path, eval_at_550: float) -> Path:
    rng = random.Random(7)
    lines = []
    for step in range(10, 701, 10):
        loss = 2.0 * (1 + 0.02 * rng.gauss(0, 1))
        if 510 <= step <= 570:
            loss *= 2.3
        lines.append({"step": step, "loss": loss, "grad_norm": 1.0 + 0.05 * rng.gauss(0, 1)})
        if step % 50 == 0:
            evaluation = 1.6 - step / 5000 if step != 550 else eval_at_550
            lines.append({"step": step, "eval_loss": evaluation})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("eval_at_550", "worst"),
    [(1.9, Severity.CRITICAL), (1.49, Severity.WARNING)],
    ids=["eval-rises-critical", "eval-flat-warning"],
)
def test_a_train_loss_spike_is_critical_only_when_the_eval_loss_rises_with_it(
    tmp_path: Path, eval_at_550: float, worst: Severity
) -> None:
    log = trainer_log(tmp_path / "train.jsonl", eval_at_550)
    result = replay([log], load_settings(None, environ={}))
    raised = [alert for alert in result.alerts if not alert.resolves]
    assert {alert.rule for alert in raised} == {"loss_spike"}, raised
    assert result.worst() is worst
    assert raised[0].step == 510  # the warning at the spike's onset, either way
    if worst is Severity.CRITICAL:
        critical = raised[-1]
        assert critical.step == 560  # the first spike after the evaluation that rose
        assert critical.onset_step == 510
        assert "eval_loss rose with it (1.5 before the onset, 1.9 at step 550)" in (
            critical.message
        )
        assert critical.details["diagnosis"]["cause"].startswith(
            "a persistent loss spike that hurt the model"
        )


def signal(*evaluations: tuple[int, float]) -> EvalSignal:
    evals = EvalSignal()
    for step, value in evaluations:
        evals.observe(step, value)
    return evals


@pytest.mark.parametrize(
    ("evaluations", "onset", "rose"),
    [
        (((100, 1.5), (200, 1.6)), 150, True),
        (((100, 1.5), (200, 1.55)), 150, False),  # within 5%
        (((0, 1.5), (50, 1.8), (100, 1.5), (200, 1.75)), 150, False),  # its own wobble
        (((200, 1.9),), 150, False),  # nothing before the onset to compare with
        (((100, 1.5),), 150, False),  # no evaluation since the onset yet
        (((100, 1.5), (200, 1.9)), None, False),  # an episode with no step
        (((100, 1.5), (150, 1.9)), 150, True),  # the evaluation at the onset's step
    ],
    ids=["rose", "within-rise", "wobble", "none-before", "none-since", "no-step", "same-step"],
)
def test_rose_since(
    evaluations: tuple[tuple[int, float], ...], onset: int | None, rose: bool
) -> None:
    assert (signal(*evaluations).rose_since(onset) is not None) is rose


def test_block_and_values_keep_the_same_evaluations() -> None:
    one_by_one = signal((10, 1.0), (20, float("nan")), (30, 0.9))
    by_block = EvalSignal()
    by_block.extend([1.0, float("nan"), 0.9], [10, 20, 30])
    assert list(by_block.evals) == list(one_by_one.evals) == [(10, 1.0), (30, 0.9)]
