"""Ultralytics' training console as a terminal received it from a real run
(``tests/fixtures/make_ultralytics_console.py``): each row at the step whose running means
it shows, the NaN where the trainer computed it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.model.records import Sample, Severity
from sentinel.parsing.lines import LineSplitter
from sentinel.parsing.rich_bar import strip_escapes
from sentinel.parsing.ultralytics import UltralyticsConsole

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ultralytics_console"
HEADER = "Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size"


def _whole(step: int, box: float, cls: float, dfl: float) -> list[tuple[str, int, float]]:
    """A whole row's samples: the loss, the sum of its terms, then each term."""
    terms = [("box_loss", step, box), ("cls_loss", step, cls), ("dfl_loss", step, dfl)]
    return [("loss", step, box + cls + dfl), *terms]


def _expected(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((FIXTURES / name / "expected.json").read_text())
    return data


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "2/3         0G      1.077     0.9391     0.6684         11         64: 25% "
            "━━━───────── 2/8 2.6it/s 0.4s<2.3s",
            _whole(11, 1.077, 0.9391, 0.6684),
            id="own-bar-at-the-next-batch",
        ),
        pytest.param(
            "1/3         0G      1.664      1.247     0.9981          7         64: 0% "
            "──────────── 0/8  0.2s",
            _whole(1, 1.664, 1.247, 0.9981),
            id="count-0-holds-the-first-batch",
        ),
        pytest.param(
            "2/3         0G        nan        nan        nan         12         64: 100% "
            "━━━━━━━━━━━━ 8/8 7.6it/s 1.1s",
            _whole(16, math.nan, math.nan, math.nan),
            id="the-epochs-last-redraw",
        ),
        pytest.param(
            "3/100      2.61G      1.202      1.612      1.238         42        640:  37%|███ "
            "      | 3/8 [00:01<00:01,  3.06it/s]",
            _whole(2 * 8 + 4, 1.202, 1.612, 1.238),
            id="tqdm-bar",
        ),
        pytest.param(
            "2/3         0G        nan     …: 37% ━━━━──────── 3/8 4.8it/s 0.6s<1.0s",
            [("box_loss", 12, math.nan)],
            id="cut-at-80-columns",
        ),
        pytest.param(
            "1/3         0G      1.664      1.247     0.…: 0% ──────────── 0/8  0.3s",
            [("box_loss", 1, 1.664), ("cls_loss", 1, 1.247)],
            id="cut-inside-a-term",
        ),
        pytest.param(
            "1/3         0G      1.331      1.082      0.845          9   …: 100% ━━━━━━━━━━━━ 8/8",
            _whole(8, 1.331, 1.082, 0.845),
            id="cut-after-the-terms",
        ),
        pytest.param("1/3    …: 12% ━─────────── 1/8 2.3it/s", [], id="cut-before-the-terms"),
        pytest.param(
            "Class     Images  Instances      Box(P          R      mAP50 …: 50% ━━━━━━────── 2/4",
            None,
            id="validation",
        ),
        pytest.param("all         32         74          0          0          0", None, id="map"),
    ],
)
def test_rows(line: str, expected: list[tuple[str, int, float]] | None) -> None:
    console = UltralyticsConsole()
    assert console.parse(HEADER) == []
    found = console.parse(line)
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert [(s.name, s.step) for s in found] == [(name, step) for name, step, _ in expected]
    assert [s.value for s in found] == pytest.approx([v for *_, v in expected], nan_ok=True)


@pytest.mark.parametrize(
    ("header", "row", "expected"),
    [
        pytest.param(
            "Epoch   gpu_mem       box       obj       cls    labels  img_size",
            "1/99     2.64G         nan       nan       nan         4       416: 100%|██████████|"
            " 7/7 [00:15<00:00,  2.27s/it]",
            [("loss", 14, math.nan), ("box_loss", 14, math.nan), ("obj_loss", 14, math.nan),
             ("cls_loss", 14, math.nan)],
            id="yolov5-its-second-epoch-from-0",
        ),
        pytest.param(
            "Epoch   gpu_mem       box       obj       cls     total    labels  img_size",
            "0/299     3.1G   0.07353   0.03166   0.02541    0.1306        37       640:  12%|█ "
            "  | 31/254 [00:20<02:20,  1.59it/s]",
            [("box_loss", 32, 0.07353), ("obj_loss", 32, 0.03166), ("cls_loss", 32, 0.02541),
             ("loss", 32, 0.1306)],
            id="yolov5-total-is-the-loss",
        ),
        pytest.param(
            "Epoch    GPU_mem   box_loss   obj_loss   cls_loss  Instances       Size",
            "0/99      3.62G    0.1115    0.07012    0.03868         81        640:  25%|██▌ "
            "| 2/8 [00:01<00:03,  1.8it/s]",
            [("loss", 3, 0.1115 + 0.07012 + 0.03868), ("box_loss", 3, 0.1115),
             ("obj_loss", 3, 0.07012), ("cls_loss", 3, 0.03868)],
            id="yolov5-7-the-new-header-from-0",
        ),
    ],
)  # fmt: skip
def test_yolov5_rows(header: str, row: str, expected: list[tuple[str, int, float]]) -> None:
    console = UltralyticsConsole()
    assert console.parse(header) == []
    found = console.parse(row)
    assert found is not None
    assert [(s.name, s.step) for s in found] == [(name, step) for name, step, _ in expected]
    assert [s.value for s in found] == pytest.approx([v for *_, v in expected], nan_ok=True)


def _terminal_lines(name: str) -> list[str]:
    splitter = LineSplitter()
    lines = splitter.feed((FIXTURES / name / "console.txt").read_bytes()) + splitter.flush()
    return [strip_escapes(line).strip() for line in lines]


def _passes(name: str) -> list[list[list[Sample]]]:
    """The rows read from a capture, one list an epoch's pass (a header opens it)."""
    console = UltralyticsConsole()
    passes: list[list[list[Sample]]] = []
    for line in _terminal_lines(name):
        samples = console.parse(line)
        if samples is None:
            continue
        if line.startswith("Epoch "):
            passes.append([])
        else:
            passes[-1].append(samples)
    return passes


@pytest.mark.parametrize("name", ["nan", "healthy", "narrow"])
def test_every_row_the_terminal_drew_is_read_once(name: str) -> None:
    """One reading for each training row the generator matched to the trainer's means,
    steps rising within a pass and ending at the run's last batch."""
    expected = _expected(name)
    passes = _passes(name)
    rows = [row for one_pass in passes for row in one_pass]
    assert len(rows) == expected["rows_drawn"]
    batches = expected["steps_per_epoch"]
    assert isinstance(batches, int)
    for one_pass in passes:
        steps = [row[0].step for row in one_pass if row]
        assert steps == sorted(steps)
    assert rows[-1][0].step == 3 * batches


def test_the_healthy_run_reads_whole_losses_and_no_nan() -> None:
    rows = [row for one_pass in _passes("healthy") for row in one_pass]
    for row in rows:
        by_name = {sample.name: sample.value for sample in row}
        assert set(by_name) == {"loss", "box_loss", "cls_loss", "dfl_loss"}
        assert all(math.isfinite(value) for value in by_name.values())
        assert by_name["loss"] == pytest.approx(sum(v for k, v in by_name.items() if k != "loss"))


@pytest.mark.parametrize(("name", "metric"), [("nan", "loss"), ("narrow", "box_loss")])
def test_the_nan_is_read_at_the_step_the_trainer_computed_it(name: str, metric: str) -> None:
    """Finite before the poisoned batch; the first NaN at the step whose means its row
    shows (the generator's own reading), at most a few redraws after the trainer's NaN;
    then Ultralytics' recovery trains the epoch again, clean, from its first step."""
    expected = _expected(name)
    nan_from, batches = expected["nan_from_step"], expected["steps_per_epoch"]
    assert isinstance(nan_from, int) and isinstance(batches, int)
    passes = _passes(name)
    losses = [
        [(s.step, s.value) for row in one_pass for s in row if s.name == metric]
        for one_pass in passes
    ]
    flat = [loss for one_pass in losses for loss in one_pass]
    first = next(index for index, (_, value) in enumerate(flat) if math.isnan(value))
    step = flat[first][0]
    assert step is not None
    assert all(math.isfinite(value) for _, value in flat[:first])
    assert step == expected["console_first_nan_step"]
    epoch_end = (nan_from - 1) // batches * batches + batches
    assert nan_from <= step <= epoch_end
    poisoned, redone = losses[1], losses[2]  # epoch 2, then epoch 2 again
    assert all(math.isnan(value) for s, value in poisoned if s is not None and s >= step)
    assert redone[0][0] == batches + 1 and all(math.isfinite(value) for _, value in redone)


@pytest.mark.parametrize("name", ["nan", "narrow"])
def test_replay_raises_the_nan_critical_in_the_poisoned_epoch(name: str) -> None:
    expected = _expected(name)
    nan_from, batches = expected["nan_from_step"], expected["steps_per_epoch"]
    assert isinstance(nan_from, int) and isinstance(batches, int)
    result = replay([FIXTURES / name / "console.txt"], load_settings(None, environ={}))
    alert = next(a for a in result.alerts if a.rule == "nan_inf" and not a.resolves)
    assert alert.severity == Severity.CRITICAL
    assert alert.step is not None
    assert nan_from <= alert.step <= (nan_from - 1) // batches * batches + batches


def test_replay_of_the_healthy_run_raises_nothing_critical() -> None:
    result = replay([FIXTURES / "healthy" / "console.txt"], load_settings(None, environ={}))
    assert result.samples > 0
    assert not [a for a in result.alerts if a.severity == Severity.CRITICAL]
