"""The two-phase verdict: the deciding mark, the final record, ``--verdict-file``, ``clear``."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from sentinel.store import verdict
from sentinel.store.verdict import (
    EXIT_GIVE_UP,
    EXIT_NODE_FAULT,
    EXIT_ROLLED_BACK,
    clear,
    mark_deciding,
    read,
    write_final,
)

NOW = 1_764_100_000.5


def record(state_dir: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((state_dir / "verdict.json").read_text())
    return data


def test_the_codes_are_the_contract() -> None:
    assert (EXIT_GIVE_UP, EXIT_ROLLED_BACK, EXIT_NODE_FAULT) == (90, 91, 92)
    assert {code: name for code, (name, _) in verdict.CODES.items()} == {
        90: "give_up",
        91: "rolled_back",
        92: "node_fault",
    }


def test_deciding_then_final_then_cleared(tmp_path: Path) -> None:
    state = tmp_path / "st"
    assert mark_deciding(state, rule="nan_inf", step=120, attempt=1, time=NOW)
    assert record(state) == {
        "code": None,
        "verdict": None,
        "rule": "nan_inf",
        "step": 120,
        "resume_from": None,
        "attempt": 1,
        "time": NOW,
        "state": "deciding",
    }
    deciding = read(state)
    assert deciding is not None and not deciding.final
    ckpt = tmp_path / "ckpt" / "checkpoint-100"
    written = write_final(
        state, 91, None, "nan_inf", 120, ckpt, attempt=1, time=NOW + 3, verdict_file=None
    )
    assert record(state) == {
        "code": 91,
        "verdict": "rolled_back",
        "rule": "nan_inf",
        "step": 120,
        "resume_from": str(ckpt),
        "attempt": 1,
        "time": NOW + 3,
        "state": "final",
    }
    assert read(state) == written and written.final
    assert sorted(p.name for p in state.iterdir()) == ["verdict.json"]  # no temp file left
    clear(state)
    assert read(state) is None
    clear(state)  # nothing to clear is fine


def test_a_relative_resume_path_is_recorded_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_final(tmp_path / "st", 91, None, None, 5, "ckpt/step_5", 2, NOW)
    assert record(tmp_path / "st")["resume_from"] == str(tmp_path / "ckpt" / "step_5")


def test_the_verdict_file_holds_the_bare_code(tmp_path: Path) -> None:
    out = tmp_path / "verdict"
    out.write_text("91\n")  # the last attempt's
    write_final(tmp_path / "st", 90, "give_up", "nan_inf", 120, None, 2, NOW, verdict_file=out)
    assert out.read_text() == "90\n"
    assert record(tmp_path / "st")["verdict"] == "give_up"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st", "verdict"]


def test_a_code_that_is_no_verdict_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a verdict code: 1"):
        write_final(tmp_path, 1, None, None, None, None, None, NOW)
    assert not (tmp_path / "verdict.json").exists()


def test_the_record_and_its_dir_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        mark_deciding(tmp_path / "st", rule=None, step=None, attempt=None, time=NOW)
        assert stat.S_IMODE((tmp_path / "st" / "verdict.json").stat().st_mode) == 0o600
        write_final(tmp_path / "st", 92, None, "gpu_health", None, None, 1, NOW)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "st" / "verdict.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "st").stat().st_mode) == 0o700


def test_marking_never_raises_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the state dir should be: every write fails
    assert not mark_deciding(blocker, rule="nan_inf", step=1, attempt=1, time=NOW)
    assert "could not mark the verdict as deciding" in caplog.text
    with pytest.raises(OSError):  # the final record's failure is the caller's to log
        write_final(blocker, 91, None, None, None, None, None, NOW)
    clear(blocker)  # logged, not raised


def test_marking_is_fast(tmp_path: Path) -> None:
    """It sits before the first signal: no sync, a temp file and a rename (about 0.1 ms)."""
    state = tmp_path / "st"
    mark_deciding(state, rule="nan_inf", step=1, attempt=1, time=NOW)
    took = []
    for step in range(50):
        start = time.perf_counter()
        mark_deciding(state, rule="nan_inf", step=step, attempt=1, time=NOW)
        took.append(time.perf_counter() - start)
    assert sorted(took)[len(took) // 2] < 0.005, took


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[]",
        '{"state": "final", "code": 1}',
        '{"state": "final", "code": true}',
        '{"state": "final"}',
        '{"code": 91}',
    ],
    ids=["empty", "torn", "not-an-object", "no-verdict-code", "bool-code", "no-code", "no-state"],
)
def test_a_record_that_is_not_one_reads_as_none(tmp_path: Path, text: str) -> None:
    (tmp_path / "verdict.json").write_text(text)
    assert read(tmp_path) is None


def test_a_field_of_another_type_or_not_finite_reads_as_unknown(tmp_path: Path) -> None:
    """A record edited by hand: a time that is text made ``status`` end in a traceback, a
    NaN made its ``--json`` no JSON, a NaN grace made the stop's take-up fail to write the
    record again (oos47b). The code still counts; the rest reads as unknown."""
    record = {"state": "final", "code": 90, "verdict": "give_up", "rule": ["nan_inf"],
              "step": "five", "resume_from": 7, "attempt": True, "time": "yesterday"}  # fmt: skip
    (tmp_path / "verdict.json").write_text(json.dumps(record))
    read = verdict.read(tmp_path)
    assert read is not None and (read.state, read.code, read.verdict) == ("final", 90, "give_up")
    assert (read.rule, read.step, read.resume_from, read.attempt, read.time) == (None,) * 5
    for value in ("NaN", "Infinity", "1e400"):
        (tmp_path / "verdict.json").write_text(
            '{"state": "final", "code": 90, "time": ' + value + ', "step": 5}'
        )
        read = verdict.read(tmp_path)
        assert read is not None and read.time is None and read.step == 5
        json.dumps(read.to_json(), allow_nan=False)


def test_a_stop_with_a_grace_that_is_no_number_is_no_stop_record() -> None:
    from sentinel.model.incidents import IncidentTracker
    from sentinel.model.records import Alert, Severity
    from sentinel.rules import STORIES
    from sentinel.store.stop_intent import StopIntent, compact_incident

    alert = Alert(rule="nan_inf", severity=Severity.CRITICAL, message="m", time=99.0, step=5)
    observed = IncidentTracker("run", STORIES).observe(alert)
    assert observed is not None
    good = {"phase": "stopping", "incident": compact_incident(observed[1]), "restart": True,
            "attempt": 1, "job": [42, 1.5], "signal": "SIGTERM", "grace_s": 30.0,
            "signalled_at": 100.0}  # fmt: skip
    assert StopIntent.from_json(good) is not None
    for bad in ({"grace_s": float("nan")}, {"signalled_at": float("inf")}, {"grace_s": "x"}):
        assert StopIntent.from_json({**good, **bad}) is None, bad
