"""CPU of feeding 100 JSON lines + a NaN line: as one part, as 4 marked parts; warm and after a sleep."""
import json, math, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from sentinel.config.models import Settings
from sentinel.engine.core import Engine, build_detectors
from sentinel.parsing.line_parser import LineParser
engine = Engine(build_detectors(Settings()), LineParser(), data_clock=False)
step = 0
def block(count):
    global step
    out = []
    for _ in range(count):
        step += 1
        out.append(json.dumps({"step": step, "loss": 2.0 + math.sin(step) / 50, "grad_norm": 1.0}))
    return out
now = time.time()
for _ in range(100):
    engine.feed_texts("train.log", block(100), now, ((0, now - 1.0),)); now += 1.0
for gap in (0, 0.25, 1.0):
    for parts in (1, 4, 10):
        took = []
        for _ in range(9):
            lines = block(100)
            marks = tuple((i * 100 // parts, now - 1.0 + i / parts) for i in range(parts))
            if gap: time.sleep(gap)
            t0 = time.thread_time()
            engine.feed_texts("train.log", lines, now, marks)
            took.append(time.thread_time() - t0); now += 1.0
        took.sort()
        print(f"after {gap} s, {parts} parts: {1e6*took[len(took)//2]:.0f} us")
