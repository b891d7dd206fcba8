"""Issue 20's done-when: a Lightning job as many users write it (``lightning_job.py``), NaN
from step 60, run as ``sentinel run -- python train.py`` with no other option, is stopped
within 20 steps of its NaN, and the alert names the step of the line that showed it.

The job needs ``lightning`` and ``rich`` (the ``lightning`` extra) in the interpreter that
runs it: the test's own, or ``LIGHTNING_TEST_PYTHON`` (a venv with them; sentinel itself
runs in the test's interpreter). About 25 s on 2 busy cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("lightning_job.py")
NAN_FROM = 60
PYTHON = os.environ.get("LIGHTNING_TEST_PYTHON", sys.executable)


def _has_lightning() -> bool:
    if sys.executable == PYTHON:
        return all(importlib.util.find_spec(name) is not None for name in ("lightning", "rich"))
    probe = "import importlib.util as u; import sys; sys.exit(not u.find_spec('lightning'))"
    return subprocess.run([PYTHON, "-c", probe], check=False).returncode == 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not _has_lightning(), reason="needs lightning and rich: pip install '.[lightning]'"
    ),
]


def test_a_lightning_job_is_stopped_within_20_steps_of_its_nan_at_its_step(
    tmp_path: Path,
) -> None:
    shutil.copy(JOB, tmp_path / "train.py")
    state = tmp_path / "state"
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
         "--max-restarts", "0", "--", PYTHON, "train.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    journal = state / "alerts.jsonl"
    assert journal.exists(), result.stderr[-3000:]
    alerts = [json.loads(line) for line in journal.read_text().splitlines()]
    nan = [alert for alert in alerts if alert["rule"] == "nan_inf"]
    assert nan, result.stderr[-3000:]
    # The step of the line that showed it: the bar's (60 on) or the CSV row's (69).
    assert NAN_FROM <= nan[0]["step"] < NAN_FROM + 10, nan[0]
    last_step = int((tmp_path / "last_step").read_text())
    assert last_step < NAN_FROM + 20, (last_step, nan[0])
