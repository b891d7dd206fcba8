"""JSON lines read many at once (``parsers.columns``) give the samples line by line gives.

A run is turned into columns only when every line would give, line by line, one
sample per metric with the same step and time fields: each case here is a line a
block must refuse, or a run it must read, checked against ``LineParser`` itself.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from sentinel.model.records import Sample
from sentinel.parsing import LineParser
from sentinel.parsing.columns import Columns, parse_block, parse_runs

T0 = 1_700_000_000.0


def _lines(count: int, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"step": step, "loss": 2.0 + step / 100, "lr": 1e-4, "time": T0 + step, **extra}
        for step in range(1, count + 1)
    ]


def _texts(records: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(record) for record in records]


def _samples_of(columns: Columns) -> list[list[Sample]]:
    """The samples each line of the columns stands for."""
    return [
        [
            Sample(
                name,
                columns.columns[name][index],
                columns.steps[index],
                None if columns.times is None else columns.times[index],
            )
            for name in columns.names
        ]
        for index in range(len(columns))
    ]


def _line_by_line(texts: list[str]) -> list[list[Sample]]:
    parser = LineParser()
    return [parser.parse(text) for text in texts]


def _same(found: list[list[Sample]], expected: list[list[Sample]]) -> bool:
    """Equal, NaN equal to NaN."""
    return [[(s.name, repr(s.value), s.step, s.time) for s in line] for line in found] == [
        [(s.name, repr(s.value), s.step, s.time) for s in line] for line in expected
    ]


@pytest.mark.parametrize(
    "records",
    [
        pytest.param(_lines(40), id="plain"),
        pytest.param(_lines(40, tokens_per_sec=15000), id="an-integer-metric"),
        pytest.param(
            [{"global_step": r["step"], "train/loss": r["loss"]} for r in _lines(20)],
            id="aliases-and-no-time",
        ),
        pytest.param(_lines(20, grad_norm=math.nan), id="nan-values"),
        pytest.param(_lines(20, grad_norm=math.inf), id="inf-values"),
        pytest.param(
            [{"iteration": r["step"], "step": r["step"] * 2, "loss": 1.0} for r in _lines(20)],
            id="the-preferred-step-key-wins",
        ),
    ],
)
def test_a_run_reads_as_line_by_line_does(records: list[dict[str, Any]]) -> None:
    texts = _texts(records)
    columns = parse_block(texts)
    assert columns is not None
    assert _same(_samples_of(columns), _line_by_line(texts))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"loss": "2.5"}, "a string value"),
        ({"loss": None}, "a null"),
        ({"loss": True}, "a boolean"),
        ({"loss": {"nested": 1}}, "an object"),
        ({"step": 2.0}, "a float step"),
        ({"step": "7"}, "a string step"),
        ({"step": 1 << 63}, "a step beyond 2**63"),
        ({"time": T0 * 1000}, "milliseconds"),
        ({"time": math.nan}, "a NaN time"),
        ({"time": 1_700_000_000}, "an integer time"),
        ({"tokens": 10**400}, "an integer beyond a double"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_line_line_by_line_reads_differently_refuses_the_block(
    change: dict[str, Any], why: str
) -> None:
    records = _lines(20)
    records[7] = {**records[7], **change}
    assert parse_block(_texts(records)) is None, why


@pytest.mark.parametrize(
    "records",
    [
        pytest.param([{"step": 1, "time": T0}] * 20, id="no-metric"),
        pytest.param([{"loss": 1.0, "time": T0}] * 20, id="no-step"),
        pytest.param([{"step": 1, "loss": 1.0, "train/loss": 2.0}] * 20, id="one-name-twice"),
        pytest.param([{"iter": 1, "train/step": 3.0}] * 20, id="a-metric-named-step"),
    ],
)
def test_schemas_a_block_cannot_stand_for_are_refused(records: list[dict[str, Any]]) -> None:
    assert parse_block(_texts(records)) is None


def test_a_garbled_or_blank_line_fails_the_whole_decode() -> None:
    texts = _texts(_lines(20))
    assert parse_runs([*texts[:5], texts[5][:-4], *texts[6:]]) is None
    assert parse_runs([*texts[:5], "", *texts[5:]]) is None
    assert parse_runs([*texts[:5], texts[5] + texts[6], *texts[7:]]) is None


def test_lines_split_into_runs_of_one_schema() -> None:
    records = _lines(30)
    records[10] = {"step": 10, "eval_loss": 3.0, "time": T0 + 10}
    records[20] = {"lr": 1e-4, "step": 20, "loss": 1.0, "time": T0 + 20}  # another order
    texts = _texts(records)
    runs = parse_runs(texts, min_lines=5)
    assert runs is not None
    assert [(start, stop) for start, stop, _ in runs] == [
        (0, 10),
        (10, 11),
        (11, 20),
        (20, 21),
        (21, 30),
    ]
    assert [columns is not None for _, _, columns in runs] == [True, False, True, False, True]
    for start, stop, columns in runs:
        if columns is not None:
            assert _same(_samples_of(columns), _line_by_line(texts[start:stop]))


@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(["[1, 2]", "3"], id="an-array-and-a-number"),
        pytest.param(['{"step": 5, "loss": 2.0, "lrs": [0.1, 0.2]}'], id="a-list-value"),
        pytest.param(['{"step": 5, "loss": 2.0, "cfg": {"a": 1}}'], id="a-nested-object"),
        pytest.param(['{"step": 5, "loss": 2.0, "tag": "{x}"}'], id="a-brace-in-a-string"),
        # Garbled alone, these two would pair up into two records in one array: a string
        # (or a list) opened on one line and closed on the next, which holds two values.
        pytest.param(['{"step": 5, "tag": "', '{"}, {"step": 6, "loss": 1.5}'], id="string-span"),
        pytest.param(
            ['{"step": 5, "loss": 2.5, "n": [{"x": 1}', '{"y": 2}]}, {"step": 6, "loss": 1.5}'],
            id="list-span",
        ),
    ],
)
def test_lines_that_are_not_flat_objects_refuse_the_whole_decode(odd: list[str]) -> None:
    """Decoded together, lines that are not one flat object each could be read as other
    lines than they are: the caller is told to split (and, in the end, goes line by line)."""
    texts = [*_texts(_lines(10)), *odd, *_texts(_lines(10))]
    assert parse_runs(texts, min_lines=5) is None
    assert parse_runs(_texts(_lines(10)) + _texts(_lines(10)), min_lines=5) is not None
