"""The CPU a Python loop takes to touch 16,384 pages (64 MiB), back to back and after a sleep.

On the development VM a page first touched after a sleep cost 3-4 us (a 20 ms sleep: a
fifth of that), against 0.06 us back to back: the host runs others on the core meanwhile.
"""

import time

buf = bytearray(64 << 20)


def touch(stride: int = 4096) -> int:
    total = 0
    for k in range(0, len(buf), stride):
        total += buf[k]
    return total


touch()
for gap in (0, 0.05, 0.25, 1.0, 3.0):
    cpu, wall = [], []
    for _ in range(5):
        if gap:
            time.sleep(gap)
        w, c = time.perf_counter(), time.thread_time()
        touch()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)
    cpu.sort()
    wall.sort()
    print(f"after {gap} s: 16k-page touch cpu {1e3 * cpu[2]:.2f} ms wall {1e3 * wall[2]:.2f} ms")
