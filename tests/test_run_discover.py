"""``sentinel run`` finds the metric file its job writes, with no ``--log``: a real job, a
real CSV written the way Lightning's CSVLogger writes it, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

#: Writes ``lightning_logs/version_1/metrics.csv`` (``version_0`` is an old run's) as
#: CSVLogger does: the header and rows at each flush; the NaN at step 69; then trains on
#: for as long as it is told.
JOB = textwrap.dedent(
    """
    import os, sys, time
    folder = os.path.join("lightning_logs", "version_1")
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.csv"), "w") as stream:
        stream.write("epoch,step,train_loss\\n")
        for step in range(9, 60, 10):
            stream.write(f"{step // 50},{step},{1.0 / (step + 1)}\\n")
    time.sleep(0.5)
    with open(os.path.join(folder, "metrics.csv"), "a") as stream:
        stream.write("1,69,nan\\n")
    time.sleep(float(sys.argv[1]))
    """
)


def _alerts(state: Path) -> list[dict[str, Any]]:
    journal = state / "alerts.jsonl"
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines()]


def _run(folder: Path, *options: str, job_s: float = 60) -> subprocess.CompletedProcess[str]:
    (folder / "job.py").write_text(JOB)
    old = folder / "lightning_logs" / "version_0" / "metrics.csv"
    old.parent.mkdir(parents=True)
    old.write_text("epoch,step,train_loss\n0,9,nan\n")  # yesterday's NaN: not this run's
    os.utime(old, (1_700_000_000, 1_700_000_000))
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(folder / "state"),
         "--max-restarts", "0", *options, "--", sys.executable, "job.py", str(job_s)],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


@pytest.mark.slow
def test_the_jobs_metrics_csv_is_found_and_its_nan_stops_the_job_at_its_step(
    tmp_path: Path,
) -> None:
    result = _run(tmp_path)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    nan = [alert for alert in _alerts(tmp_path / "state") if alert["rule"] == "nan_inf"]
    assert [(alert["step"], alert["metric"]) for alert in nan][:1] == [(69, "loss")], nan
    assert "version_1" in nan[0]["source"]


@pytest.mark.slow
def test_discovery_turned_off_reads_no_file(tmp_path: Path) -> None:
    (tmp_path / "sentinel.toml").write_text("[tail]\ndiscover = false\n")
    result = _run(tmp_path, "--config", str(tmp_path / "sentinel.toml"), job_s=1)
    assert result.returncode == 0, result.stderr
    assert not [a for a in _alerts(tmp_path / "state") if a["rule"] == "nan_inf"]


#: Saves a checkpoint as the HF Trainer does (100 steps an epoch by its log history), then
#: prints a step-less HF dict with a NaN loss at epoch 0.37, that is step 37.
HF_JOB = textwrap.dedent(
    """
    import json, os, time
    os.makedirs("out/checkpoint-10")
    history = [{"loss": 2.0, "grad_norm": 1.0, "learning_rate": 1e-05, "epoch": 0.1, "step": 10}]
    with open("out/checkpoint-10/trainer_state.json", "w") as stream:
        json.dump({"global_step": 10, "max_steps": 300, "log_history": history}, stream)
    time.sleep(2)
    print({"loss": "nan", "grad_norm": "1.0", "learning_rate": "1e-5", "epoch": "0.37"}, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.slow
def test_a_trainer_state_found_beside_the_checkpoints_gives_hf_dicts_their_step(
    tmp_path: Path,
) -> None:
    (tmp_path / "hf_job.py").write_text(HF_JOB)
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(tmp_path / "state"),
         "--max-restarts", "0", "--", sys.executable, "hf_job.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    nan = [alert for alert in _alerts(tmp_path / "state") if alert["rule"] == "nan_inf"]
    assert [(alert["step"], alert["metric"]) for alert in nan][:1] == [(37, "loss")], nan


#: A job found running by ``watch``: it writes its own metrics file a moment after it
#: starts (its NaN at step 69 when told), then lives on for a few seconds.
WATCHED = textwrap.dedent(
    """
    import os, sys, time
    time.sleep(1.5)
    folder = os.path.join("logs", "version_1")
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.csv"), "w") as stream:
        stream.write("epoch,step,train_loss\\n")
        for step in range(9, 60, 10):
            stream.write(f"{step // 50},{step},{1.0 / (step + 1)}\\n")
        if sys.argv[1] == "nan":
            stream.write("1,69,nan\\n")
    time.sleep(4)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("own", ["nan", "healthy"])
def test_watch_follows_the_jobs_own_files_not_an_earlier_runs(tmp_path: Path, own: str) -> None:
    """An earlier run's metrics file, written a minute before the job found running began
    (well within the ten minutes ``watch`` looks back), holds a NaN: it is not this job's,
    and a healthy job runs to its end; the job's own file is followed, its NaN stops it."""
    old = tmp_path / "logs" / "version_0" / "metrics.csv"
    old.parent.mkdir(parents=True)
    old.write_text("epoch,step,train_loss\n0,9,0.5\n0,19,nan\n")
    minute_ago = time.time() - 60
    os.utime(old, (minute_ago, minute_ago))
    (tmp_path / "job.py").write_text(WATCHED)
    job = subprocess.Popen([sys.executable, "job.py", own], cwd=tmp_path)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "watch", "--pid", str(job.pid),
         "--discover", str(tmp_path), "--state-dir", str(tmp_path / "state"),
         "--max-restarts", "0"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        status = job.wait(timeout=30)
    finally:
        job.kill()
        watcher.send_signal(signal.SIGTERM)
        _, stderr = watcher.communicate(timeout=30)
    followed = [line for line in stderr.splitlines() if "following" in line]
    assert not [line for line in followed if "version_0" in line], stderr
    nan = [alert for alert in _alerts(tmp_path / "state") if alert["rule"] == "nan_inf"]
    if own == "healthy":
        assert (status, nan) == (0, []), stderr
    else:
        assert status == -signal.SIGTERM, stderr
        assert [(alert["step"], Path(alert["source"]).parent.name) for alert in nan][:1] == [
            (69, "version_1")
        ], stderr
