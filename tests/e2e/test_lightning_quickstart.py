"""The README's Lightning quickstart, word for word: its script (``examples/lightning/train.py``,
shown whole in the README) run with its command, ``NAN_AT_STEP=410 sentinel run --checkpoints
lightning_logs -- python train.py``.

Lightning at its defaults logs to TensorBoard under ``lightning_logs/version_N/`` and keeps
the last epoch's checkpoint in ``version_N/checkpoints/``; 400 steps an epoch, 2 epochs. The
loss turns NaN at step 410 in the first attempt: sentinel reads it from the event file, stops
the job before the end of its epoch, rolls back to ``version_0``'s checkpoint of step 400 and
restarts it; the second attempt (``version_1``) resumes there and finishes, and ``run`` exits
0. The job needs ``lightning`` and tensorboard in the interpreter that runs it: the test's
own, or ``LIGHTNING_TEST_PYTHON``. About 30 s on 2 busy cores: two starts of Lightning
(sentinel's 5 s back-off between them shortened to 0.1 s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.parsing.tensorboard import RecordSplitter

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "lightning" / "train.py"
PYTHON = os.environ.get("LIGHTNING_TEST_PYTHON", sys.executable)
NEEDS = ("lightning", "tensorboard")


def _has_lightning() -> bool:
    if sys.executable == PYTHON:
        return all(importlib.util.find_spec(name) is not None for name in NEEDS)
    probe = f"import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, {NEEDS!r})))"
    return subprocess.run([PYTHON, "-c", probe], check=False).returncode == 0


def quickstart() -> str:
    """The README's section "Quickstart: a Lightning script"."""
    from tests.helpers.manual import section

    return section("Quickstart: a Lightning script")


def commands() -> list[str]:
    """The lines that run sentinel in the section's shell blocks (fences with no language)."""
    found, fence = [], None
    for line in quickstart().splitlines():
        text = line.strip()
        if text.startswith("```"):
            fence = text if fence is None else None
        elif fence == "```" and "sentinel " in text:
            found.append(text)
    return found


def test_the_readme_shows_the_shipped_script_whole() -> None:
    assert f"```python\n{SCRIPT.read_text(encoding='utf-8')}```" in quickstart()


COMMAND = ["sentinel", "run", "--checkpoints", "lightning_logs", "--", "python", "train.py"]


def test_the_readme_runs_it_with_one_command() -> None:
    plain, with_nan = commands()
    assert shlex.split(plain) == COMMAND
    assert with_nan == f"NAN_AT_STEP=410 {plain}"


def events(folder: Path) -> list[dict[str, object]]:
    """The scalar records of the one event file in ``folder``, as sentinel reads them."""
    (path,) = folder.glob("events.out.tfevents.*")
    splitter = RecordSplitter()
    return [json.loads(line) for line in splitter.feed(path.read_bytes()) + splitter.flush()]


@pytest.mark.slow
@pytest.mark.skipif(
    not _has_lightning(), reason="needs lightning and tensorboard: pip install '.[test,frameworks]'"
)
def test_the_quickstart_job_is_stopped_rolled_back_into_the_pool_resumed_and_finishes(
    tmp_path: Path,
) -> None:
    shutil.copy(SCRIPT, tmp_path / "train.py")
    assignment, *command = shlex.split(commands()[1])
    assert command == COMMAND
    # ``sentinel`` is this interpreter's; ``python`` the one with lightning.
    argv = [sys.executable, "-m", *(PYTHON if word == "python" else word for word in command)]
    result = subprocess.run(
        argv,
        cwd=tmp_path,
        env={
            **os.environ,
            **dict([assignment.split("=", 1)]),
            "PYTHONPATH": str(ROOT),
            "SENTINEL_JOB__RESTART_BACKOFF_S": "0.1",  # the 5 s back-off, shortened
        },
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    state = tmp_path / ".sentinel"
    alerts = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    critical = [a for a in alerts if a["severity"] == "critical"]
    assert [(a["rule"], a["step"]) for a in critical] == [("nan_inf", 410)], critical
    logs = tmp_path / "lightning_logs"
    assert Path(critical[0]["source"]).parent == logs / "version_0"  # read from the event file

    (report,) = state.glob("reports/*.md")
    timeline = report.read_text()
    assert "rolled back to epoch=0-step=400.ckpt" in timeline, timeline
    assert "restarting (1 of" in timeline, timeline

    # The first start was stopped before its epoch's end: its clean checkpoint is still the
    # only one it saved, and no step of its second epoch's end was logged.
    first = events(logs / "version_0")
    assert 410 <= max(int(str(r["step"])) for r in first) < 799
    # sentinel's own hidden .sentinel-kept/ in each (clean versions it keeps) is not the job's.
    checkpoints = sorted(p.relative_to(logs).as_posix() for p in logs.glob("*/checkpoints/[!.]*"))
    # The second resumed from version_0's checkpoint (its first step is 400, not 0) and
    # finished (the checkpoint of its last step).
    second = events(logs / "version_1")
    assert min(int(str(r["step"])) for r in second) == 400
    assert checkpoints == [
        "version_0/checkpoints/epoch=0-step=400.ckpt",
        "version_1/checkpoints/epoch=1-step=800.ckpt",
    ]
    assert not (logs / "quarantine").exists()  # nothing was saved after the onset
