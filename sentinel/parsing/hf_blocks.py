"""Many lines of HF Trainer output at once: replay's fast path for a Trainer's console log.

Replayed (a ``\\r`` ends a line, as on a terminal), an HF Trainer's output is three
kinds of line: tqdm's training bar ``  2%|▎    | 5/250 [00:01<00:49,  4.99it/s]``,
redrawn at every step; the blank-out tqdm writes before a print; and the printed
log dict ``{'loss': '2.31', 'grad_norm': '1.02', 'learning_rate': '5e-05', 'epoch':
'0.02'}``. ``read_hf`` reads a stretch of them in a few C-level passes: the bars
with one regex over them all, the dicts as one JSON array, each run of one schema
as columns. It says None whenever a line is anything else, or is one of these in a
form the line-by-line parsers (``tqdm``, ``hf_trainer``) might read otherwise; the
caller then goes line by line, which is always right. So every check here is a
reason to refuse, never to guess.

The lines carry no step: the engine gives each dict the step the bars before it
(or ``logging_steps``) imply, as it does line by line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any

from sentinel.model.records import PROGRESS
from sentinel.parsing.columns import decode_objects, float_column
from sentinel.parsing.fields import SCHEMAS, schema_of
from sentinel.parsing.tqdm import CLOCK

#: What a line of HF output is, in ``HfPiece.kinds``.
BLANK, BAR, DICT = 0, 1, 2

# A training bar exactly as tqdm draws the HF Trainer's: no description, a percentage,
# "count/total", "elapsed<remaining" and a rate with no "key=value" postfix. Each such
# line is one that ``parse_tqdm`` reads as a progress sample at ``count`` and nothing
# else (its own pattern accepts all this; spaces and tabs are the only whitespace here).
# At most 18 digits: the count stays an exact float. "count/total [" as tqdm draws it (one
# space) is also what ``hf_steps`` reads as the training bar where it follows one.
_TRAINING_BAR = re.compile(
    r"^[ \t]*\d{1,3}%\|[^|\n]*\|[ \t]*(\d{1,18})/(\d+) "
    rf"\[{CLOCK}<(?:{CLOCK}|\?)(?:,[ \t]*[^\]=\n]*)?\][ \t]*$",
    re.MULTILINE,
)
_NUMERIC: frozenset[type] = frozenset({str, float})
#: The key of the end-of-training summary, whose ``train_loss`` keeps its own name.
_SUMMARY_KEY = "train_runtime"


@dataclass(slots=True, eq=False)
class HfPiece:
    """Lines ``start`` to ``stop`` of the stretch: bars, blank-outs and the dicts of one
    schema (or no dict: the bars after the last one)."""

    start: int
    stop: int
    #: Per line: ``BLANK``, ``BAR`` or ``DICT``.
    kinds: list[int]
    #: Each bar's count and total, in order.
    bar_steps: list[int]
    bar_totals: list[int]
    #: The dict lines, in order, and how many of the piece's bars come before each.
    dict_texts: list[str]
    dict_bars: list[int]
    #: The dicts' metric names, in field order (empty when there is no dict), and their
    #: values as columns of floats; None when they are not all plain records of one
    #: schema that ``parse_hf_dict`` reads the same way (then: line by line).
    names: tuple[str, ...] | None
    columns: dict[str, list[float]]

    @property
    def blanks(self) -> int:
        return self.kinds.count(BLANK)


def read_hf(texts: list[str]) -> list[HfPiece] | None:
    """The lines cut into pieces that each end with a run of dicts of one schema (the
    last may hold no dict); None unless every line is a blank-out, a training bar as
    tqdm draws it, or a dict of strings and floats, and the dicts decode together."""
    kinds: list[int] = []
    bars: list[str] = []
    dicts: list[str] = []
    dict_lines: list[int] = []
    dict_bars: list[int] = []
    for index, text in enumerate(texts):
        if text[:2] == "{'":
            kinds.append(DICT)
            dicts.append(text)
            dict_lines.append(index)
            dict_bars.append(len(bars))
        elif not text or text.isspace():
            kinds.append(BLANK)  # what LineParser strips to nothing
        else:
            kinds.append(BAR)
            bars.append(text)
    read = _bar_steps(bars)
    records = _records(dicts)
    if read is None or records is None:
        return None
    bar_steps, bar_totals = read
    pieces: list[HfPiece] = []
    start = first_bar = first_dict = 0
    for keys, group in groupby(map(tuple, records)):
        stop_dict = first_dict + sum(1 for _ in group)
        stop = dict_lines[stop_dict - 1] + 1
        kinds_here = kinds[start:stop]
        stop_bar = first_bar + kinds_here.count(BAR)
        run = records[first_dict:stop_dict]
        named = _columns(run, keys)
        pieces.append(
            HfPiece(
                start,
                stop,
                kinds_here,
                bar_steps[first_bar:stop_bar],
                bar_totals[first_bar:stop_bar],
                dicts[first_dict:stop_dict],
                [bars - first_bar for bars in dict_bars[first_dict:stop_dict]],
                None if named is None else named[0],
                {} if named is None else named[1],
            )
        )
        start, first_bar, first_dict = stop, stop_bar, stop_dict
    if start < len(texts):
        pieces.append(
            HfPiece(
                start,
                len(texts),
                kinds[start:],
                bar_steps[first_bar:],
                bar_totals[first_bar:],
                [],
                [],
                (),
                {},
            )
        )
    return pieces


def _bar_steps(bars: list[str]) -> tuple[list[int], list[int]] | None:
    """Each bar's count and total; None unless every one is a training bar as tqdm draws it."""
    if not bars:
        return [], []
    joined = "\n".join(bars)
    if "\r" in joined or joined.count("\n") != len(bars) - 1:
        return None  # a line that the line-by-line parser would split first
    found = _TRAINING_BAR.findall(joined)
    if len(found) != len(bars):
        return None  # each line matches at most once (the pattern is anchored to it)
    return [int(count) for count, _ in found], [int(total) for _, total in found]


def _records(dicts: list[str]) -> list[dict[str, Any]] | None:
    """The dicts decoded as JSON with their quotes swapped, what ``parse_hf_dict`` does to
    each where it holds no double quote or backslash; None otherwise."""
    if not dicts:
        return []
    joined = ",\n".join(dicts)
    if '"' in joined or "\\" in joined or "\r" in joined:
        return None
    return decode_objects(joined.replace("'", '"'), len(dicts))


def _columns(
    records: list[dict[str, Any]], keys: tuple[str, ...]
) -> tuple[tuple[str, ...], dict[str, list[float]]] | None:
    """Dicts that all have these fields, in this order, as names and columns; None unless
    every value is a string or a float that reads as a number, and no field is a step,
    a timestamp or the end-of-training summary's."""
    if _SUMMARY_KEY in keys:
        return None  # its train_loss is renamed: line by line
    schema = SCHEMAS.get(keys) or schema_of(keys)
    if schema.step_keys or schema.time_keys:
        return None  # a step or a clock of its own: line by line
    names = tuple(name for name in schema.names if name is not None)
    if not names or PROGRESS in names or len(set(names)) != len(names):
        return None
    columns: dict[str, list[float]] = {}
    for name, key in zip(names, keys, strict=True):
        # Ints, booleans and nulls: the regexes decide, line by line.
        column = float_column(list(map(itemgetter(key), records)), _NUMERIC)
        if column is None:
            return None
        columns[name] = column
    return names, columns


__all__ = ["BAR", "BLANK", "DICT", "HfPiece", "read_hf"]
