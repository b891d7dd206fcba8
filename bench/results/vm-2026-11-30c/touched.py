"""Memory a process touches per interval: ``python touched.py PID [SECS] [INTERVAL]``.

Each interval clears the process's referenced bits (``/proc/PID/clear_refs``: 1) and then
sums ``Referenced:`` over its mappings in ``/proc/PID/smaps``: the pages it read or wrote
in that interval, by mapping. On a VM where a page first touched after a sleep costs
microseconds, this is what a turn costs beyond its instructions.
"""

import sys
import time


def clear(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("1")


def referenced(pid: int) -> tuple[int, dict[str, int]]:
    """KiB referenced since the last clear, in all and by mapping."""
    by: dict[str, int] = {}
    mapping = "[anon]"
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            parts = line.split()
            if ":" not in parts[0] and "-" in parts[0]:
                mapping = parts[5].rsplit("/", 1)[-1] if len(parts) > 5 else "[anon]"
            elif parts[0] == "Referenced:":
                by[mapping] = by.get(mapping, 0) + int(parts[1])
    return sum(by.values()), by


def main() -> None:
    pid = int(sys.argv[1])
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    every = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    clear(pid)
    rounds = []
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(every)
        rounds.append(referenced(pid))
        clear(pid)
    rounds.sort(key=lambda found: found[0])
    total, by = rounds[len(rounds) // 2]
    print(
        f"KiB touched per {every}s: median {total} min {rounds[0][0]} max {rounds[-1][0]}"
        f" (pages ~{total // 4})"
    )
    top = sorted(by.items(), key=lambda item: -item[1])[:8]
    print("  by mapping:", ", ".join(f"{name} {kib}" for name, kib in top))


if __name__ == "__main__":
    main()
