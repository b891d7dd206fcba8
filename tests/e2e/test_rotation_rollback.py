"""A job that keeps only its newest checkpoint, under ``sentinel run``, goes NaN after a save.

The save that deleted the last clean checkpoint came after the onset, so the only
checkpoint left in place is poisoned: sentinel must roll back to the clean one it kept,
put it back where the job wrote it and restart the job from it (``SENTINEL_RESUME_FROM``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sentinel.checkpoints.files import read_content
from sentinel.checkpoints.keep import kept_versions
from sentinel.checkpoints.quarantine import MANIFEST
from tests.helpers.env import clean_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None,
        reason="needs torch: pip install '.[torch]' (CPU build)",
    ),
]

JOB = Path(__file__).with_name("newest_only_job.py")
SHIFT_JOB = Path(__file__).with_name("shift_job.py")


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_job(
    job: Path, ckpt: Path, state: Path, record: Path, *, max_restarts: int, tick_s: float
) -> subprocess.CompletedProcess[str]:
    """``sentinel run --checkpoints CKPT -- python JOB CKPT RECORD``, restarts 0.1 s apart."""
    ckpt.mkdir()
    argv = [
        sys.executable, "-m", "sentinel", "run", "--checkpoints", str(ckpt),
        "--state-dir", str(state), "--max-restarts", str(max_restarts),
        "--", sys.executable, str(job), str(ckpt), str(record),
    ]  # fmt: skip
    env = clean_env(SENTINEL_JOB__RESTART_BACKOFF_S="0.1", SENTINEL_TICK_INTERVAL_S=str(tick_s))
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _torch_step(path: Path) -> int | None:
    """The step a torch file holds, read without torch (its import is seconds of CPU): the
    job itself loaded the one it resumed from."""
    return read_content(path).step


def test_a_job_that_keeps_only_its_newest_checkpoint_resumes_from_the_clean_one_sentinel_kept(
    tmp_path: Path,
) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    result = run_job(JOB, ckpt, state, record, max_restarts=2, tick_s=0.25)
    assert result.returncode == 0, result.stderr[-4000:]

    records = _records(record)
    saves = [r for r in records if r["event"] == "saved" and r["restart"] == 0]
    # When the NaN came, the job had deleted the clean checkpoint: only the poisoned one was left.
    assert [(r["step"], r["deleted"]) for r in saves] == [(10, None), (20, "model_step10.pt")]
    resumed = [r for r in records if r["event"] == "start" and r["restart"] == 1]
    assert [(r["start"], r["resume_from"]) for r in resumed] == [
        (10, str((ckpt / "model_step10.pt").resolve()))
    ]
    assert [r["restart"] for r in records if r["event"] == "finished"] == [1]
    assert "deletes its older checkpoints" in result.stderr

    (quarantine,) = (ckpt / "quarantine").iterdir()
    assert _torch_step(quarantine / "model_step20.pt") == 20, "set aside, not deleted"
    manifest = json.loads((quarantine / MANIFEST).read_text())
    assert manifest["complete"] is True
    assert [r["path"] for r in manifest["put_back"]] == [str(ckpt / "model_step10.pt")]
    # The kept clean copy stays kept until the keeper holds its last ``versions`` (2) newer
    # ones: the restarted job saves on from step 10 at full speed, and the keeper sees its
    # saves of 20 and 30 or not, as the machine's load goes.
    kept = sorted(v.step for v in kept_versions(ckpt) if v.intact() and v.step is not None)
    assert 10 in kept or (len(kept) == 2 and kept[0] > 10), kept
    assert sorted(p.name for p in ckpt.glob("*.pt")) == ["model_step30.pt"]
    assert _torch_step(ckpt / "model_step30.pt") == 30


def test_a_warning_keeps_the_checkpoint_from_before_its_onset_through_fast_saves(
    tmp_path: Path,
) -> None:
    """The loss shifts x3 at step 31 and stays: sentinel warns within a few values and stops
    the job once the shift has held, some saves later. The job deleted each checkpoint as it
    saved the next, and sentinel keeps its last 2 versions: all after the onset by then. The
    open warning kept the one from before it (step 30), and the job resumes from there."""
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    result = run_job(SHIFT_JOB, ckpt, state, record, max_restarts=1, tick_s=0.1)
    assert result.returncode == 0, result.stderr[-4000:]

    alerts = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    critical = next(a for a in alerts if a["severity"] == "critical")
    # A loss spike at the onset, a shift (divergence) once it held: one story, one incident.
    warned = [a for a in alerts if a["severity"] == "warning"]
    assert [(a["rule"], a["step"]) for a in warned] == [("loss_spike", 31)], alerts
    assert (critical["rule"], warned[0]["time"] < critical["time"]) == ("divergence", True)
    records = _records(record)
    saved = [r["step"] for r in records if r["event"] == "saved" and r["restart"] == 0]
    # Between the warning and the stop the job saved at least twice after the onset: the
    # keeper's last 2 versions alone would have held nothing clean.
    after = [step for step in saved if step > 31]
    assert len(after) >= 2, (saved, critical["step"])
    resumed = [r for r in records if r["event"] == "start" and r["restart"] == 1]
    assert [(r["start"], r["resume_from"]) for r in resumed] == [
        (30, str((ckpt / "model_step30.pt").resolve()))
    ], result.stderr[-4000:]
    assert [r["restart"] for r in records if r["event"] == "finished"] == [1]
