"""A path's format is decided once (``classify``, ``replay_plan``); its reader takes over."""

from __future__ import annotations

from pathlib import Path

from sentinel.engine.core import Engine
from sentinel.parsing import LineParser
from sentinel.parsing.files import MetricsFile, classify, replay_plan
from sentinel.parsing.lightning_csv import LightningCsvReader
from sentinel.parsing.mlflow import MlflowMetricReader

MS0 = 1_700_000_000_000


def test_classify_gives_the_format_and_what_reads_it() -> None:
    metric = classify("mlruns/0/abc/metrics/train/loss")
    assert (metric.format, metric.key) == ("mlflow", "train/loss")
    assert metric.group == Path("mlruns/0/abc")
    reader = metric.new_reader()
    assert isinstance(reader, MlflowMetricReader)
    assert reader.name == "loss"
    csv = classify("logs/version_0/metrics.csv")
    assert csv.format == "lightning_csv"
    assert isinstance(csv.new_reader(), LightningCsvReader)
    plain = classify("train.log")
    assert (plain.format, plain.new_reader(), plain.group) == (None, None, None)


def test_replay_plan_decides_each_file_once_and_groups_a_run(tmp_path: Path) -> None:
    run = tmp_path / "mlruns" / "0" / "r1"
    (run / "metrics").mkdir(parents=True)
    for key in ("loss", "lr"):
        (run / "metrics" / key).write_text(f"{MS0} 1.0 1\n")
    (run / "artifacts").mkdir()
    (run / "artifacts" / "metrics.csv").write_text("step,loss\n1,2.0\n")  # a copy: skipped
    log = tmp_path / "train.log"
    log.write_text('{"step": 1, "loss": 2.0}\n')

    plan = replay_plan([log, tmp_path / "mlruns"])

    assert [[(file.path, file.format) for file in group] for group in plan] == [
        [(log, None)],
        [(run / "metrics" / "loss", "mlflow"), (run / "metrics" / "lr", "mlflow")],
    ]
    assert all(isinstance(file, MetricsFile) for group in plan for file in group)


def test_the_engine_reads_an_opened_source_with_the_reader_it_was_given() -> None:
    line = f"{MS0} 2.5 7"
    as_log = Engine([], LineParser())
    as_log.feed_texts("loss.txt", [line], 0.0)
    assert "loss" not in as_log.history  # by its path, a plain log: not a metric line

    opened = Engine([], LineParser())
    opened.open_source("loss.txt", MlflowMetricReader("loss"))
    opened.feed_texts("loss.txt", [line], 0.0)
    assert [(s.value, s.step) for s in opened.history["loss"]] == [(2.5, 7)]


def test_a_dangling_link_in_a_run_folder_is_skipped_not_the_whole_replay(tmp_path: Path) -> None:
    """One event file's link pointing nowhere aborted the replay of the folder ("No such
    file or directory"), the NaN in the metrics.csv beside it unreported."""
    from sentinel.parsing.files import replay_plan

    (tmp_path / "metrics.csv").write_text("step,loss\n1,2.0\n2,nan\n")
    (tmp_path / "events.out.tfevents.123.host").symlink_to(tmp_path / "gone")
    plan = replay_plan([tmp_path])
    assert [file.path.name for group in plan for file in group] == ["metrics.csv"]
