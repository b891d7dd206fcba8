"""LineParser: format auto-detection, user regexes first, and the counts of what it read."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.model.records import PROGRESS, Sample, Severity
from sentinel.parsing import PARSERS, LineParser, ParseStats

INF = math.inf

# Each test runs with the stdlib and with orjson (tests/parsers/conftest.py).
pytestmark = pytest.mark.usefixtures("json_library")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param('{"step": 3, "loss": 1.5}', [Sample("loss", 1.5, 3)], id="jsonl"),
        pytest.param("{'loss': nan}", [Sample("loss", float("nan"))], id="hf-v4"),
        pytest.param("{'loss': '1.5'}", [Sample("loss", 1.5)], id="hf-v5"),
        pytest.param("step=3 loss=1.5", [Sample("loss", 1.5, 3)], id="keyvalue"),
        pytest.param(
            " 5%|▌  | 10/200 [00:01<00:19,  9.81it/s]", [Sample(PROGRESS, 10.0, 10)], id="tqdm"
        ),
        pytest.param(
            " 5%|▌  | 10/200 [00:01<00:19,  9.81it/s]\r{'loss': 1.5}",
            [Sample(PROGRESS, 10.0, 10), Sample("loss", 1.5)],
            id="bar-then-dict-after-carriage-return",
        ),
        pytest.param('{"loss": 1.5}\r\n', [Sample("loss", 1.5)], id="crlf-remnant-json"),
        pytest.param("loss=1.5 \r", [Sample("loss", 1.5)], id="crlf-remnant-text"),
        pytest.param("{rank0} loss=1.5", [Sample("loss", 1.5)], id="brace-prose-falls-through"),
        pytest.param("[1, 2]", [], id="json-array-is-text"),
    ],
)
def test_auto_detection(line: str, expected: list[Sample]) -> None:
    assert repr(LineParser().parse(line)) == repr(expected)


@pytest.mark.parametrize(
    ("line", "stats"),
    [
        pytest.param('{"loss": 1.0}', ParseStats(lines=1, parsed=1), id="parsed"),
        pytest.param('{"step": 5, "loss": 2.', ParseStats(lines=1, garbled=1), id="garbled-json"),
        pytest.param("{'loss': 2.3, 'gr", ParseStats(lines=1, garbled=1), id="garbled-hf"),
        pytest.param(
            "Loading checkpoint shards: 100%", ParseStats(lines=1, unparsed=1), id="progress-prose"
        ),
        pytest.param(
            "WARNING: loss scale reduced to 1024",
            ParseStats(lines=1, unparsed=1),
            id="warning-prose",
        ),
        pytest.param("", ParseStats(lines=1, unparsed=1), id="empty-line"),
        pytest.param('{"tag": "a"}', ParseStats(lines=1, unparsed=1), id="json-without-metric"),
        pytest.param(
            " 5%| | 1/9 [00:01<00:08]\r{'loss': 2.3, 'gr",
            ParseStats(lines=1, garbled=1),
            id="garbled-segment-marks-line",
        ),
    ],
)
def test_stats(line: str, stats: ParseStats) -> None:
    parser = LineParser()
    parser.parse(line)
    assert parser.stats == stats


def test_garbled_line_gives_nothing_and_parsing_goes_on() -> None:
    parser = LineParser()
    assert parser.parse('{"step": 5, "loss": 2.') == []
    assert parser.parse('{"step": 6, "loss": 2.0}') == [Sample("loss", 2.0, 6)]
    assert parser.stats == ParseStats(lines=2, parsed=1, garbled=1)


def test_user_regex_is_tried_first() -> None:
    parser = LineParser(regexes=[r"step=(?P<step>\d+) loss=(?P<my_loss>\S+)"])
    assert parser.parse("step=3 loss=1.5") == [Sample("my_loss", 1.5, 3)]
    assert parser.parse('{"loss": 1.0}') == [Sample("loss", 1.0)]


def test_invalid_user_regex_is_named() -> None:
    with pytest.raises(ValueError, match=r"invalid regex 'loss=\(\?P<loss>'"):
        LineParser(regexes=["loss=(?P<loss>"])


@pytest.mark.parametrize(
    ("enabled", "line", "expected"),
    [
        pytest.param(["jsonl"], "loss=1.5", [], id="keyvalue-off"),
        pytest.param(["keyvalue"], '{"loss": 1.5}', [], id="jsonl-off"),
        pytest.param(["hf_trainer"], "{'loss': 1.5}", [Sample("loss", 1.5)], id="hf-alone"),
        pytest.param([], "loss=1.5", [], id="none"),
    ],
)
def test_enabled(enabled: list[str], line: str, expected: list[Sample]) -> None:
    assert LineParser(enabled=enabled).parse(line) == expected


def test_unknown_parser_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown parser\(s\) 'yaml'"):
        LineParser(enabled=["jsonl", "yaml"])


def test_a_parser_bug_is_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(text: str) -> list[Sample] | None:
        raise KeyError(text)

    monkeypatch.setitem(PARSERS, "keyvalue", broken)
    parser = LineParser()
    assert parser.parse("loss=1.5") == []
    assert parser.stats == ParseStats(lines=1, garbled=1, errors=1)


FRAGMENTS = [
    "{", "}", "'", '"', "[", "]", ":", "=", "|", " ", ",", "\r", "loss", "step", "nan",
    "-inf", "1", "2.5", "1e-5", "/", "%", "it/s", "00:01<00:19", "tensor(", ")", "eval ",
    "{'loss': ", '{"step": ', "█", "\t", "12:00:01", "2024-05-01", "e", ".", "_",
]  # fmt: skip


@pytest.mark.slow
def test_random_lines_never_raise() -> None:
    rng = random.Random(20240501)
    parser = LineParser()
    for _ in range(5000):
        line = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 12)))
        for sample in parser.parse(line):
            assert isinstance(sample.value, float)
            assert sample.step is None or isinstance(sample.step, int)
    stats = parser.stats
    assert stats.errors == 0
    assert stats.lines == stats.parsed + stats.garbled + stats.unparsed == 5000


VALID_LINES = [
    '{"step": 1, "loss": 2.3, "grad_norm": 0.9, "lr": 0.0003, "tokens_per_sec": 15000}',
    "{'loss': 2.3141, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.02}",
    "{'loss': '2.3141', 'grad_norm': 'nan', 'learning_rate': '4.9e-05', 'epoch': '0.02'}",
    "[2024-05-01 12:00:01] step=5 loss=nan grad_norm=inf",
    "iter 50/1000 loss: 2.1 grad_norm: 0.5",
    "  5%|▌         | 10/200 [00:01<00:19,  9.81it/s]",
]


@pytest.mark.slow
def test_cut_and_spliced_lines_never_raise() -> None:
    rng = random.Random(7)
    parser = LineParser()
    for _ in range(5000):
        first, second = rng.choice(VALID_LINES), rng.choice(VALID_LINES)
        cut = rng.randint(0, len(first))
        line = first[:cut] + second[rng.randint(0, len(second)) :]
        parser.parse(line)
    stats = parser.stats
    assert stats.errors == 0
    assert stats.parsed > 1000
    assert stats.garbled > 100


#: The TF Object Detection API's training log (``model_lib_v2.py``), as a real run printed
#: it: the metrics dict ``pprint``ed past 80 columns, one entry a line.
TFOD_NAN = [
    "I0409 23:03:12.869635 140410452137792 model_lib_v2.py:708] {'Loss/classification_loss': nan,",
    " 'Loss/localization_loss': nan,",
    " 'Loss/regularization_loss': nan,",
    " 'Loss/total_loss': nan,",
    " 'learning_rate': 0.07922263}",
]


def test_a_dict_printed_over_several_lines_is_read_as_one_at_its_closing_line() -> None:
    parser = LineParser()
    read = [parser.parse(line) for line in TFOD_NAN]
    assert read[:-1] == [[]] * 4
    assert {s.name for s in read[-1]} == {
        "loss/classification_loss",
        "loss/localization_loss",
        "loss/regularization_loss",
        "loss/total_loss",
        "lr",
    }
    assert all(math.isnan(s.value) for s in read[-1] if s.name != "lr")
    assert parser.stats.garbled == 0


def test_a_printed_dict_that_does_not_close_is_read_as_far_as_it_went() -> None:
    """A dict's first line at the start of a line (no logging prefix, as ``{`` lines take a
    fast path), its closing line never written: what it held is read at the next line."""
    parser = LineParser()
    assert parser.parse("{'loss': 2.0,") == []
    assert parser.parse(" 'grad_norm': inf,") == []
    read = parser.parse("step 7 loss 1.5")
    assert [(s.name, s.value) for s in read] == [("loss", 2.0), ("grad_norm", INF), ("loss", 1.5)]


def test_a_printed_dict_with_a_nan_stops_a_replay_at_the_step_line_before_it(
    tmp_path: Path,
) -> None:
    """The API's ``Step N per-step time`` line is progress: the dict after it is at N."""
    step = (
        "I0409 23:03:10.113085 140410452137792 model_lib_v2.py:705] Step 4100 per-step time 0.436s"
    )
    assert [(s.name, s.step) for s in LineParser().parse(step)] == [(PROGRESS, 4100)]
    log = tmp_path / "train.log"
    log.write_text("\n".join([step, *TFOD_NAN]) + "\n", encoding="utf-8")
    result = replay([log], load_settings(None, environ={}))
    nan = [a for a in result.alerts if a.rule == "nan_inf"]
    assert [(a.severity, a.step) for a in nan][:1] == [(Severity.CRITICAL, 4100)]
