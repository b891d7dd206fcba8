"""A log flood neither blinds sentinel nor fattens it: a NaN in it still stops the job at once.

The job floods its stdout at a rate this machine sustains in CI, with long lines, invalid
UTF-8 and unparseable JSON mixed in, then prints a NaN and floods on. sentinel's RSS is
sampled all along. bench/flood.py measures the same at 200k lines/s, against the job alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.env import clean_env

pytestmark = pytest.mark.slow

RATE = 100_000
FLOOD_S = 3.0
STOP_WITHIN_S = 1.0
RSS_LIMIT_BYTES = 150 * 2**20

JOB = textwrap.dedent(
    """
    import json, os, signal, sys, time
    record, rate, flood_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    def on_term(signum, frame):
        with open(record, "a") as f:
            f.write(json.dumps({"sigterm": time.time()}) + "\\n")
        os._exit(143)
    signal.signal(signal.SIGTERM, on_term)
    out = sys.stdout.buffer
    long_line = json.dumps({"step": 0, "note": "x" * 4000}).encode() + b"\\n"
    start = time.time(); step = 0; nan_at = None
    while time.time() - start < 30:
        step += 1
        if step % 50 == 0:
            out.write(long_line if step % 100 == 0 else b'{"step": oops, \\xff\\xfe\\xc3\\x28\\n')
        if nan_at is None and time.time() - start >= flood_s:
            out.flush()
            nan_at = time.time()
            with open(record, "a") as f:
                f.write(json.dumps({"nan_written": nan_at, "lines": step}) + "\\n")
            out.write(b'{"step": %d, "loss": NaN}\\n' % step)
            out.flush()
        out.write(b'{"step": %d, "loss": 2.5, "grad_norm": 1.0}\\n' % step)
        if step % 1000 == 0:
            ahead = start + step / rate - time.time()
            if ahead > 0:
                time.sleep(ahead)
    """
)


def test_a_nan_in_a_flood_stops_the_job_within_a_second_and_memory_stays_bounded(
    tmp_path: Path,
) -> None:
    job, record, log = tmp_path / "job.py", tmp_path / "record", tmp_path / "sentinel.log"
    job.write_text(JOB)
    state = tmp_path / "state"
    with log.open("wb") as stderr:
        sentinel = subprocess.Popen(
            [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
             "--max-restarts", "0", "--", sys.executable, str(job), str(record), str(RATE),
             str(FLOOD_S)],
            stdout=subprocess.DEVNULL, stderr=stderr,
            env=clean_env(),
        )  # fmt: skip
        process = psutil.Process(sentinel.pid)
        peak_rss = 0
        deadline = time.monotonic() + 60
        while sentinel.poll() is None and time.monotonic() < deadline:
            try:
                peak_rss = max(peak_rss, process.memory_info().rss)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        returncode = sentinel.wait(timeout=max(1.0, deadline - time.monotonic()))
    stderr_text = log.read_text(errors="replace")
    events: dict[str, float] = {}
    for line in record.read_text().splitlines():
        events.update(json.loads(line))
    assert "sigterm" in events, stderr_text[-3000:]
    stop_s = events["sigterm"] - events["nan_written"]
    assert stop_s < STOP_WITHIN_S, f"NaN to SIGTERM took {stop_s:.2f} s"
    assert returncode == 143, stderr_text[-3000:]
    assert peak_rss < RSS_LIMIT_BYTES, f"peak RSS {peak_rss / 2**20:.0f} MiB"
    assert "Traceback" not in stderr_text
    # The journal says when the NaN line was read and when the stop was decided.
    alerts = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    nan_alert = next(alert for alert in alerts if alert["rule"] == "nan_inf")
    assert events["nan_written"] - 0.1 <= nan_alert["time"] <= nan_alert["decided_at"]
    assert nan_alert["decided_at"] < events["sigterm"] + 0.1
