"""Many JSON-lines records at once, as columns: replay's fast path for metrics logs.

A metrics log repeats one set of field names on every line. ``parse_block``
decodes a run of such lines in one call (one JSON array) and hands back each
field as a list, for the engine to show the rules as a ``Block``. It says None
whenever the lines are not all plain records of one schema that ``parse_jsonl``
would read the same way line by line; the caller then goes line by line, which
is always right. So every check here is a reason to refuse, never to guess.
"""

from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import dataclass
from itertools import groupby
from math import isfinite
from operator import itemgetter
from typing import Any

from sentinel.model.records import PROGRESS
from sentinel.parsing.fields import SCHEMAS, fast_loads, schema_of
from sentinel.parsing.values import EPOCH_MS, MAX_STEP

_FLOAT = frozenset({float})
_NUMBER = frozenset({float, int})
_INT = frozenset({int})
#: Between lines decoded together: a raw newline, which no JSON string may hold.
_SEPARATOR = ",\n"

#: Lines ``start`` to ``stop`` of one schema, as columns (None: to be read line by line).
Run = tuple[int, int, "Columns | None"]


@dataclass(slots=True, eq=False)
class Columns:
    """The records of a run of lines: metric names in field order, a column each."""

    names: tuple[str, ...]
    columns: dict[str, list[float]]
    steps: list[int]
    times: list[float] | None

    def __len__(self) -> int:
        return len(self.steps)

    def slice(self, start: int, stop: int) -> Columns:
        """Lines ``start`` to ``stop``."""
        return Columns(
            self.names,
            {name: values[start:stop] for name, values in self.columns.items()},
            self.steps[start:stop],
            None if self.times is None else self.times[start:stop],
        )


def decode_array(texts: list[str]) -> list[dict[str, Any]] | None:
    """The lines, each one flat JSON object, decoded as one array; None unless each is.

    Every record returned is one line's, in order (see ``decode_objects``); a line that
    is not a flat object (or holds two) makes it None, and no single line's trouble is
    guessed at: the caller splits.
    """
    return decode_objects(_SEPARATOR.join(texts), len(texts))


def decode_objects(joined: str, count: int) -> list[dict[str, Any]] | None:
    """``count`` lines joined by ``",\n"``, each one flat JSON object, decoded as one
    array; None unless the array holds exactly one object a line.

    Decoded together, lines could pair up differently than alone: a string, or a list,
    opened on one line and closed on the next. The raw newline between lines is invalid
    inside a JSON string, and with no ``[`` and one ``{`` a line (its first character)
    there is no container to span it; then one value a line is one value of each line.
    A ``{`` or ``[`` inside a string refuses the lines too, which is only slower.
    """
    if (
        joined[:1] != "{"
        or joined.count("{") != count
        or joined.count(",\n{") != count - 1
        or "[" in joined
    ):
        return None  # a line that does not start an object, or a container in one
    decoded: Any = None
    if fast_loads is not None:
        # NaN and Infinity, which orjson refuses, go on to the stdlib, which reads them.
        with suppress(ValueError):
            decoded = fast_loads("[" + joined + "]")
    if decoded is None:
        try:
            decoded = json.loads("[" + joined + "]")
        except (ValueError, RecursionError):
            return None
    if type(decoded) is not list or len(decoded) != count:
        return None  # a line that held two values, or none
    # Each value starts at its line's "{" (the only one): every record is an object.
    return decoded


def parse_runs(texts: list[str], min_lines: int = 1) -> list[Run] | None:
    """The lines, decoded at once, as runs of consecutive lines of one schema.

    Each run is ``(start, stop, columns)``; ``columns`` is None for a run of fewer
    than ``min_lines`` lines or one ``parse_block`` would refuse (those go line by
    line). None when the lines do not decode as one JSON array (a garbled line).
    """
    records = decode_array(texts)
    if records is None:
        return None
    shapes = list(map(tuple, records))
    first = shapes[0]
    if shapes.count(first) == len(shapes):
        runs = [(0, len(shapes), first)]
    else:
        runs = []
        start = 0
        for shape, group in groupby(shapes):
            stop = start + sum(1 for _ in group)
            runs.append((start, stop, shape))
            start = stop
    return [
        (
            start,
            stop,
            None if stop - start < min_lines else columns_of(records[start:stop], shape),
        )
        for start, stop, shape in runs
    ]


def parse_block(texts: list[str]) -> Columns | None:
    """The lines as columns, or None unless each is a JSON object with the same fields in
    the same order, a whole-number step, one kind of timestamp and numeric metrics."""
    if not texts:
        return None
    runs = parse_runs(texts)
    if runs is None or len(runs) != 1:
        return None
    return runs[0][2]


def columns_of(records: list[dict[str, Any]], keys: tuple[str, ...]) -> Columns | None:
    """Records that all have these fields, in this order, as columns; None unless each
    has a whole-number step, one kind of timestamp and numeric metrics."""
    schema = SCHEMAS.get(keys) or schema_of(keys)
    if not schema.step_keys:
        return None
    names = tuple(name for name in schema.names if name is not None)
    if not names or PROGRESS in names or len(set(names)) != len(names):
        return None
    # A column a key: the records share their keys (the caller grouped them by them).
    by_key = {key: list(map(itemgetter(key), records)) for key in keys}
    steps = _steps(by_key[schema.step_keys[0]])
    if steps is None:
        return None
    times: list[float] | None = None
    if schema.time_keys:
        times = _times(by_key[schema.time_keys[0]])
        if times is None:
            return None
    columns: dict[str, list[float]] = {}
    for key, name in zip(keys, schema.names, strict=True):
        if name is None:
            continue
        # Strings, booleans and nulls: line by line decides.
        column = float_column(by_key[key], _NUMBER)
        if column is None:
            return None
        columns[name] = column
    return Columns(names, columns, steps, times)


def float_column(values: list[Any], kinds: frozenset[type]) -> list[float] | None:
    """A field's values as the floats line by line reads them (``float(value)``), or None
    when one is of a type not in ``kinds`` or does not read as a number (an integer beyond
    a double, a string that is no number: line by line skips that value)."""
    found = set(map(type, values))
    if found == _FLOAT:
        return values
    if not found <= kinds:
        return None
    try:
        return list(map(float, values))
    except (ValueError, OverflowError):
        return None


def _steps(values: list[Any]) -> list[int] | None:
    """The step field of every line, when each is an int the line-by-line parser takes as is."""
    if set(map(type, values)) != _INT:
        return None
    if min(values) <= -MAX_STEP or max(values) >= MAX_STEP:
        return None
    return values


def _times(values: list[Any]) -> list[float] | None:
    """The time field of every line, when each is a finite float in epoch seconds."""
    if set(map(type, values)) != _FLOAT:
        return None
    if not isfinite(sum(values)):
        return None  # NaN or an infinity: line by line tries the next time field
    if min(values) <= -EPOCH_MS or max(values) >= EPOCH_MS:
        return None  # milliseconds and the like: line by line converts them
    return values
