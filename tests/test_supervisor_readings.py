"""``Supervisor``: periodic readings wake nobody, yet reach the engine while the job is silent.

The process tree's readings ride along with the loop's next turn instead of waking it;
with a job that prints nothing, that turn is the next clock tick. The supervisor runs in
this process (its loop on the test's thread), the job is a real child paced by a FIFO.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from sentinel.config import load_settings
from sentinel.model.machine import PROC_COUNT, PROC_RSS
from sentinel.supervisor.core import Supervisor

DEADLINE_S = 20.0


@pytest.mark.slow
def test_process_readings_reach_the_engine_of_a_silent_job(tmp_path: Path) -> None:
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    go = os.open(fifo, os.O_RDWR)  # Linux: never blocks; the job's open finds a writer
    script = tmp_path / "job.py"
    script.write_text(f"open({str(fifo)!r}, 'rb').read(1)\n")  # silent until told to end
    settings = load_settings(
        environ={
            "SENTINEL_STATE_DIR": str(tmp_path / "state"),
            "SENTINEL_JOB__MAX_RESTARTS": "0",
            "SENTINEL_GPU__ENABLED": "false",
            "SENTINEL_PROCESS__INTERVAL_S": "0.05",
            "SENTINEL_TICK_INTERVAL_S": "0.2",
        }
    )
    seen: set[str] = set()

    def watch_the_engine() -> None:
        deadline = time.monotonic() + DEADLINE_S
        try:
            while time.monotonic() < deadline:
                watch = getattr(supervisor, "watch", None)
                history = watch.engine.history if watch is not None else {}
                seen.update(name for name in (PROC_RSS, PROC_COUNT) if name in history)
                if len(seen) == 2:
                    return
                time.sleep(0.01)
        finally:
            os.write(go, b"g")  # the job ends either way

    with (tmp_path / "out").open("wb") as out:
        supervisor = Supervisor(settings, [sys.executable, str(script)], stdout=out, stderr=out)
        watcher = threading.Thread(target=watch_the_engine)
        watcher.start()
        try:
            assert supervisor.run() == 0
        finally:
            watcher.join(DEADLINE_S)
            os.close(go)
    assert seen == {PROC_RSS, PROC_COUNT}
