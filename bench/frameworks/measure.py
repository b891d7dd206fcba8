"""How soon ``sentinel run`` sees a NaN, per framework: the figures in the README's table.

Usage::

    JOB_PYTHON=VENV/bin/python python bench/frameworks/measure.py NAME JOB.py [VAR=VALUE ...]

Runs ``JOB.py`` (a job of this folder, with the modules the jobs share, ``HELPERS``) in a
fresh folder as ``sentinel run --dry-run -- $JOB_PYTHON JOB.py``, no ``--log``, no other
option, and the
``VAR=VALUE`` pairs in the environment of both. The job writes ``step time`` at the start
of every step (``steps.log``); its loss turns NaN from step 60. ``--dry-run`` lets the job
run on after the alert. Prints one JSON line: the step the first ``nan_inf`` alert named,
what it was read from, and the job's own step when sentinel decided (``decided_at``).
``JOB_PYTHON`` needs the job's framework (torch, lightning + rich, transformers,
tensorboard, keras); sentinel runs in this interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: What the jobs import beside them; the Lightning job also imports the end-to-end test's
#: job (``tests/e2e/lightning_job.py``) through ``PYTHONPATH``.
HELPERS = ("common.py", "torch_loop.py")


def main() -> None:
    name, script, *pairs = sys.argv[1:]
    env = {**os.environ, **dict(pair.split("=", 1) for pair in pairs)}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for file in (*HELPERS, script):
            shutil.copy(HERE / file, folder)
        command = [sys.executable, "-m", "sentinel", "run", "--dry-run", "--state-dir", "st"]
        job = [os.environ.get("JOB_PYTHON", sys.executable), script]
        result = subprocess.run(
            [*command, "--", *job], cwd=folder, env=env, capture_output=True, text=True
        )
        steps = [line.split() for line in (folder / "steps.log").read_text().splitlines()]
        journal = folder / "st" / "alerts.jsonl"
        alerts = [json.loads(line) for line in journal.read_text().splitlines()]
    row: dict[str, object] = {"case": name, "exit": result.returncode, "steps": len(steps)}
    nan = [alert for alert in alerts if alert["rule"] == "nan_inf"]
    if nan:
        alert = nan[0]
        decided = alert.get("decided_at") or alert["time"]
        source = str(alert.get("source") or "")
        row |= {
            "named_step": alert["step"],
            "metric": alert["metric"],
            "read_from": os.path.relpath(source, scratch) if os.path.isabs(source) else source,
            "job_step_then": max(int(step) for step, at in steps if float(at) <= decided),
        }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
