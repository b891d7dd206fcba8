"""Parsing: bytes into lines, one line of log text into metric samples, metric files read whole.

A parser is a pure function of one line (no I/O, no clock, no state) with the
``ParseFn`` contract:

- it returns ``None`` when the line is not in its format (try the next parser);
- it returns a list, maybe empty, when it recognised the line: its samples;
- it raises ``Garbled`` when the line clearly is its format but broken (a
  truncated JSON object). Nothing else may escape a parser.

``values`` holds what every format shares (``Garbled``, ``ParseFn``, metric
names, steps and times), each format is a module, ``registry`` names the
built-in ones (one line each), and ``LineParser`` (``line_parser``) auto-detects
the format of each line, tries user regexes first, and counts what it could not
read. A format that needs an earlier line (a header, an epoch line) is a
``LineFormat`` class, one instance per parser (``formats`` tries them). A format
module imports ``values`` (or ``file_format``), never the package. ``lines``
splits a byte stream into text lines (for the followers of files and the job's
output); ``files`` reads the metric files read as a whole (TensorBoard, MLflow,
Lightning's CSV), each format a ``FileFormat`` (``file_format``). ``protowire`` (the
protobuf wire format) and ``crc32c`` (the TFRecord checksum) let the TensorBoard format
read event files with no package of tensorboard's.

Pure: it imports only the model, never a library that does I/O nor the store.
"""

from __future__ import annotations

from sentinel.parsing.line_parser import LineParser, ParseStats
from sentinel.parsing.registry import PARSERS
from sentinel.parsing.values import (
    ALIASES,
    STEP_KEYS,
    TIME_KEYS,
    Garbled,
    ParseFn,
    as_epoch_seconds,
    as_float,
    as_step,
    iso_to_epoch_seconds,
    normalise_name,
)

__all__ = [
    "ALIASES",
    "PARSERS",
    "STEP_KEYS",
    "TIME_KEYS",
    "Garbled",
    "LineParser",
    "ParseFn",
    "ParseStats",
    "as_epoch_seconds",
    "as_float",
    "as_step",
    "iso_to_epoch_seconds",
    "normalise_name",
]
