"""``sentinel run`` end to end: a real job, real signals, real checkpoints, a real webhook."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import sentinel_here
from tests.helpers.webhook import WebhookReceiver

pytestmark = pytest.mark.slow

# A training script in miniature: JSON metric lines, a step_<N> checkpoint every 5 steps
# (saved before the step's log line, as the HF Trainer does), the restart protocol honoured.
JOB = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path

    ckpt, record = Path(sys.argv[1]), Path(sys.argv[2])
    nan_at, steps = int(sys.argv[3]), int(sys.argv[4])
    mode = sys.argv[5] if len(sys.argv) > 5 else "once"
    restart = int(os.environ.get("SENTINEL_RESTART") or 0)

    def note(**fields):
        with record.open("a") as f:
            f.write(json.dumps(fields) + "\\n")

    def on_term(signum, frame):
        note(event="sigterm", restart=restart)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    note(event="start", restart=restart, argv=sys.argv[1:],
         resume_from=os.environ.get("SENTINEL_RESUME_FROM"),
         resume_step=os.environ.get("SENTINEL_RESUME_STEP"))
    start = int(os.environ.get("SENTINEL_RESUME_STEP") or 0)
    diverges = restart == 0 or mode == "always"
    for step in range(start + 1, steps + 1):
        if step % 5 == 0:
            (ckpt / f"step_{step}").mkdir(parents=True, exist_ok=True)
            (ckpt / f"step_{step}" / "weights.json").write_text(json.dumps({"step": step}))
        grad_norm = float("nan") if diverges and step == nan_at else 1.0
        metrics = {"step": step, "loss": 2.0 - step / 100, "grad_norm": grad_norm}
        print(json.dumps(metrics), flush=True)
        if diverges and step == nan_at:
            time.sleep(60)  # a real job would go on; sentinel must stop it
        time.sleep(0.01)
    note(event="finished", restart=restart)
    """
)


def _nvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _alerts(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]


@pytest.fixture
def job(tmp_path: Path) -> Path:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return script


def sentinel(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    # The stand-in job trains without loss scaling: its lone NaN grad-norm is a failure
    # (with loss scaling it could be a skipped fp16 step).
    full_env = {
        **os.environ,
        "SENTINEL_JOB__RESTART_BACKOFF_S": "0.1",
        "SENTINEL_RULES__NAN_INF__LOSS_SCALING": "none",
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "run", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_nan_grad_norm_stops_quarantines_restarts_and_finishes(job: Path, tmp_path: Path) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    with WebhookReceiver() as hook:
        result = sentinel(
            "--checkpoints", str(ckpt), "--notify", hook.url, "--state-dir", str(state),
            "--max-restarts", "2",
            "--", sys.executable, str(job), str(ckpt), str(record), "15", "20",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        alert_posts = [json.loads(r.json["message"]) for r in hook.wait_for(1, timeout=10)]

    # Without a GPU the GPU source says so once, and the NaN is still caught; with one
    # (NVML answers) it says nothing of the kind. Either way the host decides one answer.
    expected_off_notes = 0 if _nvml_works() else 1
    assert result.stderr.count("GPU rules are off") == expected_off_notes, result.stderr
    assert "no notification target" not in result.stderr, "a target was given"
    assert "not delivered yet" not in result.stderr, "the target took every message"

    events = _records(record)
    assert [(e["event"], e["restart"]) for e in events] == [
        ("start", 0),
        ("sigterm", 0),
        ("start", 1),
        ("finished", 1),
    ]
    restarted = events[2]
    assert restarted["resume_from"] == str((ckpt / "step_10").resolve())
    assert restarted["resume_step"] == "10"

    # The checkpoint written at the NaN step is quarantined, never deleted; the clean ones stay.
    quarantined = list((ckpt / "quarantine").glob("*/step_15"))
    assert len(quarantined) == 1
    assert json.loads((quarantined[0] / "weights.json").read_text()) == {"step": 15}
    assert sorted(p.name for p in ckpt.iterdir() if p.name != "quarantine") == [
        "step_10",
        "step_15",
        "step_20",
        "step_5",
    ]  # fmt: skip  (step_15 again: written by the restarted attempt)

    first = _alerts(state)[0]
    assert (first["rule"], first["severity"], first["step"], first["metric"], first["value"]) == (
        "nan_inf", "critical", 15, "grad_norm", "nan"
    )  # fmt: skip
    assert any(a["rule"] == "nan_inf" and a["step"] == 15 for a in alert_posts)
    reports = list((state / "reports").glob("*.md"))
    assert reports and "rolled back to step_10" in reports[0].read_text()


def test_resume_command_gets_checkpoint_and_step(job: Path, tmp_path: Path) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    resume = f"{sys.executable} {job} {ckpt} {record} 15 20 once"
    resume += " --from={checkpoint} --at={step}"
    result = sentinel(
        "--checkpoints", str(ckpt), "--state-dir", str(state), "--resume-command", resume,
        "--", sys.executable, str(job), str(ckpt), str(record), "15", "20",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    restarted = _records(record)[2]
    assert restarted["argv"][-2:] == [f"--from={(ckpt / 'step_10').resolve()}", "--at=10"]
    # No target was given: said once at start, with where the record still is.
    assert result.stderr.count("no notification target: nobody will be told") == 1
    assert f"the reports in {state} still record them" in result.stderr


def test_same_failure_at_same_step_is_not_restarted_forever(job: Path, tmp_path: Path) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    result = sentinel(
        "--checkpoints", str(ckpt), "--state-dir", str(state), "--max-restarts", "5",
        "--", sys.executable, str(job), str(ckpt), str(record), "7", "20", "always",
    )  # fmt: skip
    assert result.returncode == 90, "gives up: the orchestrator must not retry it"
    starts = [e for e in _records(record) if e["event"] == "start"]
    assert len(starts) == 2, "one restart, then the recurrence at step 7 stops the loop"
    assert any("recurred at the same step" in a["message"] for a in _alerts(state))


def test_dry_run_never_signals_or_moves(job: Path, tmp_path: Path) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    script = tmp_path / "short.py"
    # The same job, but its NaN step does not hang, so it finishes on its own.
    script.write_text(JOB.replace("time.sleep(60)", "pass"))
    result = sentinel(
        "--dry-run", "--checkpoints", str(ckpt), "--state-dir", str(state),
        "--", sys.executable, str(script), str(ckpt), str(record), "5", "12",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [e["event"] for e in _records(record)] == ["start", "finished"]
    assert not (ckpt / "quarantine").exists()
    assert _alerts(state)[0]["rule"] == "nan_inf"
    assert "dry run: would send SIGTERM to the job's tree" in result.stderr
    # The saves from its onset on (step_5, written before the NaN's line, and after) were
    # left in place: `sentinel checkpoints` calls none of them clean. It called the NaN
    # run's last save "last clean: a rollback resumes here".
    listed = sentinel_here("checkpoints", str(ckpt), "--state-dir", str(state), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "a dry run would have stopped the job (nan_inf" in listed.stdout
    rows = {line.split()[0]: line for line in listed.stdout.splitlines() if "step_" in line}
    assert sorted(rows, key=int) == ["5", "10"], listed.stdout
    assert all("after_onset" in row and "last clean" not in row for row in rows.values())


def test_crash_is_classified_from_the_jobs_last_output(tmp_path: Path) -> None:
    crash = tmp_path / "crash.py"
    crash.write_text(
        textwrap.dedent(
            """
            import sys
            print('{"step": 1, "loss": 2.0}', flush=True)
            print("Traceback (most recent call last):", file=sys.stderr)
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                  file=sys.stderr)
            sys.exit(1)
            """
        )
    )
    state = tmp_path / "state"
    result = sentinel(
        "--state-dir", str(state), "--max-restarts", "0", "--", sys.executable, str(crash)
    )
    assert result.returncode == 1
    crash_alerts = [a for a in _alerts(state) if a["rule"] == "job_crash"]
    assert crash_alerts and crash_alerts[0]["severity"] == "critical"
    assert "oom" in crash_alerts[0]["message"]
    assert "CUDA out of memory" in result.stderr  # passed through to sentinel's own stderr


def test_a_give_up_tells_each_target_what_was_done_once(tmp_path: Path) -> None:
    """A crash with no checkpoint dir: sentinel gives up. The escalation told every target
    what was done, and the run's end told them the same again: two "actions" messages,
    one body, two idempotency keys (nothing dedupes them)."""
    state = tmp_path / "state"
    with WebhookReceiver() as hook:
        result = sentinel(
            "--state-dir", str(state), "--notify", hook.url, "--drain-timeout", "20", "--",
            sys.executable, "-c", "print('step 1 loss 2.0', flush=True); raise SystemExit(1)",
            env={"SENTINEL_NOTIFY__GROUP_WAIT_S": "0"},
        )  # fmt: skip
        assert result.returncode == 90, result.stderr
        notices = [
            notice
            for request in hook.accepted
            for notice in json.loads(request.json["message"])["notices"]
        ]
    assert [notice["kind"] for notice in notices].count("actions") == 1, notices


def test_stall_soft_warns_then_hard_stops(tmp_path: Path) -> None:
    hang = tmp_path / "hang.py"
    hang.write_text(
        'import time\nprint(\'{"step": 1, "loss": 2.0}\', flush=True)\ntime.sleep(120)\n'
    )
    state = tmp_path / "state"
    result = sentinel(
        "--state-dir", str(state), "--max-restarts", "0", "--", sys.executable, str(hang),
        env={
            "SENTINEL_TICK_INTERVAL_S": "0.05",
            "SENTINEL_RULES__STALL__SOFT_TIMEOUT_S": "0.5",
            "SENTINEL_RULES__STALL__HARD_TIMEOUT_S": "1.0",
            "SENTINEL_PROCESS__INTERVAL_S": "0.2",
        },
    )  # fmt: skip
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    stall = [a for a in _alerts(state) if a["rule"] == "stall"]
    assert [(a["severity"], a["step"]) for a in stall] == [("warning", 1), ("critical", 1)]
    # The process source saw the job asleep: evidence of a hang, not a long save.
    assert stall[1]["message"].endswith("it looks hung"), stall[1]["message"]
    assert "process tree CPU" in stall[1]["message"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_sigterm_to_sentinel_stops_the_job_and_exits_with_its_status(
    tmp_path: Path, signum: int
) -> None:
    slow = tmp_path / "slow.py"
    slow.write_text(
        "import time\nfor i in range(1000):\n"
        '    print(\'{"step": %d, "loss": 1.0}\' % i, flush=True)\n    time.sleep(0.05)\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(tmp_path / "state"),
         "--", sys.executable, str(slow)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the job's first line, passed through: it is running
        assert json.loads(first)["step"] == 0
        proc.send_signal(signum)
        # As a program that signal ended: 143, or 130 for Ctrl-C (never FATAL).
        assert proc.wait(timeout=20) == 128 + signum
        assert proc.stderr is not None
        assert "-> FATAL" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.communicate()


def test_job_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text(
        "import json, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print(json.dumps({'step': 3, 'loss': float('nan')}), flush=True)\ntime.sleep(120)\n"
    )
    state = tmp_path / "state"
    result = sentinel(
        "--state-dir", str(state), "--max-restarts", "0", "--", sys.executable, str(stubborn),
        env={"SENTINEL_JOB__GRACE_PERIOD_S": "0.5"},
    )  # fmt: skip
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    (report,) = (state / "reports").glob("*.md")
    assert "SIGKILL" in report.read_text()


@pytest.mark.slow
def test_each_alert_line_says_its_level_once(tmp_path: Path) -> None:
    """The log line's level is the alert's severity; a critical (logged as ERROR) says so."""
    job = tmp_path / "job.py"
    job.write_text(
        "import json, time\n"
        "for step in range(1, 40):\n"
        "    loss = 1.0 if step < 30 else (50.0 if step < 35 else float('nan'))\n"
        "    print(json.dumps({'step': step, 'loss': loss}), flush=True)\n"
        "    time.sleep(0.01)\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(tmp_path / "state"),
         "--max-restarts", "0", "--", sys.executable, str(job)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    lines = result.stderr.splitlines()
    assert any("] WARNING loss_spike step=30: " in line for line in lines), result.stderr
    assert any("] ERROR CRITICAL nan_inf step=35: " in line for line in lines), result.stderr
    assert not [line for line in lines if "WARNING WARNING" in line or "INFO INFO" in line]
