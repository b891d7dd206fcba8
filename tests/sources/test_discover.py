"""Metric files found under a folder as a job writes them: real files, real inotify."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sentinel.config import Settings
from sentinel.follow import discover
from sentinel.follow.discover import MetricFileFinder
from sentinel.follow.tailer import LogTailer
from sentinel.store.state import StateStore
from sentinel.supervisor.events import Event, OutputLines, TrainerStateRead
from sentinel.supervisor.metric_files import is_metric_file, unreadable
from sentinel.supervisor.workers import Workers, discovery

WAIT_S = 10.0


class Found:
    """What a finder reported, with a wait for the next one."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.skips: list[tuple[int, int, int] | None] = []
        self._event = threading.Event()

    def __call__(self, path: str, skip: tuple[int, int, int] | None) -> None:
        self.paths.append(path)
        self.skips.append(skip)
        self._event.set()

    def wait_for(self, count: int) -> list[str]:
        deadline = time.monotonic() + WAIT_S
        while len(self.paths) < count and time.monotonic() < deadline:
            self._event.wait(0.05)
            self._event.clear()
        return self.paths


def _finder(root: Path, found: Found, **options: Any) -> MetricFileFinder:
    """A finder that knows metric files as sentinel's own does
    (``sentinel.supervisor.metric_files``)."""
    return MetricFileFinder(
        root, found, is_metric_file=is_metric_file, unreadable=unreadable, **options
    )


def _write(path: Path, text: str = "step,loss\n1,2.0\n", *, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age_s:
        stamp = time.time() - age_s
        os.utime(path, (stamp, stamp))
    return path


@pytest.mark.parametrize(
    ("name", "wanted"),
    [
        ("lightning_logs/version_3/metrics.csv", True),
        ("runs/Nov25_host/events.out.tfevents.1732.host.1.0", True),
        ("mlruns/0/0123abcd/metrics/train_loss", True),
        ("output/metrics.json", True),
        ("work_dirs/vis_data/scalars.json", True),
        ("train_log.jsonl", True),
        ("out/checkpoint-500/trainer_state.json", True),
        ("data/shard_00.jsonl", False),
        ("output/checkpoint-500/model.safetensors", False),
        ("results.txt", False),
    ],
    ids=lambda value: str(value),
)
def test_metric_files_are_known_by_name(name: str, wanted: bool) -> None:
    assert is_metric_file(name) is wanted


@pytest.mark.slow
def test_a_file_the_job_writes_is_found_as_it_appears_and_only_once(tmp_path: Path) -> None:
    found = Found()
    finder = _finder(tmp_path, found, since=time.time())
    finder.start()
    try:
        # Lightning makes the folder, then the file in it: both must be seen.
        csv = _write(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")
        assert found.wait_for(1) == [str(csv)]
        with csv.open("a") as stream:  # written again: not a new file
            stream.write("2,1.5\n")
        events = _write(tmp_path / "lightning_logs" / "version_0" / "events.out.tfevents.1.h")
        assert found.wait_for(2) == [str(csv), str(events)]
    finally:
        finder.stop()
    assert not finder.running


@pytest.mark.slow
def test_a_root_made_after_the_start_is_searched_as_soon_as_it_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No safety look within the test: only the folder's making can wake the finder.
    monkeypatch.setattr(discover, "RESCAN_INTERVAL_S", 3600.0)
    found = Found()
    finder = _finder(tmp_path / "runs", found, since=time.time())
    finder.start()
    try:
        time.sleep(0.2)  # the first look, at nothing
        csv = _write(tmp_path / "runs" / "lightning_logs" / "version_0" / "metrics.csv")
        assert found.wait_for(1) == [str(csv)]
    finally:
        finder.stop()


def test_old_files_hidden_folders_quarantine_and_weights_are_not_followed(
    tmp_path: Path,
) -> None:
    old = _write(tmp_path / "lightning_logs" / "version_0" / "metrics.csv", age_s=3600)
    found = Found()
    finder = _finder(tmp_path, found, since=time.time(), max_depth=4)
    assert finder.look() == []
    _write(tmp_path / ".git" / "metrics.csv")
    _write(tmp_path / "checkpoints" / "quarantine" / "20261125" / "metrics.csv")
    _write(tmp_path / "venv2" / "pyvenv.cfg", "home = /usr\n")
    _write(tmp_path / "venv2" / "lib" / "metrics.csv")
    _write(tmp_path / "checkpoints" / "checkpoint-10" / "model.safetensors", "weights")
    _write(tmp_path / "a" / "b" / "c" / "d" / "metrics.csv")  # five parts below: too deep
    new = _write(tmp_path / "a" / "b" / "c" / "metrics.csv")
    assert finder.look() == [str(new)]
    # The old run's file written again (the same job appending): now it counts.
    os.utime(old)
    assert finder.look() == [str(old)]


def test_a_jsonl_file_from_before_the_run_is_followed_past_its_old_lines(
    tmp_path: Path,
) -> None:
    """A job that appends to yesterday's metrics.jsonl: yesterday's NaN is not today's."""
    old = '{"step": 5, "loss": NaN}\n'
    path = _write(tmp_path / "metrics.jsonl", old, age_s=3600)
    found = Found()
    finder = _finder(tmp_path, found, since=time.time())
    assert finder.look() == []
    with path.open("a") as stream:
        stream.write('{"step": 0, "loss": 2.5}\n')
    assert finder.look() == [str(path)]
    status = path.stat()
    assert found.skips == [(status.st_dev, status.st_ino, len(old))]
    lines: list[str] = []
    tailer = LogTailer([], lambda _, read, _marks: lines.extend(read))
    tailer.add(str(path), found.skips[0])
    tailer.start()
    tailer.stop()
    assert lines == ['{"step": 0, "loss": 2.5}']
    # A new file at the same path (the job started it afresh) is read whole.
    replaced = tmp_path / "new.jsonl"
    replaced.write_text(old)
    replaced.replace(path)
    again = LogTailer([], lambda _, read, _marks: lines.extend(read))
    again.add(str(path), found.skips[0])
    again.start()
    again.stop()
    assert lines[1:] == [old.strip()]


def test_bounds_on_files_and_folders(tmp_path: Path) -> None:
    for index in range(5):
        _write(tmp_path / f"version_{index}" / "metrics.csv")
    finder = _finder(tmp_path, Found(), since=time.time(), max_files=3)
    assert len(finder.look()) == 3
    assert finder.look() == []
    narrow = _finder(tmp_path, Found(), since=time.time(), max_dirs=3)
    assert len(narrow.look()) == 2  # the root and two of its folders


def test_a_metric_file_that_cannot_be_read_here_is_not_reported_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def needs_an_extra(path: str) -> str | None:
        return "needs an extra" if "tfevents" in path else None

    finder = MetricFileFinder(
        tmp_path, Found(), since=time.time(), is_metric_file=is_metric_file,
        unreadable=needs_an_extra,
    )  # fmt: skip
    for run in ("a", "b"):
        _write(tmp_path / "runs" / run / "events.out.tfevents.1.host", "")
    csv = _write(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")
    with caplog.at_level(logging.WARNING, logger="sentinel.follow.discover"):
        assert finder.look() == [str(csv)]
        assert finder.look() == []
    said = [r.getMessage() for r in caplog.records if "needs an extra" in r.getMessage()]
    assert len(said) == 1 and "is not followed" in said[0]


def test_a_trainer_state_is_reported_once_complete_and_not_counted_as_followed(
    tmp_path: Path,
) -> None:
    finder = _finder(tmp_path, Found(), since=time.time(), max_files=1)
    state = _write(tmp_path / "out" / "checkpoint-10" / "trainer_state.json", '{"log_history": [')
    csv = _write(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")
    assert finder.look() == [str(csv)]  # HF is still writing it
    state.write_text('{"log_history": [{"epoch": 0.1, "step": 10, "loss": 2.0}]}')
    later = _write(tmp_path / "out" / "checkpoint-20" / "trainer_state.json", "{}")
    assert finder.look() == [str(state), str(later)]  # past max_files: read, not followed


def test_discovery_is_on_for_run_in_its_folder_and_opt_in_for_watch(tmp_path: Path) -> None:
    run = discovery(Settings(), "run")
    assert run is not None and run[0] == os.getcwd()
    assert discovery(Settings(), "watch") is None
    watched = discovery(Settings(tail={"discover_dir": tmp_path}), "watch")
    assert watched is not None and watched[0] == str(tmp_path)
    assert watched[1] < time.time() - 60  # a running job's file, written a while ago
    assert discovery(Settings(tail={"discover": False}), "run") is None


@pytest.mark.slow
def test_a_file_named_by_log_is_not_followed_twice(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    settings = Settings(
        logs=[str(logs / "*" / "metrics.csv")],
        state_dir=tmp_path / "state",
        tail={"discover_dir": tmp_path},
    )
    store = StateStore(settings.state_dir)
    received: list[tuple[str, list[str]]] = []
    states: list[tuple[str, str]] = []

    def put(event: Event) -> None:
        if isinstance(event, OutputLines):
            received.append((event.source, event.lines))
        elif isinstance(event, TrainerStateRead):
            states.append((event.source, event.text))

    workers = Workers(
        settings, store,
        put=put,
        healthy=lambda: True,
        mode="watch",
    )  # fmt: skip
    workers.start()
    try:
        configured = _write(logs / "version_0" / "metrics.csv")
        found = _write(tmp_path / "other" / "metrics.csv")
        state = _write(tmp_path / "out" / "checkpoint-5" / "trainer_state.json", '{"a": 1}')
        assert workers.finder is not None and workers.tailer is not None
        deadline = time.monotonic() + WAIT_S
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a second reader of the same file would have read it by now
    finally:
        workers.stop_reading()
        workers.stop_notifying(0)
        store.close()
    assert sorted(os.path.basename(os.path.dirname(path)) for path, _ in received) == [
        "other",
        "version_0",
    ]
    assert sorted(workers.finder.found) == sorted([str(configured), str(found), str(state)])
    assert states == [(str(state), '{"a": 1}')]  # whole, to the loop, never tailed
    assert workers.alive is False  # stopped
