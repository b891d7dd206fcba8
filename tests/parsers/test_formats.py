"""Frameworks' own console lines and header-row CSVs: read with no configuration.

The fixtures (``tests/fixtures/frameworks``, ``make_framework_lines.py``) print each
format with the expression its framework's source uses; the NaN must be read at the
step its own line names.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sentinel.parsers import LineParser
from sentinel.records import Sample

FIXTURES = Path(__file__).parent.parent / "fixtures" / "frameworks"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


def _samples(name: str) -> list[Sample]:
    parser = LineParser()
    found: list[Sample] = []
    for line in (FIXTURES / name).read_bytes().decode("utf-8").split("\n"):
        found += parser.parse(line)
    return found


@pytest.mark.parametrize("name", [name for name in EXPECTED if name != "deepspeed.log"])
def test_nan_is_read_at_the_step_its_line_names(name: str) -> None:
    truth = EXPECTED[name]
    first = next(s for s in _samples(name) if s.name == truth["metric"] and math.isnan(s.value))
    assert first.step == truth["first_nan_step"]


def test_megatron_counters_are_metrics() -> None:
    by_name = {(s.name, s.step): s.value for s in _samples("megatron.log")}
    assert by_name[("nan_iterations", 500)] == 1.0
    assert by_name[("skipped_iterations", 500)] == 0.0
    assert by_name[("loss_scale", 100)] == 16384.0
    assert by_name[("lr", 100)] == pytest.approx(1.342e-4)


def test_deepspeed_loss_scale_collapse_is_a_loss_scale_series() -> None:
    found = _samples("deepspeed.log")
    scales = [s.value for s in found if s.name == "loss_scale"]
    assert scales[:3] == [65536.0, 32768.0, 16384.0]
    assert scales[-1] == 1.0
    assert [s.value for s in found if s.name == "loss_scale_at_minimum"] == [1.0]
    assert [(s.name, s.step) for s in found if s.name == "skipped_steps"] == [
        ("skipped_steps", 10),
        ("skipped_steps", 20),
    ]


def test_fairseq_overflow_sets_the_loss_scale() -> None:
    scales = [s.value for s in _samples("fairseq.log") if s.name == "loss_scale"]
    assert scales[-1] == 0.0625
    assert "to" not in {s.name for s in _samples("fairseq.log")}


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        pytest.param(
            ["epoch,loss", "0,0.5"], [[], [Sample("loss", 0.5, 0)]], id="csv-epoch-is-the-step"
        ),
        pytest.param(
            ["step, loss, lr", "  3,  nan,  0.1"],
            [[], [Sample("loss", math.nan, 3), Sample("lr", 0.1, 3)]],
            id="csv-padded-step-column",
        ),
        pytest.param(["name,city", "1,2"], [[], []], id="csv-without-a-metric-column-is-not-read"),
        pytest.param(
            ["epoch,loss", "0,0.5,7"],
            [[], []],
            id="csv-row-of-another-width-is-not-read",
        ),
        pytest.param(
            ["Iter(train) [  240/80000]  lr: 1.0000e-02  loss: nan"],
            [[Sample("lr", 0.01, 240), Sample("loss", math.nan, 240)]],
            id="mmengine-by-iteration",
        ),
        pytest.param(
            ["Epoch(val) [1][20/20]  accuracy/top1: 71.0000  loss: 0.5"],
            [[Sample("eval_accuracy/top1", 71.0), Sample("eval_loss", 0.5)]],
            id="mmengine-validation-is-eval",
        ),
    ],
)
def test_lines(lines: list[str], expected: list[list[Sample]]) -> None:
    parser = LineParser()
    assert repr([parser.parse(line) for line in lines]) == repr(expected)
