"""The job of ``cold_nan.sh``: ``python cold_nan_job.py LOG WAIT_S TIMES``.

Appends 100 JSON metric lines a second to LOG for WAIT_S seconds, then one NaN line; writes
to TIMES when the NaN was written and when its SIGTERM handler ran (CLOCK_MONOTONIC).
"""

import json
import math
import os
import signal
import sys
import time

log, wait_s, times = sys.argv[1], float(sys.argv[2]), sys.argv[3]


def note(text: str) -> None:
    with open(times, "a") as out:
        out.write(text + "\n")


def on_term(*_: object) -> None:
    note(f"term {time.clock_gettime(time.CLOCK_MONOTONIC)}")
    os._exit(0)


signal.signal(signal.SIGTERM, on_term)
with open(log, "a", buffering=1) as out:
    start = time.time()
    step = 0
    while time.time() - start < wait_s:
        step += 1
        out.write(json.dumps({"step": step, "loss": 2.0 + math.sin(step) / 50}) + "\n")
        time.sleep(max(0.0, start + step / 100 - time.time()))
    note("nan_soon")
    time.sleep(0.3)
    written = time.clock_gettime(time.CLOCK_MONOTONIC)
    out.write(json.dumps({"step": step + 1, "loss": float("nan")}) + "\n")
    note(f"nan {written}")
    time.sleep(10)
