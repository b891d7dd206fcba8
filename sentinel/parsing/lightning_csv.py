"""Lightning ``CSVLogger`` files: ``metrics.csv``, a header row, then sparse rows.

``epoch,step,train_loss,val_loss`` then one row per ``log_metrics`` call; a
cell left empty was not logged on that row. Every non-empty numeric cell is a
sample (``nan``/``inf`` cells are real NaN/Inf samples; text cells are
ignored). Columns become metric names so:

- ``step`` (or ``global_step``, ``iteration``, ``iter``) is the step and
  ``time``/``timestamp`` the sample time, not metrics;
- ``epoch`` stays ``epoch`` (as the JSON lines parser keeps it);
- other names go through ``normalise_name``: ``train_loss`` -> ``loss``,
  ``val_loss`` -> ``eval_loss``;
- ``<name>_step`` and ``<name>_epoch`` (Lightning's names for a key logged with
  both ``on_step`` and ``on_epoch``): the suffix of the key's natural cadence
  is dropped, the other kept. Training metrics are per step
  (``train_loss_step`` -> ``loss``, ``train_loss_epoch`` -> ``loss_epoch``),
  eval metrics per epoch (``val_loss_epoch`` -> ``eval_loss``,
  ``val_loss_step`` -> ``eval_loss_step``), so rules on ``loss`` and
  ``eval_loss`` see the same series with or without the suffixes. A name is
  an eval metric when it starts with ``val``, ``valid``, ``validation``,
  ``eval`` or ``test`` and then ``_`` or ``/``;
- ``lr-<Optimizer>`` (Lightning's ``LearningRateMonitor``) -> ``lr``.

Lightning rewrites the whole file when a new key appears (same rows, same
order, wider header). The tailer reads it again from byte 0, so the reader
sees rows it has already read: it remembers every row it emitted by content
(a hash of its non-empty cells by column, so the wider header does not change
it) and skips a row it has seen. That also keeps a new file at the same path
right (a resumed run with a fixed ``version``: Lightning deletes the old file),
whose rows differ and are all read. A row identical to one already read, step
included, adds nothing and is skipped too. The memory is one hash per row.
One case it cannot tell: after sentinel restarts mid-file (the follower
resumes at its saved offset), the rows before that offset were read by the
previous process, so the next rewrite delivers them once more.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing.file_format import FileFormat
from sentinel.parsing.lines import LineSplitter
from sentinel.parsing.values import (
    RECORD_STEP_KEYS,
    TIME_KEYS,
    Garbled,
    as_epoch_seconds,
    as_step,
    normalise_name,
)

#: The file name ``CSVLogger`` writes.
FILE_NAME = "metrics.csv"

#: Header cells that mark a Lightning header (Lightning always writes ``step``).
_HEADER_KEYS = frozenset({"step", "epoch"})
_EVAL_PREFIX = re.compile(r"^(?:val|valid|validation|eval|test)[_/]")
_LR_MONITOR = re.compile(r"^lr-[a-z0-9_]+$")
_STEP_RANK = {key: rank for rank, key in enumerate(RECORD_STEP_KEYS)}
_TIME_RANK = {key: rank for rank, key in enumerate(TIME_KEYS)}


def column_metric(column: str) -> str:
    """The canonical metric name of a ``metrics.csv`` column (see the module's table)."""
    lowered = column.strip().lower()
    if _LR_MONITOR.match(lowered):
        return "lr"
    for suffix in ("_step", "_epoch"):
        base = lowered.removesuffix(suffix)
        if base != lowered and base:
            name = normalise_name(base)
            is_eval = _EVAL_PREFIX.match(base) is not None or name.startswith("eval_")
            natural = "_epoch" if is_eval else "_step"
            return name if suffix == natural else name + suffix
    return normalise_name(lowered)


def split_row(text: str) -> list[str]:
    """The cells of one CSV line; ``Garbled`` when the csv module refuses it."""
    try:
        rows = list(csv.reader([text]))
    except csv.Error as error:
        raise Garbled(f"not a CSV row: {text[:80]!r}") from error
    return [cell.strip() for cell in rows[0]] if rows else []


def is_header(cells: Sequence[str]) -> bool:
    """Whether a row is a Lightning header: names only, one of them ``step`` or ``epoch``."""
    if not any(cell.lower() in _HEADER_KEYS for cell in cells):
        return False
    return not any(_is_number(cell) for cell in cells)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class _Header:
    """One header's columns, read once: each column's metric name (None: step/time)."""

    columns: tuple[str, ...]
    names: tuple[str | None, ...]
    step_index: int | None
    time_index: int | None

    @classmethod
    def parse(cls, cells: Sequence[str]) -> _Header:
        lowered = [cell.lower() for cell in cells]
        steps = [index for index, key in enumerate(lowered) if key in _STEP_RANK]
        times = [index for index, key in enumerate(lowered) if key in _TIME_RANK]
        names = tuple(
            None if key in _STEP_RANK or key in _TIME_RANK else column_metric(key)
            for key in lowered
        )
        return cls(
            tuple(cells),
            names,
            min(steps, key=lambda index: _STEP_RANK[lowered[index]], default=None),
            min(times, key=lambda index: _TIME_RANK[lowered[index]], default=None),
        )


class LightningCsvReader:
    """Reads one ``metrics.csv`` fed its lines in order; each row's samples once."""

    def __init__(self) -> None:
        self._header: _Header | None = None
        # Content hashes of the rows already emitted; Python's hash of a frozenset of
        # strings is stable within one process, which is all this needs.
        self._emitted: set[int] = set()

    def parse(self, text: str) -> list[Sample] | None:
        cells = split_row(text)
        if not cells:
            return []
        if is_header(cells):
            self._header = _Header.parse(cells)
            return []
        header = self._header
        if header is None:
            return None
        if len(cells) != len(header.columns):
            raise Garbled(
                f"{len(cells)} cells where the header has {len(header.columns)}: {text[:80]!r}"
            )
        fingerprint = hash(
            frozenset(
                (column, cell) for column, cell in zip(header.columns, cells, strict=True) if cell
            )
        )
        if fingerprint in self._emitted:
            return []
        self._emitted.add(fingerprint)
        step = None if header.step_index is None else as_step(cells[header.step_index])
        time = None if header.time_index is None else as_epoch_seconds(cells[header.time_index])
        samples = []
        for name, cell in zip(header.names, cells, strict=True):
            if name is None or not cell:
                continue
            try:
                value = float(cell)
            except ValueError:
                continue
            samples.append(Sample(name, value, step, time))
        if not samples and step is not None:
            samples.append(Sample(PROGRESS, float(step), step, time))
        return samples


class CsvHeaderSplitter:
    """A ``LineSplitter`` that puts the header first when a follower resumes mid-file.

    A follower that resumes at a saved offset never reads the header again, and
    without it no row can be read. So when the first line this splitter ends is
    not a header, it reads the header from the file's first line and hands it
    on first. That read (of at most ``max_line_bytes``) is the one file read a
    parser module does; it happens at most once per opened file, in the tailer.
    """

    def __init__(self, path: Path, max_line_bytes: int = 1 << 20) -> None:
        self._path = path
        self._max_line_bytes = max_line_bytes
        self._lines = LineSplitter(max_line_bytes)
        self._first = True

    @property
    def pending_bytes(self) -> int:
        return self._lines.pending_bytes

    def feed(self, data: bytes) -> list[str]:
        return self._with_header(self._lines.feed(data))

    def flush(self) -> list[str]:
        return self._with_header(self._lines.flush())

    def _with_header(self, lines: list[str]) -> list[str]:
        if not self._first or not lines:
            return lines
        self._first = False
        try:
            if is_header(split_row(lines[0])):
                return lines
        except Garbled:
            pass
        header = read_header(self._path, self._max_line_bytes)
        return lines if header is None else [header, *lines]


def read_header(path: Path, max_line_bytes: int = 1 << 20) -> str | None:
    """The first line of ``path`` when it is a Lightning header; None otherwise."""
    try:
        with path.open("rb") as file:
            head = file.read(max_line_bytes)
    except OSError:
        return None
    splitter = LineSplitter(max_line_bytes)
    lines = splitter.feed(head)
    if not lines:
        return None
    try:
        return lines[0] if is_header(split_row(lines[0])) else None
    except Garbled:
        return None


class LightningCsvFiles(FileFormat):
    """A file named ``metrics.csv`` (Lightning's ``CSVLogger``)."""

    def match(self, path: PurePath) -> str | None:
        return "" if path.name == FILE_NAME else None

    def new_reader(self, key: str) -> LightningCsvReader:
        return LightningCsvReader()

    def new_splitter(self, path: Path, max_line_bytes: int) -> CsvHeaderSplitter:
        return CsvHeaderSplitter(path, max_line_bytes)


FORMAT = LightningCsvFiles()
