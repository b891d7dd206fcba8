"""One log file per rank, 64 of them, watched at once: as fast as one, and one story told once.

The job writes a line per step to each of its 64 ``rank-N.log`` files (``--log`` names them
by a glob), 20 steps a second, then a NaN in every one at the same step, as a blow-up that
reaches every rank does. sentinel stops it within ``STOP_WITHIN_S`` of the NaN's write
(0.06 s here), raises one incident, and says the ranks' NaN in two console lines (the
first rank's, then "also on rank N"), one timeline line naming the ranks, and one
alert per rank in ``alerts.jsonl``. ``bench/latency.py --watchers watch,'watch x64'``
measures the latency against one file's, at rates up to where 64 files saturate a core.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sentinel.model.incidents import alert_lines, fold_ranks, ranks_text
from sentinel.model.records import SENTINEL_SOURCE, Alert, Severity
from tests.helpers.env import clean_env

pytestmark = pytest.mark.slow

RANKS = 64
NAN_AT = 30
STOP_WITHIN_S = 2.0

JOB = textwrap.dedent(
    """
    import json, math, os, signal, sys, time
    folder, ranks, nan_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    record = os.path.join(folder, "record.jsonl")
    def on_term(signum, frame):
        with open(record, "a") as f:
            f.write(json.dumps({"sigterm": time.time()}) + "\\n")
        os._exit(143)
    signal.signal(signal.SIGTERM, on_term)
    logs = os.path.join(folder, "logs")
    os.makedirs(logs)
    files = [open(os.path.join(logs, f"rank-{r}.log"), "w", buffering=1) for r in range(ranks)]
    step = 0
    while step < 600:
        step += 1
        if step == nan_at:
            with open(record, "a") as f:
                f.write(json.dumps({"nan_written": time.time()}) + "\\n")
        for rank, out in enumerate(files):
            loss = float("nan") if step == nan_at else 2.0 + math.sin(step + rank) / 50
            out.write(json.dumps({"step": step, "loss": loss, "grad_norm": 1.0}) + "\\n")
        time.sleep(0.05)
    """
)


def test_64_rank_files_stop_at_once_and_tell_one_story(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    state = tmp_path / "state"
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
         "--log", str(tmp_path / "logs" / "rank-*.log"),
         "--", sys.executable, str(job), str(tmp_path), str(RANKS), str(NAN_AT)],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 90, result.stderr[-3000:]  # no checkpoint dir: gives up
    record = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    written = next(r["nan_written"] for r in record if "nan_written" in r)
    stopped = next(r["sigterm"] for r in record if "sigterm" in r)
    assert stopped - written < STOP_WITHIN_S

    alerts = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    nans = [a for a in alerts if a["rule"] == "nan_inf" and a["step"] == NAN_AT]
    ranks = {a["message"].split(":")[0] for a in nans}
    assert len(ranks) >= 2, "each rank read before the stop keeps its own alert"
    # The console: the first rank's NaN, the next rank's "also", nothing per further rank.
    # (the give-up that follows the stop may come before or after the echo: not counted)
    said = [
        line for line in result.stderr.splitlines()
        if f"nan_inf step={NAN_AT}:" in line and "[sentinel" in line and "giving up" not in line
    ]  # fmt: skip
    assert "loss is nan" in said[0] and "also on rank" in said[1], said
    assert not [line for line in said[2:] if "loss is nan" in line or "also on" in line], said
    # One incident: one report, whose timeline folds the ranks into one line.
    reports = list((state / "reports").glob("*.md"))
    assert len(reports) == 1, reports
    report = reports[0].read_text().splitlines()
    # Whichever rank was read first names the incident ("rank 63: loss is nan ..." when
    # rank 63's file was read first), the others folded into its line.
    timeline = [line for line in report if "critical nan_inf: " in line and "loss is nan" in line]
    assert len(timeline) == 1, timeline
    # (the report is written as the incident goes: a rank read after it is in the journal,
    # and on a loaded machine the stop's report may come before a second rank was read)
    read = {prefix for prefix in ranks if prefix.startswith(("rank ", "loss is nan"))}
    assert 1 <= len(ranks_in(timeline[0])) <= len(read), timeline
    # And so does the timeline run prints at its end.
    end = [
        line
        for line in result.stderr.splitlines()
        if "CRITICAL nan_inf: " in line and "loss is nan" in line
    ]
    assert len(end) == 1 and "(also on ranks " in end[0], end


def ranks_in(line: str) -> set[int]:
    """The ranks a folded timeline line names: its own ("rank N: ", none for rank 0's
    unprefixed message) and those of "(also on ranks 0-18, 20-62)"."""
    own = {int(line.split("rank ")[1].split(":")[0])} if ": rank " in line else {0}
    if "(also on ranks " not in line:
        return own
    spans = line.rsplit("(also on ranks ", 1)[1].rstrip(")").split(", ")
    for span in spans:
        first, _, last = span.partition("-")
        own.update(range(int(first), int(last or first) + 1))
    return own


def _alert(
    rank: int | None, at: float = 1.0, message: str = "loss is nan at step 30", step: int = 30
) -> Alert:
    details = {} if rank is None else {"rank": rank}
    text = message if rank is None else f"rank {rank}: {message}"
    return Alert("nan_inf", Severity.CRITICAL, text, at, step=step, details=details)


def test_what_several_ranks_raise_at_once_is_one_line_naming_them() -> None:
    """The same rule and severity from other ranks within a minute: one line, whatever
    each rank's numbers (a slowdown on every rank reads differently on each)."""
    alerts = [
        _alert(None),
        _alert(1),
        _alert(2, message="loss is inf at step 31", step=31),
        _alert(3),
        _alert(5),
        _alert(2, at=200.0, message="x"),  # an hour later: its own line
    ]
    folded = fold_ranks(alerts)
    assert [(a.message, others) for a, others in folded] == [
        ("loss is nan at step 30", [1, 2, 3, 5]),
        ("rank 2: x", []),
    ]
    assert ranks_text([5, 1, 2, 3]) == "ranks 1-3, 5" and ranks_text([7]) == "rank 7"
    [(_, first), (_, other)] = alert_lines(alerts)
    assert first == "CRITICAL nan_inf: loss is nan at step 30 (also on ranks 1-3, 5)"
    assert other == "CRITICAL nan_inf: rank 2: x"


def test_the_ranks_read_after_sentinel_gave_up_fold_into_the_first_ranks_line() -> None:
    """The give-up ("no checkpoint dir is configured: giving up ...") is a critical of the
    incident's rule, rank 0's by its lack of one, journaled before the ranks read after the
    stop: the ranks folded into it, and the NaN line said rank 0's alone (a CI failure)."""
    gave_up = Alert(
        "nan_inf", Severity.CRITICAL, "no checkpoint dir is configured: giving up", 1.05,
        source=SENTINEL_SOURCE, step=30, details={"escalation": True},
    )  # fmt: skip
    alerts = [_alert(None), gave_up, _alert(1, at=1.03), _alert(2, at=1.03)]
    folded = fold_ranks(alerts)
    assert [(a.message, others) for a, others in folded] == [
        ("loss is nan at step 30", [1, 2]),
        ("no checkpoint dir is configured: giving up", []),
    ]


def test_one_rank_repeating_itself_is_not_folded() -> None:
    alerts = [_alert(1), _alert(1)]
    assert [others for _, others in fold_ranks(alerts)] == [[], []]
