"""The CPU of the rules' turn on 28 JSON lines (every default rule), back to back and after a
sleep of 1 ms to 1 s: what a turn costs grows with how long the CPU was elsewhere."""

import json
import math
import time

from sentinel.config.models import Settings
from sentinel.engine.core import Engine, build_detectors
from sentinel.parsing.line_parser import LineParser

engine = Engine(build_detectors(Settings()), LineParser(), data_clock=False)
step = 0


def block(count: int) -> list[str]:
    global step
    lines = []
    for _ in range(count):
        step += 1
        record = {"step": step, "loss": 2.0 + math.sin(step) / 50, "grad_norm": 1.0}
        lines.append(json.dumps(record))
    return lines


now = time.time()
for _ in range(200):
    engine.feed_texts("train.log", block(28), now)
    now += 0.28
for gap in (0, 0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 1.0):
    took = []
    for lines in [block(28) for _ in range(12)]:
        if gap:
            time.sleep(gap)
        started = time.thread_time()
        engine.feed_texts("train.log", lines, now)
        took.append(time.thread_time() - started)
        now += 0.28
    took.sort()
    print(f"after {gap} s: the turn on 28 lines {1e6 * took[len(took) // 2]:.0f} us (median of 12)")
