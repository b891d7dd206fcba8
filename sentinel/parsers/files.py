"""Structured metric files: formats read as a whole file, not line by line.

Some frameworks write metrics in files whose lines cannot be read alone: a
Lightning ``metrics.csv`` needs its header, an MLflow metric file is named
after its metric, a TensorBoard event file is binary records. Each format is
a module in this package; this one picks the format of a path and gives the
tailer and ``replay`` what they need to read it:

- ``reader_for(path)``: a stateful ``FileReader`` fed that file's lines in
  order (None for plain logs, which ``LineParser`` reads line by line);
- ``splitter_for(path, max_line_bytes)``: what turns the file's bytes into
  lines (text lines, or for binary records one JSON line per record);
- ``iter_replay(paths)``: every line of the given files or run folders, in
  the order a live run would have produced them, with its source path.

A path's format comes from the path alone (``file_format``), first match:

- ``mlflow``: ``.../mlruns/<experiment_id>/<run_id>/metrics/<key...>``, the
  ``metrics`` folder exactly three below a folder named ``mlruns`` (MLflow's
  default ``./mlruns``; a file store under another name is not recognised);
- ``tensorboard``: the file name contains ``tfevents``;
- ``lightning_csv``: the file name is ``metrics.csv`` (Lightning's CSVLogger);
- anything else is a plain log (None).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path, PurePath
from typing import Literal, Protocol

from sentinel.parsers import lightning_csv, mlflow, tensorboard
from sentinel.parsers.tensorboard import INSTALL_HINT, MissingExtra
from sentinel.records import Sample
from sentinel.sources.lines import LineSplitter

logger = logging.getLogger(__name__)

Format = Literal["lightning_csv", "mlflow", "tensorboard"]

_CHUNK_BYTES = 1 << 20
_DIGITS = re.compile(r"(\d+)")


class FileReader(Protocol):
    """Reads one structured metrics file, fed its lines in order.

    Like a ``ParseFn``: returns the line's samples (maybe none), None when the
    line is not understood, raises ``Garbled`` for a broken line.
    """

    def parse(self, text: str) -> list[Sample] | None: ...


class Splitter(Protocol):
    """Turns a file's bytes into text lines (``LineSplitter`` is one)."""

    @property
    def pending_bytes(self) -> int:
        """Bytes taken but not yet ended as a line: a reader must not count them as done."""
        ...

    def feed(self, data: bytes) -> list[str]: ...

    def flush(self) -> list[str]: ...


def file_format(path: str | PurePath) -> Format | None:
    """The structured format of ``path`` by the rules in this module's docstring."""
    if mlflow.metric_key(path) is not None:
        return "mlflow"
    name = PurePath(path).name
    if tensorboard.NAME_MARK in name:
        return "tensorboard"
    if name == lightning_csv.FILE_NAME:
        return "lightning_csv"
    return None


def reader_for(path: str) -> FileReader | None:
    """A new reader for ``path`` when it is a structured format; None for a plain log."""
    kind = file_format(path)
    if kind == "lightning_csv":
        return lightning_csv.LightningCsvReader()
    if kind == "mlflow":
        key = mlflow.metric_key(path)
        assert key is not None
        return mlflow.MlflowMetricReader(key)
    if kind == "tensorboard":
        return tensorboard.TensorBoardReader()
    return None


def splitter_for(path: str | PurePath, max_line_bytes: int = 1 << 20) -> Splitter:
    """What turns the bytes of ``path`` into lines for its reader.

    Never raises: an event file while tensorboard is missing gets a splitter
    that holds its bytes unread, and the missing extra is logged once per path
    (``require_extras`` is the check that fails at start).
    """
    kind = file_format(path)
    if kind == "tensorboard":
        try:
            return tensorboard.RecordSplitter(max_line_bytes)
        except MissingExtra as error:
            _report_unreadable(str(path), str(error))
            return tensorboard.HeldSplitter()
    if kind == "lightning_csv":
        return lightning_csv.CsvHeaderSplitter(Path(path), max_line_bytes)
    return LineSplitter(max_line_bytes)


@functools.cache
def _report_unreadable(path: str, reason: str) -> None:
    logger.error("%s is not read: %s", path, reason)


def require_extras(paths: Iterable[str | PurePath]) -> None:
    """Raise ``MissingExtra`` when a path (or glob) names a format whose extra is missing.

    For the start of ``watch``/``replay``: a glob that does not say ``tfevents``
    cannot be checked until its files appear; those are then held unread, with
    an error logged (see ``splitter_for``).
    """
    if any(tensorboard.NAME_MARK in PurePath(path).name for path in paths):
        tensorboard.codec()


def iter_replay(paths: Sequence[Path]) -> Iterator[tuple[str, str]]:
    """``(source, line)`` for every line of the files, in order.

    Files are read in the order given; a folder stands for the metric files
    in it (see ``replay_plan``). An MLflow run's metric files are merged in
    (step, timestamp) order, each line with its own file as source; a
    TensorBoard file gives one JSON line per scalar record. Plain logs and
    event files are streamed; an MLflow run is read whole. Raises, before
    the first line, ``FileNotFoundError`` for a folder without metric files
    and ``MissingExtra`` for event files without tensorboard.
    """
    for source, lines in iter_replay_batches(paths):
        for line in lines:
            yield source, line


def iter_replay_batches(paths: Sequence[Path]) -> Iterator[tuple[str, list[str]]]:
    """``iter_replay`` a batch at a time: ``(source, lines)``, the lines of one read of a
    file (about a megabyte), or one line of an MLflow run."""
    plan = replay_plan(paths)
    require_extras(file for group in plan for file in group)
    for group in plan:
        if file_format(group[0]) == "mlflow":
            for source, line in mlflow.merged_lines(group):
                yield source, [line]
        else:
            yield from _file_batches(group[0])


def replay_plan(paths: Sequence[Path]) -> list[list[Path]]:
    """What ``iter_replay`` reads: files one by one, an MLflow run's files together.

    A file is read as given, whatever its format. A folder is searched
    recursively (names in natural order, so ``version_10`` comes after
    ``version_9``; hidden names like ``.trash`` and an MLflow run's
    ``artifacts`` skipped) for the files a format recognises: an MLflow run
    folder or ``mlruns`` root gives its metric files, a Lightning log folder
    its ``metrics.csv``, a TensorBoard log folder its event files; plain logs
    in a folder are not read. The metric files of one MLflow run form one
    group, in the place of the first of them. A file named twice is read once.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = _walk(path)
            if not found:
                raise FileNotFoundError(
                    f"{path}: no metrics.csv, MLflow metric or TensorBoard event file in it"
                )
            files += found
        else:
            files.append(_classifiable(path))
    plan: list[list[Path]] = []
    runs: dict[PurePath, list[Path]] = {}
    seen: set[str] = set()
    for file in files:
        absolute = os.path.abspath(file)
        if absolute in seen:
            continue
        seen.add(absolute)
        run = mlflow.run_folder(file)
        if run is None:
            plan.append([file])
        elif run in runs:
            runs[run].append(file)
        else:
            runs[run] = [file]
            plan.append(runs[run])
    return plan


def _walk(folder: Path) -> list[Path]:
    """The files under ``folder`` that a format recognises, in natural name order."""
    found: list[Path] = []
    for root, folders, names in os.walk(folder):
        folders[:] = sorted(
            (name for name in folders if not _skipped_folder(root, name)), key=_natural
        )
        for name in sorted(names, key=_natural):
            file = _classifiable(Path(root, name))
            if not name.startswith(".") and file_format(file) is not None:
                found.append(file)
    return found


def _skipped_folder(root: str, name: str) -> bool:
    if name.startswith("."):
        return True
    # An MLflow run's artifacts may hold copies of metric files (a logged metrics.csv).
    return name == "artifacts" and mlflow.run_folder(Path(root, "metrics", "key")) is not None


def _classifiable(path: Path) -> Path:
    """``path``, or its absolute form when only that shows its format (``.`` in a run)."""
    if file_format(path) is not None:
        return path
    absolute = Path(os.path.abspath(path))
    return absolute if file_format(absolute) is not None else path


def _natural(name: str) -> tuple[str | int, ...]:
    """Sort key that orders the numbers in names by value: ``v2`` before ``v10``."""
    # split() with a group alternates text and digits, so equal positions hold equal types.
    return tuple(int(part) if index % 2 else part for index, part in enumerate(_DIGITS.split(name)))


def _file_batches(path: Path) -> Iterator[tuple[str, list[str]]]:
    """The lines of one file through its format's splitter, a read at a time, streamed."""
    source = str(path)
    splitter = splitter_for(path)
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK_BYTES):
            lines = splitter.feed(chunk)
            if lines:
                yield source, lines
    lines = splitter.flush()
    if lines:
        yield source, lines


__all__ = [
    "INSTALL_HINT",
    "FileReader",
    "Format",
    "MissingExtra",
    "Splitter",
    "file_format",
    "iter_replay",
    "iter_replay_batches",
    "reader_for",
    "replay_plan",
    "require_extras",
    "splitter_for",
]
