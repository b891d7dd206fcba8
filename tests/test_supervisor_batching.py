"""``Supervisor`` with a chatty real job: output gathered into batches, nothing lost or late.

The supervisor runs in this process (its loop on the test's thread), the job is a real
child; the job's stdout and stderr are passed through to real files.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sentinel.config import Settings, load_settings
from sentinel.supervisor.core import Supervisor

DEADLINE_S = 20.0

#: ``steps`` JSON lines 1 ms apart (a hundred and more arrive within one gathering
#: window), the NaN one at ``nan_at`` (0: none), then a line on stderr.
CHATTY = textwrap.dedent(
    """
    import json, sys, time
    steps, nan_at = int(sys.argv[1]), int(sys.argv[2])
    for step in range(1, steps + 1):
        grad_norm = float("nan") if step == nan_at else 1.0
        loss = 2.0 * grad_norm  # a NaN loss: a NaN grad-norm alone may be a skipped fp16 step
        print(json.dumps({"step": step, "loss": loss, "grad_norm": grad_norm}), flush=True)
        time.sleep(0.001)
    print("done", file=sys.stderr, flush=True)
    if nan_at:
        time.sleep(60)  # a real job would go on; sentinel must stop it
    """
)


def settings(tmp_path: Path, **environ: str) -> Settings:
    env = {
        "SENTINEL_STATE_DIR": str(tmp_path / "state"),
        "SENTINEL_JOB__MAX_RESTARTS": "0",
        "SENTINEL_GPU__ENABLED": "false",
        **environ,
    }
    return load_settings(environ=env)


def run(tmp_path: Path, *args: str, **environ: str) -> tuple[int, Supervisor, bytes, bytes]:
    script = tmp_path / "job.py"
    script.write_text(CHATTY)
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        supervisor = Supervisor(
            settings(tmp_path, **environ),
            [sys.executable, str(script), *args],
            stdout=out,
            stderr=err,
        )
        code = supervisor.run()
    return code, supervisor, out_path.read_bytes(), err_path.read_bytes()


def metric_line(step: int, grad_norm: str = "1.0") -> bytes:
    loss = "NaN" if grad_norm == "NaN" else "2.0"
    return f'{{"step": {step}, "loss": {loss}, "grad_norm": {grad_norm}}}\n'.encode()


@pytest.mark.slow
def test_a_chatty_job_is_passed_through_exactly_and_every_line_read(tmp_path: Path) -> None:
    code, supervisor, out, err = run(tmp_path, "400", "0")
    assert code == 0
    # One terminal for both streams: the stderr line follows the stdout lines it came after.
    assert out == b"".join(metric_line(step) for step in range(1, 401)) + b"done\n"
    assert err == b""
    stats = supervisor.watch.engine.parser.stats
    assert (stats.lines, stats.parsed) == (401, 400)


@pytest.mark.slow
def test_a_nan_inside_a_burst_stops_the_job_at_its_step(tmp_path: Path) -> None:
    code, _, out, _ = run(tmp_path, "400", "250", SENTINEL_JOB__GRACE_PERIOD_S="5")
    assert code != 0  # stopped, not finished
    alerts = [
        json.loads(line) for line in (tmp_path / "state" / "alerts.jsonl").read_text().splitlines()
    ]
    critical = [alert for alert in alerts if alert["severity"] == "critical"]
    assert [(alert["rule"], alert["step"]) for alert in critical] == [("nan_inf", 250)]
    assert metric_line(250, "NaN") in out


@pytest.mark.slow
def test_without_logs_to_tail_no_tailer_thread_runs(tmp_path: Path) -> None:
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    go = os.open(fifo, os.O_RDWR)  # Linux: never blocks; the job's open finds a writer
    script = tmp_path / "job.py"
    script.write_text(f"print('ready', flush=True)\nopen({str(fifo)!r}, 'rb').read(1)\n")
    out_path = tmp_path / "out"
    seen: list[str] = []

    def look_once_ready() -> None:
        deadline = time.monotonic() + DEADLINE_S
        while b"ready" not in out_path.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.extend(thread.name for thread in threading.enumerate())
        os.write(go, b"g")

    with out_path.open("wb") as out:
        supervisor = Supervisor(
            settings(tmp_path), [sys.executable, str(script)], stdout=out, stderr=out
        )
        looker = threading.Thread(target=look_once_ready)
        looker.start()
        try:
            assert supervisor.run() == 0
        finally:
            looker.join(DEADLINE_S)
            os.close(go)
    assert "job-stdout" in seen  # it looked while the job ran
    assert not [name for name in seen if "tailer" in name]
