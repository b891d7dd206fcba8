"""A followed path's format is decided once, above the sources and the parsers."""

from __future__ import annotations

from pathlib import Path

from sentinel.follow.logfile import FileFollower
from sentinel.parsing.lightning_csv import CsvHeaderSplitter
from sentinel.parsing.lines import LineSplitter
from sentinel.supervisor.metric_files import splitting


def test_a_format_gets_its_own_splitter_and_a_plain_log_text_lines() -> None:
    assert isinstance(splitting("logs/version_0/metrics.csv")(1024), CsvHeaderSplitter)
    assert type(splitting("mlruns/0/abc/metrics/loss")(1024)) is LineSplitter
    assert type(splitting("train.log")(1024)) is LineSplitter
    # (An event file's record splitter: tests/sources/test_structured_tailing.py.)


def test_a_follower_resuming_a_csv_gets_its_header_only_through_the_csv_splitter(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss\n1,2.0\n")
    status = path.stat()
    with path.open("a") as stream:
        stream.write("2,1.5\n")
    skip = (status.st_dev, status.st_ino, status.st_size)  # resumes after row 1
    # Left to itself a follower knows no format: the new row alone, unreadable without its header.
    assert FileFollower(path, skip=skip).read() == ["2,1.5"]
    follower = FileFollower(path, skip=skip, new_splitter=splitting(path))
    assert follower.read() == ["step,loss", "2,1.5"]
