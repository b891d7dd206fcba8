"""How fast does ``sentinel run`` stop a job after a NaN reaches its log?

Each trial starts ``sentinel run --log FILE -- JOB`` afresh. JOB is a tiny
Python script whose SIGTERM handler records ``CLOCK_MONOTONIC`` (one clock for
every process on a Linux machine) into a file and exits. Once sentinel shows
the job's "ready" line and has read a few healthy metric lines, the bench
takes the clock and appends one NaN line with a single ``os.write``; the
latency is the handler's time minus that time.

For scale, the same run measures ``tail -F FILE | grep --line-buffered -i nan``
(``-i``: the line says ``NaN``): the write to the moment the bench has read
grep's output line. One pipeline serves every trial; it is measured between
sentinel trials, never while a sentinel runs.

    .venv/bin/python bench/latency.py --trials 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GRACE_S = "5"
#: Healthy lines appended before the NaN, and the pause after them.
HEALTHY_LINES = 3
SETTLE_S = 0.3
TRIAL_TIMEOUT_S = 20.0

JOB = r"""
import os, signal, sys, time

out = sys.argv[1]

def on_term(signum, frame):
    now = time.clock_gettime(time.CLOCK_MONOTONIC)
    with open(out + ".tmp", "w") as f:
        f.write(repr(now))
    os.replace(out + ".tmp", out)
    os._exit(0)

signal.signal(signal.SIGTERM, on_term)
with open(out + ".pid", "w") as f:
    f.write(str(os.getpid()))
print("bench-job-ready", flush=True)
while True:
    time.sleep(3600)
"""


def monotonic() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def metric_line(step: int, grad_norm: str) -> bytes:
    return f'{{"step": {step}, "loss": 2.0, "grad_norm": {grad_norm}}}\n'.encode()


class LineReader:
    """Reads lines from a pipe with a deadline (no buffering beyond what it returns)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def readline(self, timeout_s: float) -> bytes | None:
        deadline = monotonic() + timeout_s
        while b"\n" not in self.buffer:
            remaining = deadline - monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def sentinel_trial(work: Path, index: int, job: Path, verbose: bool) -> float:
    """One sentinel run: seconds from the NaN write to the job's SIGTERM handler."""
    trial = work / f"trial{index:03d}"
    trial.mkdir()
    log, state, term = trial / "train.jsonl", trial / "state", trial / "sigterm_at"
    log.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    env["SENTINEL_JOB__GRACE_PERIOD_S"] = GRACE_S
    argv = [sys.executable, "-m", "sentinel", "run", "--log", str(log), "--state-dir", str(state)]
    argv += ["--max-restarts", "0", *(["-v"] if verbose else [])]
    argv += ["--", sys.executable, str(job), str(term)]
    with open(trial / "sentinel.stderr", "wb") as stderr:
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr
        )
    assert proc.stdout is not None
    try:
        reader = LineReader(proc.stdout.fileno())
        while (line := reader.readline(TRIAL_TIMEOUT_S)) != b"bench-job-ready":
            if line is None:
                raise RuntimeError(f"trial {index}: the job never became ready (see {trial})")
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        try:
            for step in range(1, HEALTHY_LINES + 1):
                os.write(fd, metric_line(step, "1.0"))
                time.sleep(0.02)
            time.sleep(SETTLE_S)
            written_at = monotonic()
            os.write(fd, metric_line(HEALTHY_LINES + 1, "NaN"))
        finally:
            os.close(fd)
        proc.wait(TRIAL_TIMEOUT_S)
        proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            _kill_orphaned_job(Path(f"{term}.pid"))
        proc.stdout.close()
    if not term.exists():
        raise RuntimeError(f"trial {index}: the job got no SIGTERM (see {trial})")
    return float(term.read_text()) - written_at


def _kill_orphaned_job(pid_file: Path) -> None:
    """The job leads its own process group, so killing sentinel leaves it running."""
    with contextlib.suppress(OSError, ValueError):
        os.killpg(int(pid_file.read_text()), signal.SIGKILL)


class TailGrep:
    """A long-lived ``tail -F FILE | grep --line-buffered -i nan``."""

    def __init__(self, work: Path) -> None:
        self.log = work / "tail.jsonl"
        self.log.touch()
        self.tail = subprocess.Popen(
            ["tail", "-F", "-n", "0", str(self.log)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.tail.stdout is not None
        self.grep = subprocess.Popen(
            ["grep", "--line-buffered", "-i", "nan"],
            stdin=self.tail.stdout,
            stdout=subprocess.PIPE,
        )
        self.tail.stdout.close()
        assert self.grep.stdout is not None
        self.reader = LineReader(self.grep.stdout.fileno())
        self.fd = os.open(self.log, os.O_WRONLY | os.O_APPEND)
        # tail -n 0 skips what was there when it started: write until a line comes out.
        for _ in range(50):
            os.write(self.fd, b"warm-up nan\n")
            if self.reader.readline(0.2) is not None:
                break
        else:
            raise RuntimeError("tail -F | grep never printed the warm-up line")
        while self.reader.readline(0.3) is not None:
            pass
        self.step = 0

    def trial(self) -> float:
        for _ in range(HEALTHY_LINES):
            self.step += 1
            os.write(self.fd, metric_line(self.step, "1.0"))
            time.sleep(0.02)
        time.sleep(0.05 + random.random() * 0.05)
        self.step += 1
        line = metric_line(self.step, "NaN")
        written_at = monotonic()
        os.write(self.fd, line)
        got = self.reader.readline(TRIAL_TIMEOUT_S)
        read_at = monotonic()
        if got is None or got + b"\n" != line:
            raise RuntimeError(f"tail -F | grep printed {got!r}, not the NaN line")
        return read_at - written_at

    def close(self) -> None:
        os.close(self.fd)
        for proc in (self.tail, self.grep):
            proc.kill()
            proc.wait()
        assert self.grep.stdout is not None
        self.grep.stdout.close()


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: with n=30, p99 is the largest value."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"{name:<22} p50 {percentile(ms, 50):7.1f} ms, p99 {percentile(ms, 99):7.1f} ms"
        f"   (min {min(ms):.1f}, mean {statistics.fmean(ms):.1f}, max {max(ms):.1f}; n={len(ms)})"
    )


def machine() -> str:
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for row in cpuinfo:
            if row.startswith("model name"):
                model = row.split(":", 1)[1].strip()
                break
    return (
        f"nproc {len(os.sched_getaffinity(0))} ({model or platform.machine()}),"
        f" Python {platform.python_version()}, Linux {platform.release()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30, help="trials of each (default 30)")
    parser.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("-v", "--verbose", action="store_true", help="run sentinel with -v")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    if shutil.which("tail") is None or shutil.which("grep") is None:
        parser.error("tail and grep must be on PATH")

    work = Path(tempfile.mkdtemp(prefix="sentinel-latency-", dir=args.dir))
    job = work / "job.py"
    job.write_text(JOB)
    started = monotonic()
    sentinel_s: list[float] = []
    tail_s: list[float] = []
    pipeline = TailGrep(work)
    try:
        for index in range(args.trials):
            sentinel_s.append(sentinel_trial(work, index, job, args.verbose))
            tail_s.append(pipeline.trial())
            print(
                f"\rtrial {index + 1}/{args.trials}: sentinel {sentinel_s[-1] * 1000:.1f} ms,"
                f" tail|grep {tail_s[-1] * 1000:.1f} ms   ",
                end="",
                file=sys.stderr,
                flush=True,
            )
        print(file=sys.stderr)
    finally:
        pipeline.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print("NaN line written -> job's SIGTERM handler runs (sentinel) / grep's line read (tail)")
    print(summary("sentinel run:", sentinel_s))
    print(summary("tail -F | grep:", tail_s))
    print(f"machine: {machine()}")
    print(f"command: {shlex.join(['python', 'bench/latency.py', *sys.argv[1:]])}")
    print(f"took {monotonic() - started:.0f} s" + (f"; kept {work}" if args.keep else ""))
    if args.json:
        samples = {"sentinel_s": sentinel_s, "tail_grep_s": tail_s, "machine": machine()}
        args.json.write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
