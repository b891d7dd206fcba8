"""Keras 3's ``model.fit`` console from real runs (``tests/fixtures/make_keras_console.py``):
``verbose=1``'s redrawn bar and ``verbose=2``'s line an epoch, each at its step."""

from __future__ import annotations

import json
import math
from pathlib import Path

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing import LineParser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "keras_console"


def losses(run: str) -> tuple[list[Sample], dict[str, object]]:
    folder = FIXTURES / run
    parser = LineParser()
    samples = [
        sample
        for line in (folder / "console.txt").read_text().splitlines()
        for sample in parser.parse(line)
        if sample.name == "loss"
    ]
    return samples, json.loads((folder / "expected.json").read_text())


def test_verbose_2_is_read_at_each_epochs_last_step() -> None:
    samples, truth = losses("verbose2")
    batches = truth["batches_per_epoch"]
    assert [s.step for s in samples] == [batches * epoch for epoch in range(1, 7)]
    printed = [s.value if math.isfinite(s.value) else "nan" for s in samples]
    assert printed == [float(v) if v != "nan" else "nan" for v in truth["epoch_losses"]]


def test_verbose_1_reads_each_redraw_at_its_batch_and_the_nan_at_its_first_step() -> None:
    """Keras redraws the bar at most every 50 ms: a fast epoch shows its first batch and
    its last (twice: the last redraw, then with the validation metrics)."""
    samples, truth = losses("verbose1")
    first_nan = next(s for s in samples if math.isnan(s.value))
    assert first_nan.step == truth["nan_from_step"]
    steps = [s.step for s in samples]
    assert steps == sorted(steps)
    assert {12 * epoch for epoch in range(1, 7)} <= set(steps)


def test_the_epoch_line_is_no_progress_and_no_metric() -> None:
    parser = LineParser()
    assert parser.parse("Epoch 4/6") == []
    line = "12/12 - 0s - 3ms/step - loss: nan - mae: nan - val_loss: nan - val_mae: nan"
    found = parser.parse(line)
    assert {s.step for s in found if s.name != PROGRESS} == {48}


def test_keras_0x_heads_its_epochs_from_0_and_its_bar_counts_samples() -> None:
    """keras-team/keras issue #21 (2015): ``Epoch 0`` then ``61878/61878 [===] - 5s -
    loss: 1.1788``. Each epoch's end is a step of its own (the first is 61878)."""
    parser = LineParser()
    lines = ["Epoch 0", "61878/61878 [====] - 5s - loss: 1.1788"]
    lines += ["Epoch 1", "61878/61878 [====] - 5s - loss: 1.0403"]
    found = [s for line in lines for s in parser.parse(line) if s.name == "loss"]
    assert [(s.step, s.value) for s in found] == [(61878, 1.1788), (123756, 1.0403)]


def test_without_its_epoch_heads_each_epoch_is_read_at_a_step_of_its_own() -> None:
    """An excerpt with the heads cut reads each line where the whole log does: a count that
    went back, or an epoch's end again with other values, begins the next epoch; the end
    redrawn with the validation's metrics is the same step."""
    text = (FIXTURES / "verbose1" / "console.txt").read_text()
    headed = [s.step for s in _losses_of(text.splitlines())]
    cut = [s.step for s in _losses_of([x for x in text.splitlines() if not x.startswith("Epoch")])]
    assert cut == headed
    # keras-team/keras issue #932: verbose=1 to a file, one end-of-epoch line an epoch.
    ends = [
        f"370784/370784 [====] - 6700s - loss: {loss} - acc: 0.4 - val_loss: 1.9"
        for loss in ("1.8887", "1.9328", "1.9986")
    ]
    assert [s.step for s in _losses_of(ends)] == [370784, 741568, 1112352]


def _losses_of(lines: list[str]) -> list[Sample]:
    parser = LineParser()
    return [s for line in lines for s in parser.parse(line) if s.name == "loss"]


def test_keras_1_verbose_2_lines_are_at_the_epochs_done() -> None:
    """KyotoSunshine/CNN-for-handwritten-kanji's log (Keras 1, ``verbose=2``): ``Epoch 1/10``
    then ``3083s - loss: 1.7197 - ...``, a line an epoch with no count. They named no step."""
    lines = ["Train on 400000 samples, validate on 10000 samples", "Epoch 1/10"]
    lines += ["3083s - loss: 1.7197 - acc: 0.5893 - val_loss: 0.3504 - val_acc: 0.8959"]
    lines += ["Epoch 2/10", "3086s - loss: 0.6644 - acc: 0.8074 - val_loss: 0.2832"]
    read = _losses_of(lines)
    assert [(s.step, s.value) for s in read] == [(1, 1.7197), (2, 0.6644)]
