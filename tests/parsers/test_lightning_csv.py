"""Lightning's metrics.csv: a header, sparse rows, column names, rows read once."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sentinel.engine.core import Engine
from sentinel.model.records import PROGRESS, Alert, Line, Sample
from sentinel.parsing import Garbled, LineParser
from sentinel.parsing.files import file_format, iter_replay, reader_for
from sentinel.parsing.lightning_csv import LightningCsvReader, column_metric, is_header, split_row
from sentinel.rules import BaseDetector, RuleConfig

Row = tuple[str, object, int | None, float | None]


class Recorder(BaseDetector):
    """A rule that records every sample the engine hands it."""

    rule = "recorder"

    def __init__(self) -> None:
        super().__init__(RuleConfig())
        self.samples: list[Sample] = []

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        self.samples.append(sample)
        return []


def comparable(samples: list[Sample]) -> list[Row]:
    return [(s.name, "nan" if math.isnan(s.value) else s.value, s.step, s.time) for s in samples]


def read(text: str) -> list[Row]:
    """Every sample of a metrics.csv's lines, fed to one reader."""
    reader = LightningCsvReader()
    samples: list[Sample] = []
    for line in text.splitlines():
        samples += reader.parse(line) or []
    return comparable(samples)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "epoch,step,train_loss,val_loss\n0,0,2.5,\n0,1,2.25,\n0,1,,3.0\n",
            [
                ("epoch", 0.0, 0, None),
                ("loss", 2.5, 0, None),
                ("epoch", 0.0, 1, None),
                ("loss", 2.25, 1, None),
                ("epoch", 0.0, 1, None),
                ("eval_loss", 3.0, 1, None),
            ],
            id="sparse-columns",
        ),
        pytest.param(
            "epoch,grad_norm,step,train_loss\r\n0,inf,5,nan\r\n",
            [
                ("epoch", 0.0, 5, None),
                ("grad_norm", math.inf, 5, None),
                ("loss", "nan", 5, None),
            ],
            id="nan-inf-cells-crlf",
        ),
        pytest.param(
            "step,train_loss_step,train_loss_epoch,val_loss_epoch,lr-Adam\n"
            "9,1.5,,,0.001\n9,,1.75,2.0,\n",
            [
                ("loss", 1.5, 9, None),
                ("lr", 0.001, 9, None),
                ("loss_epoch", 1.75, 9, None),
                ("eval_loss", 2.0, 9, None),
            ],
            id="step-epoch-suffixes",
        ),
        pytest.param(
            "step,time,loss,note\n3,1700000000.5,1.0,warmup\n",
            [("loss", 1.0, 3, 1700000000.5)],
            id="time-column-text-cell",
        ),
        pytest.param("step,loss\n4,\n", [(PROGRESS, 4.0, 4, None)], id="step-only-row"),
        pytest.param(
            "0,0,2.5\nepoch,step,loss\n0,1,2.0\n",
            [("epoch", 0.0, 1, None), ("loss", 2.0, 1, None)],
            id="rows-before-a-header-are-not-read",
        ),
    ],
)
def test_rows_give_exact_samples(text: str, expected: list[Row]) -> None:
    assert read(text) == expected


@pytest.mark.parametrize(
    ("column", "metric"),
    [
        pytest.param("train_loss", "loss", id="train-loss"),
        pytest.param("val_loss", "eval_loss", id="val-loss"),
        pytest.param("train_loss_step", "loss", id="training-per-step"),
        pytest.param("train_loss_epoch", "loss_epoch", id="training-epoch-mean"),
        pytest.param("val_loss_epoch", "eval_loss", id="eval-per-epoch"),
        pytest.param("val_loss_step", "eval_loss_step", id="eval-per-batch"),
        pytest.param("val/acc_epoch", "val/acc", id="eval-by-prefix"),
        pytest.param("test_acc_step", "test_acc_step", id="test-per-batch"),
        pytest.param("train/grad_norm_step", "grad_norm", id="train-slash"),
        pytest.param("lr-AdamW", "lr", id="lr-monitor"),
        pytest.param("lr-AdamW/pg2", "lr-adamw/pg2", id="lr-monitor-param-group"),
        pytest.param("epoch", "epoch", id="epoch"),
        pytest.param("_step", "_step", id="bare-suffix"),
    ],
)
def test_column_metric(column: str, metric: str) -> None:
    assert column_metric(column) == metric


@pytest.mark.parametrize(
    ("line", "header"),
    [
        pytest.param("epoch,step,train_loss", True, id="lightning-header"),
        pytest.param("step,loss", True, id="step-only"),
        pytest.param(" Epoch , Step ", True, id="case-and-spaces"),
        pytest.param("0,10,2.5", False, id="data-row"),
        pytest.param("epoch,step,nan", False, id="a-numeric-cell"),
        pytest.param("loss,acc", False, id="no-step-or-epoch"),
    ],
)
def test_is_header(line: str, header: bool) -> None:
    assert is_header(split_row(line)) is header


def test_a_row_with_the_wrong_cell_count_is_garbled() -> None:
    reader = LightningCsvReader()
    reader.parse("epoch,step,loss")
    with pytest.raises(Garbled, match="2 cells where the header has 3"):
        reader.parse("0,1")


def test_rows_come_back_under_a_wider_header_and_are_read_once() -> None:
    text = (
        "epoch,step,train_loss\n0,0,2.5\n0,1,2.25\n"
        # Lightning's rewrite: same rows, a new column, then the new rows.
        "epoch,step,train_loss,val_loss\n0,0,2.5,\n0,1,2.25,\n0,1,,3.0\n0,2,2.0,\n"
    )
    assert [(name, step) for name, _, step, _ in read(text) if name != "epoch"] == [
        ("loss", 0),
        ("loss", 1),
        ("eval_loss", 1),
        ("loss", 2),
    ]


def test_a_new_file_at_the_same_path_is_read_in_full() -> None:
    # A resumed run with a fixed version: Lightning deletes metrics.csv and starts again.
    text = "step,train_loss\n0,2.5\n1,2.25\nstep,train_loss\n1,2.3\n2,2.0\n"
    assert read(text) == [
        ("loss", 2.5, 0, None),
        ("loss", 2.25, 1, None),
        ("loss", 2.3, 1, None),
        ("loss", 2.0, 2, None),
    ]


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        pytest.param("lightning_logs/version_0/metrics.csv", "lightning_csv", id="lightning"),
        pytest.param("metrics.csv", "lightning_csv", id="bare-name"),
        pytest.param("out/metrics.csv.1", None, id="other-name"),
        pytest.param("out/train_metrics.csv", None, id="suffix-only"),
    ],
)
def test_file_format(path: str, kind: str | None) -> None:
    assert file_format(path) == kind
    assert isinstance(reader_for(path), LightningCsvReader) is (kind is not None)


def test_a_lightning_log_folder_replays_each_version_in_order(tmp_path: Path) -> None:
    root = tmp_path / "lightning_logs"
    for version in (10, 2):
        folder = root / f"version_{version}"
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(f"epoch,step,train_loss\n0,{version},1.5\n")
        (folder / "hparams.yaml").write_text("lr: 0.1\n")
    parser = LineParser()
    recorder = Recorder()
    engine = Engine([recorder], parser)
    sources = []
    for source, line in iter_replay([root]):
        sources.append(source)
        engine.feed_line(Line(source, line, 0.0))
    assert [(s.name, s.step) for s in recorder.samples if s.name == "loss"] == [
        ("loss", 2),
        ("loss", 10),
    ]
    assert sources[0] == str(root / "version_2" / "metrics.csv")
    assert (parser.stats.lines, parser.stats.garbled) == (4, 0)
