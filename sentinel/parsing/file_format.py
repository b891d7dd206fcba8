"""What a metrics format read as a whole file is, for its module and for ``files``.

Some frameworks write metrics in files whose lines cannot be read alone (a header names
the columns, the file's name is the metric's, records are binary). Each such format is
one module in this package with a ``FileFormat`` subclass, and one line in
``registry.FILE_FORMATS``; ``files`` asks the formats, in that order, which one a path is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePath
from typing import Protocol

from sentinel.model.records import Sample
from sentinel.parsing.lines import LineSplitter, Splitter


class FileReader(Protocol):
    """Reads one structured metrics file, fed its lines in order.

    Like a ``ParseFn``: returns the line's samples (maybe none), None when the
    line is not understood, raises ``Garbled`` for a broken line.
    """

    def parse(self, text: str) -> list[Sample] | None: ...


class FileFormat(ABC):
    """A metrics format read as a whole file: which paths are in it, and how to read one.

    ``match`` and ``new_reader`` are the format's own; the rest has the defaults of a
    text format whose files are read one by one, and a format overrides what differs.
    """

    @abstractmethod
    def match(self, path: PurePath) -> str | None:
        """The file's key within the format when ``path`` is in it ("" when the format
        needs none; an MLflow metric file's key, the metric's name); None otherwise.
        Decided from the path alone, which may be a glob."""

    @abstractmethod
    def new_reader(self, key: str) -> FileReader:
        """A reader for one file's lines, from its first; ``key`` is ``match``'s."""

    def new_splitter(self, path: Path, max_line_bytes: int) -> Splitter:
        """What turns the file's bytes into lines for its reader, from its start. Never
        raises."""
        del path
        return LineSplitter(max_line_bytes)

    def unreadable(self) -> str | None:
        """Why files of this format cannot be read here (a package it needs is missing);
        None when they can. Every built-in format reads its files with sentinel's own
        dependencies."""
        return None

    def group(self, path: PurePath, key: str) -> PurePath | None:
        """The folder whose files of this format are read together, merged in step
        order (``merged_lines``); None for a format whose files stand alone."""
        del path, key
        return None

    def merged_lines(self, paths: Sequence[Path]) -> Iterator[tuple[str, str]]:
        """``(source, line)`` of the files of one ``group``, in the order a live run wrote
        them. This default reads them one after the other."""
        for path in paths:
            text = path.read_bytes().decode("utf-8", errors="replace")
            source = str(path)
            for line in text.splitlines():
                if line.strip():
                    yield source, line

    def skips_folder(self, root: Path, name: str) -> bool:
        """Whether a search of folders for metric files passes over ``root/name``
        (which may hold copies of this format's files)."""
        del root, name
        return False
