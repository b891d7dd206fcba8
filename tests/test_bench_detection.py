"""bench/detection.py: its tables are the replay's own numbers, on two cases."""

from __future__ import annotations

from pathlib import Path

from bench import detection
from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.model.records import Severity

ROOT = Path(__file__).resolve().parents[1]
FAILED = "hf/nan/trainer_state.json"
HEALTHY = "corpus/healthy/bert-mood-per-epoch"


def cases() -> dict[str, detection.Case]:
    return {case.name: case for case in detection.all_cases() if case.name in (FAILED, HEALTHY)}


def test_detection_row_is_the_first_alert_of_the_rule_in_the_replay() -> None:
    case = cases()[FAILED]
    assert (case.bad_step, case.rule) == (19, "nan_inf")  # from the fixture's expected.json
    alerts = [a for a in replay(case.paths, load_settings(None, environ={})).alerts]
    opened = [a for a in alerts if not a.resolves]
    caught = next(a for a in opened if a.rule == "nan_inf" or a.severity == Severity.CRITICAL)

    [row] = detection.detection_rows([detection.evaluate(case)])

    assert row[0] == FAILED
    assert row[1] == "19"
    assert row[3] == str(caught.step)
    assert row[4] == f"{caught.rule} ({caught.severity})"
    first = opened[0]
    assert first.step is not None and first.step <= 19
    assert row[7] == str(19 - first.step)
    # Logged steps between the first alert and the bad step: one a step here (logging_steps=1).
    assert row[8] == str(19 - first.step)
    cause = caught.details["diagnosis"]["cause"]
    assert cause and row[9] == (cause if len(cause) <= 70 else cause[:67] + "...")


def test_false_alarm_tables_count_the_replays_episodes() -> None:
    case = cases()[HEALTHY]
    assert case.expected_warnings == {"eval_loss_rise"}
    opened = [
        a for a in replay(case.paths, load_settings(None, environ={})).alerts if not a.resolves
    ]
    warned = {a.rule for a in opened if a.severity == Severity.WARNING}
    critical = {a.rule for a in opened if a.severity == Severity.CRITICAL}

    outcomes = [detection.evaluate(c) for c in cases().values()]
    [total], per_rule = detection.false_alarm_rows(outcomes)

    assert total[0] == "1"  # one healthy run among the two
    assert total[2] == str(len(warned - critical))
    assert total[3] == str(len(warned & {"eval_loss_rise"}))
    assert total[5] == str(len(critical))
    assert [row[0] for row in per_rule] == sorted(warned | critical)
    listed = {(row[0], row[1]) for row in detection.alarm_rows(outcomes)}
    assert listed == {(HEALTHY, rule) for rule in warned | critical}
    table = detection.report(outcomes)
    assert "| hf/nan/trainer_state.json | 19 | nan_inf |" in table


def test_the_published_tables_are_the_benchs_output_now() -> None:
    """docs/benchmarks.md quotes the whole report between its markers: a change to what
    the rules raise on any fixture or corpus run changes it, and the page with it."""
    page = (ROOT / "docs" / "benchmarks.md").read_text("utf-8")
    start = "<!-- detection-tables: the output of the command above -->\n"
    published = page[page.index(start) + len(start) : page.index("<!-- /detection-tables -->")]
    outcomes = [detection.evaluate(case) for case in detection.all_cases()]
    assert published == detection.report(outcomes) + "\n"
