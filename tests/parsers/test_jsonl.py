"""JSON lines: numeric fields become samples, step and time come from their fields."""

from __future__ import annotations

import math

import pytest

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing import Garbled
from sentinel.parsing.jsonl import parse_jsonl, samples_from_mapping

# Each test runs with the stdlib and with orjson (tests/parsers/conftest.py).
pytestmark = pytest.mark.usefixtures("json_library")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            '{"step": 1, "loss": 2.3, "grad_norm": 0.9, "lr": 0.0003, "tokens_per_sec": 15000}',
            [
                Sample("loss", 2.3, 1),
                Sample("grad_norm", 0.9, 1),
                Sample("lr", 0.0003, 1),
                Sample("tokens_per_sec", 15000.0, 1),
            ],
            id="plain-metrics-line",
        ),
        pytest.param(
            '{"global_step": 7, "train/loss": 1.5}', [Sample("loss", 1.5, 7)], id="global-step"
        ),
        pytest.param('{"iter": 3, "loss": 1.0}', [Sample("loss", 1.0, 3)], id="iter-is-step"),
        pytest.param(
            '{"iteration": "12", "loss": 1.0}', [Sample("loss", 1.0, 12)], id="string-step"
        ),
        pytest.param('{"step": 4.0, "loss": 1.0}', [Sample("loss", 1.0, 4)], id="float-step"),
        pytest.param(
            '{"iter": 9, "step": 5, "loss": 1.0}', [Sample("loss", 1.0, 5)], id="step-key-wins"
        ),
        pytest.param('{"Step": 2, "Loss": 1.0}', [Sample("loss", 1.0, 2)], id="key-case"),
        pytest.param('{"loss": "2.5"}', [Sample("loss", 2.5)], id="numeric-string"),
        pytest.param(
            '{"loss": "nan", "grad_norm": "inf"}',
            [Sample("loss", math.nan), Sample("grad_norm", math.inf)],
            id="nan-inf-strings",
        ),
        pytest.param(
            '{"loss": NaN, "grad_norm": -Infinity}',
            [Sample("loss", math.nan), Sample("grad_norm", -math.inf)],
            id="bare-nan-infinity",
        ),
        pytest.param(
            '{"loss": 1.0, "ok": true, "cfg": {"lr": 1}, "tag": "run-a", "x": null, "l": [1]}',
            [Sample("loss", 1.0)],
            id="ignores-bool-nested-text-null-list",
        ),
        pytest.param(
            '{"step": 1, "time": 1714564801.5, "loss": 1.0}',
            [Sample("loss", 1.0, 1, 1714564801.5)],
            id="epoch-seconds-time",
        ),
        pytest.param(
            '{"timestamp": 1714564801500, "loss": 1.0}',
            [Sample("loss", 1.0, None, 1714564801.5)],
            id="epoch-milliseconds-time",
        ),
        pytest.param(
            '{"ts": "2024-05-01T12:00:01Z", "loss": 1.0}',
            [Sample("loss", 1.0, None, 1714564801.0)],
            id="iso-time-utc",
        ),
        pytest.param(
            '{"wall_time": "2024-05-01T14:00:01+02:00", "loss": 1.0}',
            [Sample("loss", 1.0, None, 1714564801.0)],
            id="iso-time-offset",
        ),
        pytest.param(
            '{"time": "yesterday", "loss": 1.0}', [Sample("loss", 1.0)], id="unreadable-time"
        ),
        pytest.param('{"step": 30}', [Sample(PROGRESS, 30.0, 30)], id="step-only-is-progress"),
        pytest.param("{}", [], id="empty-object"),
        pytest.param('{"loss": 1e999999}', [Sample("loss", math.inf)], id="overflow-is-inf"),
        pytest.param('{"n": 1' + "0" * 400 + "}", [], id="huge-int-ignored"),
        pytest.param('  {"loss": 1.0}  \r', [Sample("loss", 1.0)], id="spaces-and-cr"),
        pytest.param("[1, 2, 3]", None, id="array-not-mine"),
        pytest.param("42", None, id="scalar-not-mine"),
        pytest.param("loss=2.3", None, id="text-not-mine"),
        pytest.param("{rank0}: loss=2.3", None, id="brace-prose-not-mine"),
        pytest.param("{" * 1000, None, id="brace-run-not-mine"),
    ],
)
def test_parse_jsonl(line: str, expected: list[Sample] | None) -> None:
    assert _comparable(parse_jsonl(line)) == _comparable(expected)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param('{"step": 5, "loss": 2.', id="truncated"),
        pytest.param('{"step": 5, "loss"', id="cut-in-key"),
        pytest.param("{", id="lone-brace"),
        pytest.param('{"loss": 1.0} {"loss": 2.0}', id="two-objects"),
        pytest.param('{"loss": 1.0,}', id="trailing-comma"),
        pytest.param('{"a": ' * 100_000, id="too-deep"),
    ],
)
def test_broken_json_object_is_garbled(line: str) -> None:
    with pytest.raises(Garbled):
        parse_jsonl(line)


def test_hf_dict_line_is_handed_to_hf_parser() -> None:
    """A Python dict line (the HF Trainer's), which JSON cannot read, still gives samples."""
    samples = parse_jsonl("{'loss': nan, 'grad_norm': 0.5, 'epoch': 0.1}")
    assert samples is not None
    assert [(sample.name, sample.step, sample.time) for sample in samples] == [
        ("loss", None, None),
        ("grad_norm", None, None),
        ("epoch", None, None),
    ]
    assert math.isnan(samples[0].value)
    assert [sample.value for sample in samples[1:]] == [0.5, 0.1]


def test_mapping_is_reused_for_new_key_sets() -> None:
    first = samples_from_mapping({"step": 1, "loss": 1.0})
    second = samples_from_mapping({"loss": 2.0, "step": 2, "lr": 0.1})
    assert first == [Sample("loss", 1.0, 1)]
    assert second == [Sample("loss", 2.0, 2), Sample("lr", 0.1, 2)]


def _comparable(samples: list[Sample] | None) -> list[tuple[object, ...]] | None:
    """Samples as tuples in which NaN equals NaN."""
    if samples is None:
        return None
    return [(s.name, "nan" if math.isnan(s.value) else s.value, s.step, s.time) for s in samples]
