"""Structured metric files: formats read as a whole file, not line by line.

Some frameworks write metrics in files whose lines cannot be read alone: a
Lightning ``metrics.csv`` needs its header, an MLflow metric file is named
after its metric, a TensorBoard event file is binary records. Each format is
a module in this package; this one picks the format of a path and gives the
tailer and ``replay`` what they need to read it:

- ``reader_for(path)``: a stateful ``FileReader`` fed that file's lines in
  order (None for plain logs, which ``LineParser`` reads line by line);
- ``splitter_for(path)``: what turns the file's bytes into lines (text
  lines, or for binary records one JSON line per record);
- ``iter_replay(paths)``: every line of the given files or run folders, in
  the order a live run would have produced them, with its source path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from sentinel.records import Sample


class FileReader(Protocol):
    """Reads one structured metrics file, fed its lines in order.

    Like a ``ParseFn``: returns the line's samples (maybe none), None when the
    line is not understood, raises ``Garbled`` for a broken line.
    """

    def parse(self, text: str) -> list[Sample] | None: ...


def reader_for(path: str) -> FileReader | None:
    """A new reader for ``path`` when it is a structured format; None for a plain log."""
    return None


def iter_replay(paths: Sequence[Path]) -> Iterator[tuple[str, str]]:
    """``(source, line)`` for every line of the files, in order."""
    from sentinel.sources.lines import LineSplitter

    for path in paths:
        splitter = LineSplitter()
        with path.open("rb") as file:
            while chunk := file.read(1 << 20):
                for line in splitter.feed(chunk):
                    yield str(path), line
        for line in splitter.flush():
            yield str(path), line
