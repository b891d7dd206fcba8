"""A restart that did not restore health is caught, rolled back further, and its recovery said.

A real job under ``sentinel run``: at step 70 of its first attempt it silently takes a bad
state (a learning rate raised where nothing logs it), which its next checkpoints hold; at
step 90 its loss goes NaN. The rollback resumes from step 80, whose checkpoint already holds
the bad state: the loss there is 13 against 0.8. Whether that is caught at once (a loss spike
in the resumed attempt, before it reaches step 90) or at the onset step (the ``recovery``
rule), the checkpoint it resumed from is suspect: sentinel rolls back further, to step 60,
from before the cause, and the attempt after that passes the onset healthy, is said to have
recovered, and finishes.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.cli import run_job

pytestmark = pytest.mark.slow

#: How both jobs begin: their checkpoint dir, the state they resume (the restart protocol's
#: SENTINEL_RESUME_FROM), whether this is the first attempt, and a record of each start.
RESUMING = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    ckpt = Path(sys.argv[1]); ckpt.mkdir(exist_ok=True)
    resume = os.environ.get("SENTINEL_RESUME_FROM")
    fresh = {"step": 0, "bad": False}
    state = json.loads((Path(resume) / "state.json").read_text()) if resume else fresh
    first = not os.environ.get("SENTINEL_RESTART")
    with open(sys.argv[2], "a") as record:
        record.write(json.dumps({"resume_from": resume, "state": state}) + "\\n")
    """
)

JOB = RESUMING + textwrap.dedent(
    """
    for step in range(state["step"] + 1, 121):
        if first and step == 70:
            state["bad"] = True  # nothing logs it: the checkpoints after it hold it
        # A resumed attempt shows the bad state at once; the first hid it until its NaN.
        loss = 13.0 + step / 100 if state["bad"] and not first else 2.0 / (1 + step / 50)
        if first and step >= 90:
            loss = float("nan")
        print(json.dumps({"step": step, "loss": loss}), flush=True)
        if step % 20 == 0:
            (ckpt / f"step_{step}").mkdir(exist_ok=True)
            (ckpt / f"step_{step}" / "state.json").write_text(json.dumps({**state, "step": step}))
        time.sleep(0.01)
    """
)


def test_a_restart_that_did_not_restore_health_rolls_back_further_and_recovers(
    tmp_path: Path,
) -> None:
    job, ckpt, state = tmp_path / "job.py", tmp_path / "ckpt", tmp_path / "state"
    record = tmp_path / "starts.jsonl"
    job.write_text(JOB)
    result = run_job(ckpt, state, sys.executable, job, ckpt, record)
    assert result.returncode == 0, result.stderr[-3000:]
    starts = [json.loads(line) for line in record.read_text().splitlines()]
    resumed = [Path(s["resume_from"]).name if s["resume_from"] else None for s in starts]
    assert resumed == [None, "step_80", "step_60"], starts
    assert starts[2]["state"]["bad"] is False

    alerts = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    judged = [a for a in alerts if a["rule"] == "recovery"]
    # Attempt 2 may be judged too, where it outlives the stop another rule decided at once.
    assert judged and judged[-1]["severity"] == "info", judged
    assert "recovered" in judged[-1]["message"], judged
    for alert in judged[:-1]:
        assert alert["message"].startswith("the restart did not restore health: loss 13."), alert
    assert any("may hold the cause" in line for line in result.stderr.splitlines()), result.stderr
    # The morning after: the timeline, the result, where each restart resumed, the reports.
    tail = result.stderr[result.stderr.index("\nTimeline\n") :]
    assert "CRITICAL nan_inf: loss is nan at step 90" in tail
    assert "Result: the job finished with exit status 0 after 2 restart(s)" in tail
    assert f"restart 1 resumed from {ckpt / 'step_80'} (step 80)" in tail
    assert f"restart 2 resumed from {ckpt / 'step_60'} (step 60)" in tail
    reports = [
        line.removeprefix("Report: ") for line in tail.splitlines() if line.startswith("Report: ")
    ]
    assert reports and all(Path(path).is_file() for path in reports), tail
    assert f"Alert journal: {state / 'alerts.jsonl'}" in tail


POISONED_SAVE = RESUMING + textwrap.dedent(
    """
    for step in range(state["step"] + 1, 161):
        # The loss of a step is computed before its update; the update of step 130 is the
        # first with NaN gradients, so the save of 130 holds NaN weights, and the first NaN
        # loss is logged at 131 (from the first step of any attempt that loads them).
        loss = float("nan") if state["bad"] else 2.0 / (1 + step / 50)
        print(json.dumps({"step": step, "loss": loss}), flush=True)
        if first and step == 130:
            state["bad"] = True
        if step % 10 == 0:
            (ckpt / f"step_{step}").mkdir(exist_ok=True)
            (ckpt / f"step_{step}" / "state.json").write_text(json.dumps({**state, "step": step}))
        time.sleep(0.01)
    """
)


def test_a_checkpoint_whose_first_logged_value_is_bad_is_rolled_back_past(tmp_path: Path) -> None:
    """The save at the step just before the first NaN loss already holds NaN weights (its
    update was the first with NaN gradients): it looks clean and is resumed, and the NaN
    comes back at the very same step, from the attempt's first logged value. That is the
    checkpoint's poison, not the step's: sentinel rolls back past it once (it gave up, exit
    90, with a clean step_120 beside it), and the run finishes."""
    job, ckpt, state = tmp_path / "job.py", tmp_path / "ckpt", tmp_path / "state"
    record = tmp_path / "starts.jsonl"
    job.write_text(POISONED_SAVE)
    result = run_job(ckpt, state, sys.executable, job, ckpt, record)
    assert result.returncode == 0, result.stderr[-3000:]
    starts = [json.loads(line) for line in record.read_text().splitlines()]
    resumed = [Path(s["resume_from"]).name if s["resume_from"] else None for s in starts]
    assert resumed == [None, "step_130", "step_120"], starts
    assert "the checkpoint of step 130 may hold the cause; rolling back further" in result.stderr
