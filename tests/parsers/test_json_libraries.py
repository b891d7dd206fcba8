"""Every line gives the same samples whether orjson or the stdlib decodes it.

orjson (the optional ``fast`` extra) is used when installed; where it refuses a
line (bare NaN/Infinity, numbers beyond a double, deep nesting, lone surrogates)
the stdlib decides, and where both decode a line their samples must agree.
"""

from __future__ import annotations

import json
import math

import pytest

from sentinel.model.records import Sample
from sentinel.parsing import Garbled, LineParser, as_step, fields, jsonl
from sentinel.parsing.hf_trainer import parse_hf_dict

LINES = [
    '{"step": 1, "loss": 2.5, "grad_norm": 0.9, "lr": 3e-4, "time": 1714564801.5}',
    '{"step": 2, "loss": NaN, "grad_norm": Infinity, "lr": -Infinity}',
    '{"loss": "nan", "grad_norm": "inf", "lr": "-Infinity", "x": "2.5"}',
    '{"step": 9223372036854775807, "loss": 1.0}',
    '{"step": 9223372036854775808, "loss": 1.0}',
    '{"step": 18446744073709551616, "loss": 1.0}',
    '{"step": -9223372036854775809, "loss": 1.0}',
    '{"step": 123456789012345678901234567890, "loss": 1}',
    '{"loss": 123456789012345678901234567890, "lr": -98765432109876543210987}',
    '{"loss": 1' + "0" * 400 + "}",
    '{"loss": 1e999, "grad_norm": -1e999, "lr": 1e-999}',
    '{"timestamp": 1714564801500, "loss": 2}',
    '{"ts": "2024-05-01T12:00:01Z", "step": 5.0, "loss": 2}',
    '{"loss": 1.0, "loss": 2.0, "lr": 0.1}',
    '{"loss": 1.0e5, "lr": 3E-4, "grad_norm": -0.0}',
    '{"loss": true, "x": null, "y": [1, NaN], "z": {"loss": 1}}',
    '{"Loss": 2, "train/loss": 3, "tok/s": 15000}',
    '{"loss": "\\ud800", "lr": 0.1}',
    '{"note": "\\u00e9t\\u00e9", "loss": 0.5}',
    '{"loss": 1.5}   ',
    '{"loss": 1.5}\x0c',
    '{"loss": 1.5}\r',
    '{"loss": 1.5} x',
    '{"loss": 1.5,}',
    '{"loss": 1.5',
    '{"a": ' * 1500 + "1" + "}" * 1500,
    "\ufeff" + '{"loss": 1.0}',
    "{'loss': '4.704', 'grad_norm': '1.061', 'learning_rate': '0.0005', 'epoch': '0.01562'}",
    "{'loss': 2.3141, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.02}",
    "{'loss': 1e999, 'grad_norm': 1" + "0" * 400 + "}",
    "{'step': 12345678901234567890123, 'loss': 1.0}",
    "{'loss': 1.0, 'nested': {'a': 1}}",
]


def _outcome(line: str) -> object:
    """What sentinel makes of a line: LineParser's samples and counts, and each parser's."""

    def comparable(samples: list[Sample] | None) -> object:
        if samples is None:
            return None
        return [(s.name, repr(s.value), s.step, s.time) for s in samples]

    parser = LineParser()
    outcome: list[object] = [comparable(parser.parse(line)), parser.stats]
    for parse in (jsonl.parse_jsonl, parse_hf_dict):
        try:
            outcome.append(comparable(parse(line)))
        except Garbled:
            outcome.append("garbled")
    return outcome


@pytest.mark.parametrize("line", LINES, ids=[f"line{index}" for index in range(len(LINES))])
def test_orjson_and_stdlib_give_the_same_samples(
    line: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("orjson")
    monkeypatch.setattr(fields, "loads", json.loads)
    monkeypatch.setattr(fields, "decode_prefix", fields._STDLIB_DECODER.raw_decode)
    with_stdlib = _outcome(line)
    monkeypatch.setattr(fields, "loads", fields._orjson_loads)
    monkeypatch.setattr(fields, "decode_prefix", fields._orjson_decode_prefix)
    assert _outcome(line) == with_stdlib


@pytest.mark.usefixtures("json_library")
def test_nan_and_infinity_literals_are_read_by_either_library() -> None:
    samples = LineParser().parse('{"step": 3, "loss": NaN, "grad_norm": -Infinity}')
    assert [(s.name, s.step) for s in samples] == [("loss", 3), ("grad_norm", 3)]
    assert math.isnan(samples[0].value)
    assert samples[1].value == -math.inf


@pytest.mark.parametrize(
    ("value", "step"),
    [
        pytest.param(120, 120, id="int"),
        pytest.param("120", 120, id="string"),
        pytest.param(120.0, 120, id="integral-float"),
        pytest.param(-3, -3, id="negative"),
        pytest.param(2**63 - 1, 2**63 - 1, id="largest"),
        pytest.param(2**63, None, id="beyond-63-bits"),
        pytest.param(-(2**63), None, id="beyond-63-bits-negative"),
        pytest.param(float(2**64), None, id="beyond-63-bits-float"),
        pytest.param(str(10**30), None, id="beyond-63-bits-string"),
        pytest.param(1.5, None, id="fraction"),
        pytest.param(math.inf, None, id="inf"),
        pytest.param(True, None, id="bool"),
        pytest.param("601/2161", 601, id="done-of-all-ms-swift"),
        pytest.param("a/2161", None, id="no-number-before-the-slash"),
    ],
)
def test_as_step(value: object, step: int | None) -> None:
    assert as_step(value) == step


def test_ms_swifts_step_of_steps_is_the_step() -> None:
    line = '{"loss": 1.2, "grad_norm": 0.8, "global_step/max_steps": "601/2161", "epoch": 0.28}'
    samples = LineParser().parse(line)
    assert {sample.step for sample in samples} == {601}
    assert [sample.name for sample in samples] == ["loss", "grad_norm", "epoch"]
