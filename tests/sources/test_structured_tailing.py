"""Structured metric files followed live: real files written the way their frameworks write them.

A ``FileFollower`` reads them (through the splitter its path's format gets,
``sentinel.supervisor.metric_files.splitting``)
and an ``Engine`` turns the lines into samples; every case asserts each
logged value arrives exactly once, whatever the writer did to the file.
"""

from __future__ import annotations

import csv
import math
import os
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from sentinel.engine.core import Engine
from sentinel.follow.logfile import FileFollower
from sentinel.follow.tailer import LogTailer
from sentinel.model.records import Alert, Line, Marks, Sample
from sentinel.parsing import LineParser
from sentinel.rules import BaseDetector, RuleConfig
from sentinel.store.state import StateStore
from sentinel.supervisor.metric_files import splitting

T0 = 1_700_000_000.0


class Recorder(BaseDetector):
    """A rule that records every sample the engine hands it."""

    rule = "recorder"

    def __init__(self, config: RuleConfig | None = None) -> None:
        super().__init__(config or RuleConfig())
        self.samples: list[Sample] = []

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        self.samples.append(sample)
        return []


class Watch:
    """One followed path, its state store, and the engine its lines go to."""

    def __init__(self, path: Path, store: StateStore) -> None:
        self.path = path
        self.store = store
        self.recorder = Recorder()
        self.parser = LineParser()
        self.engine = Engine([self.recorder], self.parser)
        self.follower = FileFollower(path, offsets=store, new_splitter=splitting(path))

    def restart(self) -> None:
        """sentinel restarted: a new follower and a new engine, the same offsets."""
        self.follower.close()
        self.recorder = Recorder()
        self.parser = LineParser()
        self.engine = Engine([self.recorder], self.parser)
        self.follower = FileFollower(
            self.path, offsets=self.store, new_splitter=splitting(self.path)
        )

    def read(self) -> list[str]:
        lines: list[str] = []
        while True:
            lines += self.follower.read()
            self.follower.commit()
            if not self.follower.has_backlog:
                break
        for line in lines:
            self.engine.feed_line(Line(str(self.path), line, T0))
        return lines

    def metrics(self) -> list[tuple[str, float, int | None]]:
        return [(s.name, s.value, s.step) for s in self.recorder.samples if s.name != "epoch"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore(tmp_path / "state")
    yield state
    state.close()


# -- Lightning metrics.csv -------------------------------------------------------------------


class CsvLoggerFile:
    """Writes metrics.csv the way Lightning's CSVLogger (``_ExperimentWriter``) does.

    Rows are buffered by ``log_metrics`` and written by ``save``; when a save
    brings a new key, the whole file is first rewritten in place with the
    wider, sorted header (read with ``DictReader``, truncated, written back),
    then the new rows are appended. ``during_rewrite`` runs after the header
    and first row of a rewrite, as a reader could catch it half-way.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys: list[str] = []
        self.pending: list[dict[str, float]] = []
        self.during_rewrite: Callable[[], None] | None = None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.pending.append({**metrics, "step": step})

    def save(self) -> None:
        new_keys = set().union(*self.pending) - set(self.keys)
        self.keys = sorted([*self.keys, *new_keys])
        exists = self.path.is_file()
        if new_keys and exists:
            self._rewrite()
        with self.path.open("a" if exists else "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.keys)
            if not exists:
                writer.writeheader()
            writer.writerows(self.pending)
        self.pending = []

    def _rewrite(self) -> None:
        with self.path.open(newline="") as file:
            rows = list(csv.DictReader(file))
        with self.path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.keys)
            writer.writeheader()
            writer.writerows(rows[:1])
            if self.during_rewrite is not None:
                file.flush()
                self.during_rewrite()
            writer.writerows(rows[1:])


@pytest.fixture
def csv_run(tmp_path: Path, store: StateStore) -> Iterator[tuple[CsvLoggerFile, Watch]]:
    path = tmp_path / "lightning_logs" / "version_0" / "metrics.csv"
    path.parent.mkdir(parents=True)
    watch = Watch(path, store)
    yield CsvLoggerFile(path), watch
    watch.follower.close()


def read_between_saves(logger: CsvLoggerFile, watch: Watch) -> None:
    watch.read()


def read_during_the_rewrite_too(logger: CsvLoggerFile, watch: Watch) -> None:
    logger.during_rewrite = watch.read
    watch.read()


def read_only_at_the_end(logger: CsvLoggerFile, watch: Watch) -> None:
    return None


@pytest.mark.parametrize(
    "reading",
    [read_between_saves, read_during_the_rewrite_too, read_only_at_the_end],
    ids=lambda reading: reading.__name__,
)
def test_lightning_rewrite_delivers_every_row_once(
    csv_run: tuple[CsvLoggerFile, Watch], reading: Callable[[CsvLoggerFile, Watch], None]
) -> None:
    logger, watch = csv_run
    logger.log_metrics({"epoch": 0, "train_loss": 2.5}, step=0)
    logger.log_metrics({"epoch": 0, "train_loss": 2.25}, step=1)
    logger.save()
    reading(logger, watch)
    logger.log_metrics({"epoch": 0, "val_loss": 3.0}, step=1)  # a new key: rewrite
    logger.log_metrics({"epoch": 1, "train_loss": 2.0}, step=2)
    logger.save()
    reading(logger, watch)
    logger.log_metrics({"epoch": 1, "train_loss": 1.75, "grad_norm": math.inf}, step=3)
    logger.save()  # a new key again, and a rewrite with two columns added so far
    reading(logger, watch)
    logger.log_metrics({"epoch": 1, "train_loss": 1.5}, step=4)
    logger.save()  # appended
    watch.read()
    assert watch.metrics() == [
        ("loss", 2.5, 0),
        ("loss", 2.25, 1),
        ("eval_loss", 3.0, 1),
        ("loss", 2.0, 2),
        ("grad_norm", math.inf, 3),
        ("loss", 1.75, 3),
        ("loss", 1.5, 4),
    ]
    assert watch.parser.stats.garbled == 0
    assert logger.path.read_text().splitlines()[0] == "epoch,grad_norm,step,train_loss,val_loss"


def test_lightning_after_a_restart_mid_file_reads_the_new_rows_by_the_header(
    csv_run: tuple[CsvLoggerFile, Watch],
) -> None:
    logger, watch = csv_run
    logger.log_metrics({"train_loss": 2.5}, step=0)
    logger.save()
    watch.read()
    watch.restart()  # resumes at the saved offset, past the header
    logger.log_metrics({"train_loss": 2.25}, step=1)
    logger.log_metrics({"train_loss": 2.0}, step=2)
    logger.save()
    lines = watch.read()
    assert lines == ["step,train_loss", "1,2.25", "2,2.0"]  # the header, read from the head
    assert watch.metrics() == [("loss", 2.25, 1), ("loss", 2.0, 2)]


def test_lightning_resumed_into_the_same_version_reads_the_new_file(
    csv_run: tuple[CsvLoggerFile, Watch],
) -> None:
    logger, watch = csv_run
    logger.log_metrics({"train_loss": 2.5}, step=0)
    logger.log_metrics({"train_loss": 2.25}, step=1)
    logger.save()
    watch.read()
    # CSVLogger(version=0) again: Lightning deletes metrics.csv and writes a new one.
    logger.path.unlink()
    resumed = CsvLoggerFile(logger.path)
    resumed.log_metrics({"train_loss": 2.3}, step=1)
    resumed.log_metrics({"train_loss": 2.0}, step=2)
    resumed.save()
    watch.read()
    assert watch.metrics() == [
        ("loss", 2.5, 0),
        ("loss", 2.25, 1),
        ("loss", 2.3, 1),
        ("loss", 2.0, 2),
    ]


# -- TensorBoard event files -----------------------------------------------------------------


def event_file_bytes(folder: Path, losses: list[float]) -> bytes:
    """An event file from tensorboard's writer: version record, then loss at steps 1..n."""
    writer = EventFileWriter(str(folder))
    for step, loss in enumerate(losses, start=1):
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag="loss", simple_value=loss)]
        )
        writer.add_event(event_pb2.Event(wall_time=T0 + step, step=step, summary=summary))
    writer.close()
    (path,) = folder.glob("*tfevents*")
    return path.read_bytes()


def record_ends(data: bytes) -> list[int]:
    ends, position = [], 0
    while position < len(data):
        (length,) = struct.unpack_from("<Q", data, position)
        position += 12 + length + 4
        ends.append(position)
    return ends


@pytest.mark.parametrize("restart", [False, True], ids=["same-follower", "sentinel-restarted"])
def test_tensorboard_half_written_record_is_read_once_from_a_record_boundary(
    tmp_path: Path, store: StateStore, restart: bool
) -> None:
    data = event_file_bytes(tmp_path / "written", [2.5, math.nan, 2.0])
    ends = record_ends(data)
    path = tmp_path / "live" / "events.out.tfevents.1700000000.host.1.0"
    path.parent.mkdir()
    watch = Watch(path, store)
    cut = ends[1] + 30  # into the second scalar record
    path.write_bytes(data[:cut])
    watch.read()
    assert watch.follower.offset == ends[1]
    assert store.load_offset(os.stat(path).st_dev, os.stat(path).st_ino).offset == ends[1]
    if restart:
        watch.restart()
    with path.open("ab") as file:
        file.write(data[cut:])
    watch.read()
    assert watch.follower.offset == len(data)
    got = [
        (name, "nan" if math.isnan(value) else value, step) for name, value, step in watch.metrics()
    ]
    expected = [("loss", 2.5, 1), ("loss", "nan", 2), ("loss", 2.0, 3)]
    assert got == (expected[1:] if restart else expected)
    watch.follower.close()


def test_tensorboard_files_found_by_a_glob_are_tailed_as_records(tmp_path: Path) -> None:
    lines: list[tuple[str, str]] = []
    arrived = threading.Condition()

    def on_lines(path: str, batch: list[str], _marks: Marks) -> None:
        with arrived:
            lines.extend((path, line) for line in batch)
            arrived.notify_all()

    tailer = LogTailer(
        [str(tmp_path / "runs" / "**" / "*tfevents*")],
        on_lines,
        poll=True,
        poll_interval_s=0.02,
        splitting=splitting,
    )
    tailer.start()
    try:
        event_file_bytes(tmp_path / "runs" / "exp1", [1.5, 1.25])
        with arrived:
            arrived.wait_for(lambda: len(lines) >= 2, timeout=5.0)
    finally:
        tailer.stop()
    parser = LineParser()
    recorder = Recorder()
    engine = Engine([recorder], parser)
    for source, line in lines:
        engine.feed_line(Line(source, line, T0))
    assert [(s.name, s.value, s.step, s.time) for s in recorder.samples] == [
        ("loss", 1.5, 1, T0 + 1),
        ("loss", 1.25, 2, T0 + 2),
    ]


# -- MLflow metric files ---------------------------------------------------------------------


def test_mlflow_metric_file_appended_line_by_line(tmp_path: Path, store: StateStore) -> None:
    path = tmp_path / "mlruns" / "0" / "f00d" / "metrics" / "train" / "loss"
    path.parent.mkdir(parents=True)
    watch = Watch(path, store)
    path.write_text("1700000000000 2.5 0\n1700000001000 na")
    watch.read()
    with path.open("a") as file:
        file.write("n 1\n")
    watch.read()
    samples = watch.recorder.samples
    assert [(s.name, s.step, s.time) for s in samples] == [
        ("loss", 0, 1_700_000_000.0),
        ("loss", 1, 1_700_000_001.0),
    ]
    assert math.isnan(samples[1].value)
