"""A log flood: does ``sentinel run`` keep up, stay small, not slow the job, and still stop it?

The job prints JSON metric lines as fast as it can for ``--seconds`` (optionally with long or
invalid lines mixed in), then one NaN line, then keeps printing. The same job runs alone first
(its lines/s is the baseline), then under ``sentinel run``. Printed, one JSON object:
the job's lines/s alone and watched (and the slowdown), the time from the NaN's write to the
job's SIGTERM, sentinel's peak RSS (and its RSS at the end of each second, to see that it stays
flat), and the lines it skipped to keep up (``sentinel status``).

    python bench/flood.py --seconds 5 --rate 200000 [--mixed] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

from sentinel.service.status import gather

JOB = textwrap.dedent(
    """
    import json, os, signal, sys, time
    seconds, out, mixed = float(sys.argv[1]), sys.argv[2], sys.argv[3] == "mixed"
    rate = float(sys.argv[4])  # lines a second; 0: as fast as it can
    def on_term(signum, frame):
        with open(out, "a") as f:
            f.write(json.dumps({"sigterm": time.time()}) + "\\n")
        os._exit(143)
    signal.signal(signal.SIGTERM, on_term)
    write = sys.stdout.write
    long_line = json.dumps({"step": 0, "note": "x" * 4000})
    start = time.time(); step = 0; nan_at = None
    while True:
        step += 1
        if mixed and step % 50 == 0:
            write(long_line + "\\n" if step % 100 == 0 else '{"step": oops, "loss"\\n')
        if nan_at is None and time.time() - start >= seconds:
            sys.stdout.flush()
            nan_at = time.time()
            with open(out, "a") as f:
                f.write(json.dumps({"nan_written": nan_at, "lines": step}) + "\\n")
            write(json.dumps({"step": step, "loss": float("nan")}) + "\\n")
            sys.stdout.flush()
            if out.endswith("alone"):
                os._exit(0)
        write('{"step": %d, "loss": 2.5, "grad_norm": 1.0}\\n' % step)
        if rate and step % 1000 == 0:
            ahead = start + step / rate - time.time()
            if ahead > 0:
                time.sleep(ahead)
        if nan_at is not None and time.time() - nan_at > 10:
            os._exit(0)
    """
)


def _events(path: Path) -> dict[str, float]:
    merged: dict[str, float] = {}
    for line in path.read_text().splitlines():
        merged.update(json.loads(line))
    return merged


def run_once(args: argparse.Namespace) -> dict[str, object]:
    """One run of the job alone, then one under ``sentinel run``: the figures."""
    mode = "mixed" if args.mixed else "plain"
    work = Path(tempfile.mkdtemp(prefix="flood-"))
    job = work / "job.py"
    job.write_text(JOB)

    alone = work / "alone"
    subprocess.run(
        [sys.executable, str(job), str(args.seconds), str(alone), mode, str(args.rate)],
        stdout=subprocess.DEVNULL, check=False, timeout=120,
    )  # fmt: skip
    baseline = _events(alone)["lines"] / args.seconds

    watched = work / "watched"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    log = work / "sentinel.log"  # a file, not a pipe nobody reads while it runs
    with log.open("wb") as stderr:
        sentinel = subprocess.Popen(
            [sys.executable, "-m", "sentinel", "run", "--state-dir", str(work / "state"),
             "--max-restarts", "0", "--", sys.executable, str(job), str(args.seconds),
             str(watched), mode, str(args.rate)],
            stdout=subprocess.DEVNULL, stderr=stderr, env=env,
        )  # fmt: skip
    process = psutil.Process(sentinel.pid)
    peak_rss = 0
    by_second: list[float] = []
    started = time.monotonic()
    while sentinel.poll() is None:
        try:
            rss = process.memory_info().rss
        except psutil.NoSuchProcess:
            break
        peak_rss = max(peak_rss, rss)
        if time.monotonic() - started >= len(by_second) + 1:
            by_second.append(round(rss / 2**20))
        time.sleep(0.05)
    sentinel.wait()
    err = log.read_text(errors="replace")
    events = _events(watched)
    rate = events["lines"] / args.seconds
    nan_at = events["nan_written"]
    stop_ms = (events["sigterm"] - nan_at) * 1000 if "sigterm" in events else None
    journal = work / "state" / "alerts.jsonl"
    alerts = [json.loads(line) for line in journal.read_text().splitlines()]
    nan = next((alert for alert in alerts if alert["rule"] == "nan_inf"), {})
    return {
        "mode": mode,
        "rate_asked": args.rate,
        "job_lines_per_s_alone": round(baseline),
        "job_lines_per_s_watched": round(rate),
        "slowdown": round(1 - rate / baseline, 3),
        "nan_to_sigterm_ms": None if stop_ms is None else round(stop_ms, 1),
        # From the journal: when the NaN's line was read, and when the stop was decided.
        "nan_read_ms": round((nan["time"] - nan_at) * 1000, 1) if nan else None,
        "nan_decided_ms": round((nan["decided_at"] - nan_at) * 1000, 1) if nan else None,
        "sentinel_peak_rss_mib": round(peak_rss / 2**20, 1),
        "sentinel_rss_mib_by_second": by_second,
        "lines_skipped": gather(work / "state").job.lines_skipped,
        "sentinel_said_behind": "faster than it can be read" in err,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="flood before the NaN")
    parser.add_argument("--mixed", action="store_true", help="long and invalid lines mixed in")
    parser.add_argument(
        "--rate", type=float, default=200_000, help="lines a second the job aims at (0: flat out)"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs, one JSON object each")
    args = parser.parse_args()
    for _ in range(args.runs):
        print(json.dumps(run_once(args)), flush=True)


if __name__ == "__main__":
    main()
