"""Structured metric files: formats read as a whole file, not line by line.

Some frameworks write metrics in files whose lines cannot be read alone: a
Lightning ``metrics.csv`` needs its header, an MLflow metric file is named
after its metric, a TensorBoard event file is binary records. Each format is
a module in this package with a ``FileFormat`` (``file_format``), listed in
``registry.FILE_FORMATS``; this module decides the format of a path, once
(``classify``), and the ``MetricsFile`` it returns gives the followers of
files (through ``sentinel.supervisor.metric_files``, which knows both them and this
package; neither knows the other) and ``replay`` what they need to read it:

- ``MetricsFile.new_reader()``: a stateful ``FileReader`` fed that file's lines
  in order (None for plain logs, which ``LineParser`` reads line by line);
- ``MetricsFile.new_splitter(max_line_bytes)``: what turns the file's bytes
  into lines (text lines, or for binary records one JSON line per record);
- ``replay_plan(paths)`` then ``iter_replay_batches(plan)``: every line of the
  given files or run folders, in the order a live run would have produced
  them, with its source path.

``file_format`` and ``reader_for`` are ``classify`` and one of those, for a caller
that needs just one thing of a path.

A path's format comes from the path alone: the first of ``FILE_FORMATS`` that
matches it (mlflow, then tensorboard, then lightning_csv; each module's docstring
says which paths are its); a path none matches is a plain log (None).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from sentinel.parsing.file_format import FileFormat, FileReader
from sentinel.parsing.lines import LineSplitter, Splitter
from sentinel.parsing.registry import FILE_FORMATS

log = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20
_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True)
class MetricsFile:
    """A path and its format, decided once (``classify``): its reader and splitter follow."""

    path: Path
    #: The format's name in ``FILE_FORMATS``; None for a plain log.
    format: str | None
    #: The file's key within its format (``FileFormat.match``): an MLflow metric file's
    #: key, the metric's name as logged (``train/loss``); "" for a format without one.
    key: str | None = None

    @property
    def source(self) -> str:
        """The name its lines carry (alerts, offsets): the path as given."""
        return str(self.path)

    @property
    def kind(self) -> FileFormat | None:
        """The format itself; None for a plain log."""
        return None if self.format is None else FILE_FORMATS[self.format]

    @property
    def group(self) -> PurePath | None:
        """The folder whose files are read together with this one (an MLflow run's);
        None for a file that stands alone."""
        kind = self.kind
        if kind is None or self.key is None:
            return None
        return kind.group(self.path, self.key)

    def new_reader(self) -> FileReader | None:
        """A reader for this file's lines, from the first; None for a plain log."""
        kind = self.kind
        if kind is None or self.key is None:
            return None
        return kind.new_reader(self.key)

    def new_splitter(self, max_line_bytes: int = 1 << 20) -> Splitter:
        """What turns this file's bytes into lines for its reader, from its start."""
        kind = self.kind
        if kind is None:
            return LineSplitter(max_line_bytes)
        return kind.new_splitter(self.path, max_line_bytes)

    def unreadable(self) -> str | None:
        """Why this file cannot be read here (``FileFormat.unreadable``); None when it can."""
        kind = self.kind
        return None if kind is None else kind.unreadable()


def classify(path: str | PurePath) -> MetricsFile:
    """``path`` with its structured format, by the rules in this module's docstring."""
    pure = PurePath(path)
    for name, kind in FILE_FORMATS.items():
        key = kind.match(pure)
        if key is not None:
            return MetricsFile(Path(path), name, key)
    return MetricsFile(Path(path), None)


def file_format(path: str | PurePath) -> str | None:
    """The structured format of ``path`` (``classify``); None for a plain log."""
    return classify(path).format


def reader_for(path: str) -> FileReader | None:
    """A new reader for ``path`` when it is a structured format; None for a plain log."""
    return classify(path).new_reader()


#: What replay reads, in order: each group one file, or the metric files of one MLflow run.
ReplayPlan = list[list[MetricsFile]]


def iter_replay(paths: Sequence[Path]) -> Iterator[tuple[str, str]]:
    """``(source, line)`` for every line of the files, in order.

    Files are read in the order given; a folder stands for the metric files
    in it (see ``replay_plan``). An MLflow run's metric files are merged in
    (step, timestamp) order, each line with its own file as source; a
    TensorBoard file gives one JSON line per scalar record. Plain logs and
    event files are streamed; an MLflow run is read whole. Raises, before
    the first line, ``FileNotFoundError`` for a folder without metric files.
    """
    for source, lines in iter_replay_batches(replay_plan(paths)):
        for line in lines:
            yield source, line


def iter_replay_batches(plan: ReplayPlan) -> Iterator[tuple[str, list[str]]]:
    """The lines of a ``replay_plan`` a batch at a time: ``(source, lines)``, the lines
    of one read of a file (about a megabyte), or one line of an MLflow run."""
    for group in plan:
        first = group[0]
        if first.group is not None and first.kind is not None:
            for source, line in first.kind.merged_lines([file.path for file in group]):
                yield source, [line]
        else:
            yield from _file_batches(group[0])


def replay_plan(paths: Sequence[Path]) -> ReplayPlan:
    """What ``iter_replay`` reads: files one by one, an MLflow run's files together, each
    file's format decided here once.

    A file is read as given, whatever its format. A folder is searched
    recursively (names in natural order, so ``version_10`` comes after
    ``version_9``; hidden names like ``.trash`` and an MLflow run's
    ``artifacts`` skipped) for the files a format recognises: an MLflow run
    folder or ``mlruns`` root gives its metric files, a Lightning log folder
    its ``metrics.csv``, a TensorBoard log folder its event files; plain logs
    in a folder are not read. The metric files of one MLflow run form one
    group, in the place of the first of them. A file named twice is read once.

    Raises ``FileNotFoundError`` for a folder without metric files.
    """
    files: list[MetricsFile] = []
    for path in paths:
        if path.is_dir():
            found = _walk(path)
            if not found:
                raise FileNotFoundError(
                    f"{path}: no metrics.csv, MLflow metric or TensorBoard event file in it"
                )
            files += found
        else:
            files.append(_classify_in_place(path))
    plan: ReplayPlan = []
    runs: dict[PurePath, list[MetricsFile]] = {}
    seen: set[str] = set()
    for file in files:
        absolute = os.path.abspath(file.path)
        if absolute in seen:
            continue
        seen.add(absolute)
        run = file.group
        if run is None:
            plan.append([file])
        elif run in runs:
            runs[run].append(file)
        else:
            runs[run] = [file]
            plan.append(runs[run])
    return plan


def _walk(folder: Path) -> list[MetricsFile]:
    """The files under ``folder`` that a format recognises, in natural name order."""
    found: list[MetricsFile] = []
    for root, folders, names in os.walk(folder):
        folders[:] = sorted(
            (name for name in folders if not _skipped_folder(root, name)), key=_natural
        )
        for name in sorted(names, key=_natural):
            if name.startswith("."):
                continue
            path = Path(root, name)
            if not path.is_file():
                # A dangling link, a FIFO: one such file aborted the whole replay.
                log.warning("%s is no file to read (a dangling link?): skipped", path)
                continue
            file = _classify_in_place(path)
            if file.format is not None:
                found.append(file)
    return found


def _skipped_folder(root: str, name: str) -> bool:
    if name.startswith("."):
        return True
    return any(kind.skips_folder(Path(root), name) for kind in FILE_FORMATS.values())


def _classify_in_place(path: Path) -> MetricsFile:
    """``classify``, of the absolute path when only that shows a format (``.`` in a run)."""
    file = classify(path)
    if file.format is not None:
        return file
    absolute = classify(os.path.abspath(path))
    return absolute if absolute.format is not None else file


def _natural(name: str) -> tuple[str | int, ...]:
    """Sort key that orders the numbers in names by value: ``v2`` before ``v10``."""
    # split() with a group alternates text and digits, so equal positions hold equal types.
    return tuple(int(part) if index % 2 else part for index, part in enumerate(_DIGITS.split(name)))


def _file_batches(file: MetricsFile) -> Iterator[tuple[str, list[str]]]:
    """The lines of one file through its format's splitter, a read at a time, streamed."""
    source = file.source
    splitter = file.new_splitter()
    with file.path.open("rb") as stream:
        while chunk := stream.read(_CHUNK_BYTES):
            lines = splitter.feed(chunk)
            if lines:
                yield source, lines
    lines = splitter.flush()
    if lines:
        yield source, lines


__all__ = [
    "FileFormat",
    "FileReader",
    "MetricsFile",
    "ReplayPlan",
    "Splitter",
    "classify",
    "file_format",
    "iter_replay",
    "iter_replay_batches",
    "reader_for",
    "replay_plan",
]
