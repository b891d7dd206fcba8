"""User regexes: named groups become samples; bad patterns fail at construction."""

from __future__ import annotations

import pytest

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing.regex import compile_regexes, make_regex_parser


@pytest.mark.parametrize(
    ("patterns", "line", "expected"),
    [
        pytest.param(
            [r"it (?P<step>\d+) L=(?P<train_loss>\S+) G=(?P<gnorm>\S+)"],
            "it 12 L=2.5 G=nan",
            [Sample("loss", 2.5, 12), Sample("grad_norm", float("nan"), 12)],
            id="step-and-normalised-metrics",
        ),
        pytest.param(
            [r"^(?P<time>\S+) L=(?P<loss>\S+)"],
            "2024-05-01T12:00:01Z L=1.5",
            [Sample("loss", 1.5, None, 1714564801.0)],
            id="iso-time-group",
        ),
        pytest.param([r"L=(?P<loss>\S+)"], "L=oops", [], id="unreadable-value-recognised-empty"),
        pytest.param(
            [r"batch (?P<step>\d+) done"],
            "batch 7 done",
            [Sample(PROGRESS, 7.0, 7)],
            id="step-only-is-progress",
        ),
        pytest.param(
            [r"L=(?P<loss>\S+)(?: A=(?P<acc>\S+))?"],
            "L=1.0",
            [Sample("loss", 1.0)],
            id="optional-group-absent",
        ),
        pytest.param(
            [r"X=(?P<x>\S+)", r"L=(?P<loss>\S+)"],
            "L=1.0",
            [Sample("loss", 1.0)],
            id="first-matching-pattern",
        ),
        pytest.param([r"L=(?P<loss>\S+)"], "nothing here", None, id="no-match"),
    ],
)
def test_user_regex(patterns: list[str], line: str, expected: list[Sample] | None) -> None:
    assert repr(make_regex_parser(patterns)(line)) == repr(expected)


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        pytest.param([r"loss=(\S+"], r"invalid regex 'loss=\(\\\\S\+'", id="syntax-error"),
        pytest.param([r"loss=(\S+)"], r"regex 'loss=\(\\\\S\+\)' has no named group", id="unnamed"),
        pytest.param([r"(?P<loss>\S+)", "ok"], "regex 'ok' has no named group", id="second-bad"),
        pytest.param("L=(?P<loss>x)", "must be a list", id="a-string-not-a-list"),
    ],
)
def test_bad_user_regex_is_named(patterns: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compile_regexes(patterns)
