"""MLflow's file store: which paths are metric files, their lines, a run's files merged."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.engine.core import Engine
from sentinel.model.records import Alert, Line, Sample
from sentinel.parsing import Garbled, LineParser
from sentinel.parsing.files import file_format, iter_replay, reader_for
from sentinel.parsing.mlflow import MlflowMetricReader, metric_key, parse_metric_line
from sentinel.rules import BaseDetector, RuleConfig

MS0 = 1_700_000_000_000


class Recorder(BaseDetector):
    """A rule that records every sample (and its source) the engine hands it."""

    rule = "recorder"

    def __init__(self) -> None:
        super().__init__(RuleConfig())
        self.seen: list[tuple[str, Sample]] = []

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        self.seen.append((source, sample))
        return []


def comparable(samples: list[Sample]) -> list[tuple[str, object, int | None, float | None]]:
    return [(s.name, "nan" if math.isnan(s.value) else s.value, s.step, s.time) for s in samples]


@pytest.mark.parametrize(
    ("path", "key"),
    [
        pytest.param("mlruns/0/abc123/metrics/loss", "loss", id="plain"),
        pytest.param("/home/u/proj/mlruns/7/r1/metrics/train/loss", "train/loss", id="nested-key"),
        pytest.param("mlruns/0/abc/metrics/a/b/c", "a/b/c", id="deeply-nested-key"),
        pytest.param("mlruns/0/abc/metrics", None, id="the-folder-itself"),
        pytest.param("mlruns/0/abc/params/lr", None, id="params"),
        pytest.param("mlruns/0/models/m-1/metrics/loss", None, id="logged-model-metrics"),
        pytest.param("mlruns/.trash/abc/metrics/loss", None, id="trash"),
        pytest.param("runs/0/abc/metrics/loss", None, id="no-mlruns-folder"),
        pytest.param("mlruns/metrics/loss", None, id="metrics-too-high"),
    ],
)
def test_metric_key(path: str, key: str | None) -> None:
    assert metric_key(path) == key
    assert file_format(path) == (None if key is None else "mlflow")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(f"{MS0} 2.5 10", (MS0 / 1000, 2.5, 10), id="ts-value-step"),
        pytest.param(f"{MS0 + 500} 2.5", (MS0 / 1000 + 0.5, 2.5, None), id="old-no-step"),
        pytest.param(f"{MS0} -inf 3", (MS0 / 1000, -math.inf, 3), id="inf"),
        pytest.param("   ", None, id="blank"),
    ],
)
def test_parse_metric_line(line: str, expected: tuple[float, float, int | None] | None) -> None:
    assert parse_metric_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(f"{MS0}", id="one-field"),
        pytest.param(f"{MS0} 1.0 2 3", id="four-fields"),
        pytest.param(f"{MS0} loss 2", id="text-value"),
        pytest.param(f"{MS0} 1.0 2.5", id="fractional-step"),
        pytest.param(f"{MS0} 1.0 2{MS0} 1.0 3", id="two-lines-glued"),
    ],
)
def test_broken_metric_line_is_garbled(line: str) -> None:
    with pytest.raises(Garbled):
        MlflowMetricReader("loss").parse(line)


def test_reader_names_the_metric_after_its_key() -> None:
    reader = reader_for("mlruns/0/abc/metrics/train/loss")
    assert isinstance(reader, MlflowMetricReader)
    found = reader.parse(f"{MS0} nan 4")
    assert found is not None
    assert comparable(found) == [("loss", "nan", 4, MS0 / 1000)]


def write_metric(run: Path, key: str, lines: list[str]) -> Path:
    path = run / "metrics" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run with a loss every step and a nested eval loss every second step."""
    folder = tmp_path / "mlruns" / "0" / "0a1b2c"
    (folder / "meta.yaml").parent.mkdir(parents=True)
    (folder / "meta.yaml").write_text("run_id: 0a1b2c\n")
    write_metric(folder, "loss", [f"{MS0 + step * 1000} {4 - step} {step}" for step in range(4)])
    write_metric(folder, "eval/loss", [f"{MS0 + 2500} 3.5 2", f"{MS0 + 500} 3.75 0"])
    (folder / "params").mkdir()
    (folder / "params" / "lr").write_text("0.1")
    return folder


def replay(*paths: Path) -> tuple[list[tuple[str, Sample]], LineParser]:
    parser = LineParser()
    recorder = Recorder()
    engine = Engine([recorder], parser)
    for source, line in iter_replay(list(paths)):
        engine.feed_line(Line(source, line, 0.0))
    return recorder.seen, parser


def short(seen: list[tuple[str, Sample]]) -> list[tuple[str, str, float, int | None]]:
    """(file below the metrics folder, metric, value, step) of each sample."""
    return [(source.rpartition("metrics/")[2], s.name, s.value, s.step) for source, s in seen]


EXPECTED_MERGE = [
    ("loss", "loss", 4.0, 0),
    ("loss", "loss", 3.0, 1),
    ("loss", "loss", 2.0, 2),  # same step: the earlier timestamp first
    ("eval/loss", "eval_loss", 3.5, 2),
    ("eval/loss", "eval_loss", 3.75, 0),  # each file keeps its own order
    ("loss", "loss", 1.0, 3),
]


@pytest.mark.parametrize(
    "given",
    [
        pytest.param(lambda run: [run], id="run-folder"),
        pytest.param(lambda run: [run.parent.parent], id="mlruns-root"),
        pytest.param(
            lambda run: [run / "metrics" / "loss", run / "metrics" / "eval" / "loss"],
            id="its-files-given-one-by-one",
        ),
    ],
)
def test_a_runs_metric_files_are_merged_by_step_and_time(
    run: Path, given: Callable[[Path], list[Path]]
) -> None:
    seen, parser = replay(*given(run))
    assert short(seen) == EXPECTED_MERGE
    assert {source for source, _ in seen} == {
        str(run / "metrics" / "loss"),
        str(run / "metrics" / "eval" / "loss"),
    }
    assert seen[0][1].time == MS0 / 1000
    assert parser.stats.lines == 6


def test_trash_and_artifacts_are_not_replayed(run: Path) -> None:
    mlruns = run.parent.parent
    write_metric(mlruns / ".trash" / "9" / "dead", "loss", [f"{MS0} 9.0 0"])
    artifacts = run / "artifacts"
    artifacts.mkdir()
    (artifacts / "metrics.csv").write_text("epoch,step,train_loss\n0,0,9.0\n")
    seen, _ = replay(mlruns)
    assert short(seen) == EXPECTED_MERGE


def test_a_run_folder_given_as_dot_is_recognised(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(run)
    seen, _ = replay(Path("."))
    assert short(seen) == EXPECTED_MERGE
    assert all(Path(source).is_absolute() for source, _ in seen)


def test_a_garbled_line_is_counted_in_its_place(run: Path) -> None:
    write_metric(run, "loss", [f"{MS0} 4.0 0", "torn", f"{MS0 + 1000} 3.0 1"])
    seen, parser = replay(run)
    assert [(s.name, s.step) for _, s in seen] == [
        ("loss", 0),
        ("loss", 1),
        ("eval_loss", 2),
        ("eval_loss", 0),
    ]
    assert parser.stats.garbled == 1


def test_old_step_less_lines_get_the_engines_step(tmp_path: Path) -> None:
    run = tmp_path / "mlruns" / "1" / "old"
    write_metric(run, "loss", [f"{MS0} 2.0", f"{MS0 + 1000} 1.0"])
    seen, _ = replay(run)
    assert [(s.value, s.step, s.time) for _, s in seen] == [
        (2.0, None, MS0 / 1000),
        (1.0, None, MS0 / 1000 + 1),
    ]


def test_a_folder_without_metric_files_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "train.log").write_text("loss=1\n")
    with pytest.raises(FileNotFoundError, match=r"no metrics\.csv, MLflow metric or TensorBoard"):
        next(iter_replay([tmp_path]))
