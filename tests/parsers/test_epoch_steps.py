"""A loop whose only counter is an epoch bumped every iteration (``epoch: 3451 loss:
nan``): its lines are read at that epoch, as long as no line of the log names a step."""

from __future__ import annotations

from pathlib import Path

from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.parsing import LineParser

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "failed"


def _steps(lines: list[str]) -> list[list[int | None]]:
    parser = LineParser()
    return [[sample.step for sample in parser.parse(line)] for line in lines]


def test_a_line_led_by_an_integer_epoch_is_read_at_that_epoch() -> None:
    assert _steps(["epoch: 3450 loss: 0.21", "epoch: 3451 loss: nan"]) == [
        [3450, 3450],
        [3451, 3451],
    ]


def test_the_real_runs_nan_is_raised_at_its_epoch() -> None:
    result = replay(
        [CORPUS / "gradnorm-tf-nan-at-epoch-3451" / "train.log"], load_settings(None, environ={})
    )
    nan = next(alert for alert in result.alerts if alert.rule == "nan_inf")
    assert nan.step == 3451


def test_once_a_line_names_a_step_the_epoch_is_no_step_unit() -> None:
    steps = _steps(["step: 100 loss: 2.0", "epoch: 3 loss: 1.9"])
    assert steps == [[100], [None, None]]


def test_an_epoch_that_is_not_the_lines_counter_is_left_alone() -> None:
    """A fraction of an epoch, an epoch after the metrics, a dict: not a step."""
    assert _steps(["epoch: 0.53 loss: 2.0"]) == [[None, None]]
    assert _steps(["loss: 2.0 epoch: 3"]) == [[None, None]]
    assert _steps(["{'loss': 2.0, 'epoch': 1.0}"])[0][0] != 1


def test_a_json_record_whose_only_counter_is_an_integer_epoch_is_read_at_it() -> None:
    """DINO's, DeiT's and MAE's ``log.txt``: a JSON object an epoch, ``"epoch": N`` its only
    counter (facebookresearch/dino issue #246). Not an HF dict's fraction of an epoch, not
    a record that also names its batch, not once a line named a step."""
    dino = [
        '{"train_loss": 10.3797, "train_lr": 0.0, "train_wd": 0.04, "epoch": 0}',
        '{"train_loss": 10.4696, "train_lr": 0.000111, "train_wd": 0.0401, "epoch": 1}',
    ]
    assert _steps(dino) == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert _steps(['{"loss": 2.0, "epoch": 1.0}']) == [[None, None]]
    assert _steps(['{"loss": 2.0, "epoch": 1, "batch": 100}']) == [[None, None, None]]
    assert _steps(['{"step": 10, "loss": 2.0}', '{"loss": 1.9, "epoch": 1}']) == [
        [10],
        [None, None],
    ]
