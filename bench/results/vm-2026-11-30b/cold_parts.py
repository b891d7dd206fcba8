"""The CPU of the rules' turn on 100 JSON lines (every default rule), fed as one part or as
4 or 10 marked parts, back to back and after a sleep of 0.25 s and 1 s: what the parts of
``Engine.feed_texts``'s marks cost, warm and cold."""

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
for _ in range(100):
    engine.feed_texts("train.log", block(100), now, ((0, now - 1.0),))
    now += 1.0
for gap in (0, 0.25, 1.0):
    for parts in (1, 4, 10):
        took = []
        for _ in range(9):
            lines = block(100)
            marks = tuple((i * 100 // parts, now - 1.0 + i / parts) for i in range(parts))
            if gap:
                time.sleep(gap)
            started = time.thread_time()
            engine.feed_texts("train.log", lines, now, marks)
            took.append(time.thread_time() - started)
            now += 1.0
        took.sort()
        print(f"after {gap} s, {parts} parts: {1e6 * took[len(took) // 2]:.0f} us")
