"""``sentinel demo``: a toy job diverges, is caught, rolled back, restarted, and finishes."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from sentinel.checkpoints.scan import scan
from sentinel.config import load_settings
from sentinel.service.summary import result_line, timeline


def run_demo(keep: Path | None, *, out: TextIO) -> int:
    """Run the toy job under ``sentinel run``; print what happened; the run's exit status."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        return _run(keep.resolve(), out, kept=True)
    with tempfile.TemporaryDirectory(prefix="sentinel-demo-") as work:
        return _run(Path(work), out, kept=False)


def _run(work: Path, out: TextIO, *, kept: bool) -> int:
    from sentinel.supervisor.core import Supervisor

    job_out = work / "run"
    checkpoints = job_out / "checkpoints"
    command = [sys.executable, "-m", "sentinel.demo.toy_job", "--out", str(job_out)]
    settings = load_settings(
        None,
        environ={},
        cli={
            "checkpoints": str(checkpoints),
            "state_dir": str(work / "state"),
            "max_restarts": 2,
        },
    )
    settings.job.name = "toy-job"
    settings.job.restart_backoff_s = 0.5
    settings.job.grace_period_s = 5.0
    # Metric files are looked for where the toy job writes, not in whatever folder the demo
    # was started from (a home directory holds more folders than are searched).
    settings.tail.discover_dir = job_out
    # Two pipes, not one terminal: its stdout (JSON metric lines) is read but not shown, its
    # stderr (what it says it does) is shown.
    settings.job.pty = False
    out.write(
        "sentinel demo: a toy job trains with a learning-rate schedule that jumps too high at\n"
        "step 30, so it will diverge. sentinel watches its output and checkpoints.\n"
        f"  work dir: {work}\n  job: {' '.join(command[1:])}\n\n"
    )
    out.flush()
    started = time.time()
    # The job's stdout is its JSON metric lines: read by sentinel, not shown, to keep this readable.
    with open(os.devnull, "wb") as devnull:
        supervisor = Supervisor(settings, command, stdout=devnull, stderr=None, summary=False)
        status = supervisor.run()
    elapsed = time.time() - started

    out.write("\nTimeline\n")
    for line in timeline(supervisor.watch.incidents()):
        out.write(f"{line}\n")
    result = result_line(status, supervisor.restarts, elapsed, relaunches=True)
    out.write(f"\n{result}\n\nCheckpoints now ({checkpoints}):\n")
    for checkpoint in scan(checkpoints):
        out.write(f"  {checkpoint.path.name:<16} {checkpoint.status}\n")
    quarantine = checkpoints / "quarantine"
    if quarantine.is_dir():
        for moved in sorted(quarantine.glob("*/*")):
            out.write(f"  quarantine/{moved.parent.name}/{moved.name}\n")
    if kept:
        out.write(
            f"\nAlert journal: {settings.state_dir / 'alerts.jsonl'}\n"
            f"Incident reports: {settings.state_dir / 'reports'}\n"
        )
    else:  # the work dir goes with the demo: no path to a file that is gone
        out.write(
            "\nThe demo's folder, its journal and its incident report are deleted as it ends:"
            " `sentinel demo --keep DIR` keeps them.\n"
        )
    return status
