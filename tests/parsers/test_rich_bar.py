"""Lightning's progress bars, rich and tqdm, as a terminal received them from a real run
(``tests/fixtures/make_lightning_bars.py``): each metric at the run's global step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing.keyvalue import parse_keyvalue
from sentinel.parsing.lines import LineSplitter
from sentinel.parsing.rich_bar import parse_rich_bar, strip_escapes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lightning_bars"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "Epoch 1/4  ━━━━━━━━╸━━━━━━ 11/50 0:00:00 • 0:00:01 415.01it/s v_num: 0.000 "
            "train_loss: nan",
            [Sample("loss", math.nan, 60), Sample(PROGRESS, 60.0, 60)],
            id="rich",
        ),
        pytest.param(
            "Epoch 4/-2 ━━━━━━━━╺━━━━━━━ 101/200 0:00:01 • 0:00:01 95.12it/s v_num: 0 "
            "train_loss: nan val_loss: 0.127",
            [
                Sample("loss", math.nan, 900),
                Sample("eval_loss", 0.127, 900),
                Sample(PROGRESS, 900.0, 900),
            ],
            id="rich-with-max-steps-and-no-max-epochs",
        ),
        pytest.param(
            "\x1b[2K\x1b[1A\x1b[2KEpoch 0/4  \x1b[38;5;56m━━\x1b[0m 24/50 \x1b[2m0:00:00 • "
            "0:00:01\x1b[0m \x1b[2;4m366.29it/s\x1b[0m \x1b[3mv_num: 0.000 train_loss: 2.069",
            [Sample("loss", 2.069, 23), Sample(PROGRESS, 23.0, 23)],
            id="rich-with-escapes",
        ),
        pytest.param(
            "Epoch 2    ━━━━━━━━━━━━━━ 5/50 0:00:00 • -:--:-- 0.00it/s v_num: 0.000",
            [Sample(PROGRESS, 104.0, 104)],
            id="rich-no-max-epochs-no-metrics",
        ),
        pytest.param(
            "Epoch 1:  24%|██▍       | 12/50 [00:01<00:02, 12.3it/s, v_num=0, train_loss=nan.0]",
            [Sample("loss", math.nan, 61), Sample(PROGRESS, 61.0, 61)],
            id="tqdm",
        ),
        pytest.param(
            "Epoch 2:   0%|          | 0/50 [00:00<?, ?it/s, v_num=0, train_loss=nan.0]",
            [Sample("loss", math.nan, None)],
            id="tqdm-padded-nan-at-0",
        ),
        pytest.param("Epoch 0:   0%|          | 0/50 [00:00<?, ?it/s]", [], id="tqdm-first-frame"),
        pytest.param("Validation ━━━━━━━━━━ 3/10 0:00:00 • 0:00:01 12.00it/s", [], id="validation"),
        pytest.param("Sanity Checking ━━━━ 1/2 0:00:00 • 0:00:00 5.00it/s", [], id="sanity-check"),
        pytest.param("  5%|▌         | 10/200 [00:01<00:19,  9.81it/s]", None, id="hf-bar"),
        pytest.param("epoch 3 loss 2.1", None, id="plain-text"),
        pytest.param("              train_loss: nan", None, id="wrapped-metrics"),
    ],
)
def test_lines(line: str, expected: list[Sample] | None) -> None:
    found = parse_rich_bar(line)
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert [(s.name, s.step) for s in found] == [(s.name, s.step) for s in expected]
    assert [s.value for s in found] == pytest.approx([s.value for s in expected], nan_ok=True)


def _terminal_lines(name: str) -> list[str]:
    splitter = LineSplitter()
    lines = splitter.feed((FIXTURES / name).read_bytes()) + splitter.flush()
    return [strip_escapes(line).strip() for line in lines]


@pytest.mark.parametrize("name", ["rich_120.txt", "rich_80.txt", "tqdm.txt"])
def test_a_real_run_is_read_at_its_global_steps(name: str) -> None:
    """Every loss the bar showed before the NaN's step is finite, the first NaN is drawn
    at a step from it, and every loss after it is NaN: the steps are the run's own.

    Where the metrics wrapped onto a line of their own (80 columns), they take the step
    of the bar just drawn, as the engine gives a step-less line the newest progress."""
    losses: list[tuple[int, float]] = []
    progress: list[int] = []
    for line in _terminal_lines(name):
        samples = parse_rich_bar(line)
        if samples is None:
            samples = parse_keyvalue(line) or []
        for sample in samples:
            if sample.name == PROGRESS:
                assert sample.step is not None
                progress.append(sample.step)
            elif sample.name == "loss":
                step = sample.step if sample.step is not None else progress[-1]
                losses.append((step, sample.value))
    nan_from = EXPECTED["nan_from_step"]
    assert progress == sorted(progress) and progress[-1] == 5 * EXPECTED["steps_per_epoch"] - 1
    before = [value for step, value in losses if step < nan_from]
    assert before and all(math.isfinite(value) for value in before)
    first = next(index for index, (_, value) in enumerate(losses) if math.isnan(value))
    assert all(math.isnan(value) for _, value in losses[first:])
    # Drawn close to its start: the bar is read live, not at the end of the run.
    assert nan_from <= losses[first][0] < nan_from + 10
