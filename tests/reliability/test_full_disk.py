"""A state dir that cannot take another byte never costs the job its watchdog.

The disk is "full" for sentinel alone, without privileges: its file-size limit
(RLIMIT_FSIZE) is below the size its journal already has, so every append fails
with EFBIG as a full disk fails with ENOSPC (Python ignores SIGXFSZ).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LIMIT_BYTES = 512 * 1024

JOB = textwrap.dedent(
    """
    import json, signal, sys, time
    record = sys.argv[1]
    def on_term(signum, frame):
        open(record, "w").write("sigterm")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    for step in range(1, 200):
        loss = float("nan") if step == 20 else 1.0
        print(json.dumps({"step": step, "loss": loss}), flush=True)
        time.sleep(0.02 if step != 20 else 60)
    """
)


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def test_a_nan_still_stops_the_job_when_no_state_write_succeeds(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "alerts.jsonl").write_text("x" * (LIMIT_BYTES + 1024))  # "full": appends fail
    job, record = tmp_path / "job.py", tmp_path / "record"
    job.write_text(JOB)
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
         "--max-restarts", "0", "--", sys.executable, str(job), str(record)],
        preexec_fn=_limit_file_size, capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")},
    )  # fmt: skip
    assert record.read_text() == "sigterm", result.stderr
    assert result.returncode == 143, result.stderr
    assert "cannot write the alert journal" in result.stderr
    assert "Traceback" not in result.stderr
    assert "CRITICAL nan_inf step=20" in result.stderr
