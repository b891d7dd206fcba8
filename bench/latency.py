"""How fast does sentinel stop a job after a NaN, beside `tail -F | grep && kill`, at what cost?

One run measures, at 10, 100 and 1,000 metric lines a second:

- ``tail|grep``: ``tail -n0 -F LOG | grep -m1 -iE 'nan|inf' && kill -TERM PID``, the shell
  one-liner (the job started by the bench);
- ``run --log``: ``sentinel run --log LOG -- JOB``, the job appending to LOG;
- ``run``: ``sentinel run -- JOB``, the job printing its metrics (read from its stdout);
- ``watch``: ``sentinel watch --pid PID --log LOG``, the job started by the bench;
- ``watch x64``: the same, the job writing each step to 64 files, one per rank
  (``--log 'ranks/rank-*.log'``), its NaN in rank 7's: many files as fast as one? (Not in
  the default set: ``--watchers watch,'watch x64'``.)

Each trial starts the watcher and a job that waits on a FIFO. Once the watcher is ready
(sentinel: ``READY=1`` on the ``$NOTIFY_SOCKET`` the bench listens on; the pipeline: half
a second after it started), the bench says go; the job writes healthy JSON lines at the
rate for 1 to 1.5 s (at random), then one NaN line. It reads ``CLOCK_MONOTONIC`` (one clock
for every process) just before that write and in its SIGTERM handler: the latency is the
difference. Trials of each watcher and rate are interleaved, so a busy spell of a shared
machine falls on all of them alike.

Then the steady overhead at 100 lines a second, in the same run: the CPU time (user +
system) of sentinel and of ``run``'s relay (the job's own not counted) as a percent of one
core, and their RSS, over
``--overhead-s`` seconds after a warm-up, for ``run`` (the job printing) and ``watch`` (the
job appending to a log); then, as baselines in turns with them, that of ``tail|grep`` and
of ``python floor``, a ten-line Python loop that reads the log every 20 ms (sentinel's
look) and looks for a non-finite token: the least any Python watcher with sentinel's
NaN bound pays. On a shared VM the CPU a wake-up costs moves by the minute and from
one VM to the next (a 4 KiB page first touched after a sleep: 0.2 to 4 us); the
baselines measured beside sentinel say what the machine charged then.

    .venv/bin/python bench/latency.py                   # about 6 minutes
    .venv/bin/python bench/latency.py --trials 20 --overhead-s 60
    .venv/bin/python bench/latency.py --trials 0 --rounds 5     # the overhead alone, 5 rounds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import psutil

REPO = Path(__file__).resolve().parent.parent
RATES = (10, 100, 1000)
WATCHERS = ("tail|grep", "run --log", "run", "watch")
#: Watchers run only when named; ``watch x64``'s job writes this many files.
MORE_WATCHERS = ("watch x64",)
RANK_FILES = 64
#: Healthy lines for this long (plus up to half of it, at random) before the NaN.
HEALTHY_S = 1.0
READY_TIMEOUT_S = 30.0
TERM_TIMEOUT_S = 10.0
#: The pipeline has no readiness to wait for: it is given this long to start.
PIPELINE_START_S = 0.5
OVERHEAD_RATE = 100
#: Whose steady overhead is measured, in turns: sentinel's two ways, then two baselines
#: (the shell one-liner and ``FLOOR``) on the same machine a minute apart.
OVERHEAD_WATCHERS = ("run", "watch", "tail|grep", "python floor")
WARM_UP_S = 5.0

JOB = r"""
import json, os, random, signal, sys, time

out, log, go = sys.argv[1], sys.argv[2], sys.argv[5]
rate, healthy_s = float(sys.argv[3]), float(sys.argv[4])

written = None

def on_term(signum, frame):
    now = time.clock_gettime(time.CLOCK_MONOTONIC)
    if written is not None:  # the signal may come before the job noted the write: note it here
        with open(out + ".nan", "w") as f:
            f.write(repr(written))
    with open(out + ".term", "w") as f:
        f.write(repr(now))
    os._exit(143)

signal.signal(signal.SIGTERM, on_term)
with open(out + ".pid", "w") as f:
    f.write(str(os.getpid()))
with open(go, "rb", buffering=0) as f:
    f.read(1)
if log == "-":
    streams = [sys.stdout]
elif log.endswith("/"):  # a folder: one file per rank, the NaN in rank 7's
    streams = [open(f"{log}rank-{rank}.log", "a") for rank in range(int(sys.argv[6]))]
else:
    streams = [open(log, "a")]
stream = streams[min(7, len(streams) - 1)]
rng = random.Random(os.getpid())
start = time.monotonic()
step = 0
while True:
    step += 1
    if time.monotonic() - start >= abs(healthy_s):
        if healthy_s < 0:
            sys.exit(0)
        line = json.dumps({"step": step, "loss": float("nan"), "grad_norm": 1.0}) + "\n"
        written = time.clock_gettime(time.CLOCK_MONOTONIC)
        stream.write(line)
        stream.flush()
        with open(out + ".nan", "w") as f:
            f.write(repr(written))
        time.sleep(60)
        sys.exit(0)
    for each in streams:
        each.write(json.dumps({
            "step": step, "loss": 2.0 + 0.01 * rng.random(),
            "grad_norm": 1.0 + 0.1 * rng.random(), "lr": 3e-4,
            "tokens_per_sec": 15000 + 100 * rng.random(),
        }) + "\n")
        each.flush()
    time.sleep(max(0.0, start + step / rate - time.monotonic()))
"""


#: The floor of any Python watcher of this design: a loop that reads the log every 20 ms
#: (sentinel's ``LOOK_S``: the NaN waits at most that) and looks for a non-finite token.
#: What sentinel costs beyond it is parsing, rules, state and service; what it costs is
#: this machine's price of a wake-up, which moves by the minute on a shared VM.
FLOOR = "python floor"
FLOOR_LOOP = r"""
import os, re, signal, sys, time
fd, job = os.open(sys.argv[1], os.O_RDONLY), int(sys.argv[2])
token = re.compile(rb"\b(?:nan|inf)\b")
while True:
    data = os.read(fd, 1 << 16)
    if data and token.search(data.lower()):
        os.kill(job, signal.SIGTERM)
        sys.exit(0)
    time.sleep(0.02)
"""


def _written(path: Path) -> bool:
    """Whether the job has written ``path`` (it exists and holds a number's text)."""
    try:
        return bool(path.read_text().strip())
    except FileNotFoundError:
        return False


def monotonic() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@dataclass
class Trial:
    """One job and one watcher, in a folder of their own."""

    work: Path
    watcher: str
    rate: float
    healthy_s: float
    #: A config file the sentinel watchers read (``--config``; None: the defaults).
    config: Path | None = None
    notify: socket.socket | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return self.work / "job"

    def start(self) -> None:
        go = self.work / "go"
        os.mkfifo(go)
        # Read-write: opening never blocks, and what is written waits for the job's read.
        self._go_fd = os.open(go, os.O_RDWR)
        log = self.work / "train.jsonl"
        log.touch()
        where = "-" if self.watcher == "run" else str(log)
        if self.watcher == "watch x64":
            (self.work / "ranks").mkdir()
            where = f"{self.work / 'ranks'}/"
            log = self.work / "ranks" / "rank-*.log"
        job = [
            sys.executable,
            str(self.work.parent / "job.py"),
            str(self.out),
            where,
            str(self.rate),
            str(self.healthy_s),
            str(go),
            str(RANK_FILES),
        ]
        state = self.work / "state"
        stderr = (self.work / "watcher.err").open("wb")
        if self.watcher.startswith("run"):
            argv = sentinel_argv("run", state, self.config)
            argv += ["--log", str(log)] if self.watcher == "run --log" else []
            self._spawn([*argv, "--", *job], stderr, notify=True)
        else:
            job_proc = subprocess.Popen(job, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            self.procs.append(job_proc)
            if self.watcher.startswith("watch"):
                argv = [*sentinel_argv("watch", state, self.config), "--pid", str(job_proc.pid)]
                self._spawn([*argv, "--log", str(log)], stderr, notify=True)
            elif self.watcher == FLOOR:
                floor = [sys.executable, "-I", "-c", FLOOR_LOOP, str(log), str(job_proc.pid)]
                self._spawn(floor, stderr, notify=False)
            else:
                pipeline = (
                    f"tail -n0 -F {shlex.quote(str(log))}"
                    " | grep -m1 --line-buffered -iE 'nan|inf' >/dev/null"
                    f" && kill -TERM {job_proc.pid}"
                )
                self._spawn(["sh", "-c", pipeline], stderr, notify=False)
        stderr.close()

    def _spawn(self, argv: list[str], stderr: BinaryIO, *, notify: bool) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
        # Run from the trial's folder, as from a job's own (sentinel looks there for metric
        # files; this project's tree is not the job's), with this tree's sentinel.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        if notify:
            self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            path = str(self.work / "notify")
            self.notify.bind(path)
            env["NOTIFY_SOCKET"] = path
        self.procs.append(
            subprocess.Popen(
                argv,
                cwd=self.work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        )

    def wait_ready(self) -> None:
        if self.notify is None:
            time.sleep(PIPELINE_START_S)
            return
        deadline = monotonic() + READY_TIMEOUT_S
        while monotonic() < deadline:
            self.notify.settimeout(max(0.01, deadline - monotonic()))
            try:
                if b"READY=1" in self.notify.recv(4096):
                    return
            except TimeoutError:
                break
        raise RuntimeError(f"{self.watcher}: no READY=1 within {READY_TIMEOUT_S:g} s ({self.work})")

    def go(self) -> None:
        os.write(self._go_fd, b"g")

    def latency_s(self) -> float | None:
        deadline = monotonic() + self.healthy_s + TERM_TIMEOUT_S
        term, nan = self.out.with_suffix(".term"), self.out.with_suffix(".nan")
        # Each file exists from its open on, empty until its write: wait for the writes.
        while monotonic() < deadline and not (_written(term) and _written(nan)):
            time.sleep(0.05)
        if not (_written(term) and _written(nan)):
            return None
        return float(term.read_text()) - float(nan.read_text())

    def close(self) -> None:
        os.close(self._go_fd)
        # The watcher's session at once (a drain would take seconds a trial), then the job:
        # run's relay outlives sentinel by design and ends once the job has.
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                if proc is self.procs[-1]:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
            proc.wait()
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(self.out.with_suffix(".pid").read_text()), signal.SIGKILL)
        if self.notify is not None:
            self.notify.close()


def sentinel_argv(verb: str, state: Path, config: Path | None) -> list[str]:
    read = ["--config", str(config)] if config is not None else []
    return [sys.executable, "-m", "sentinel", verb, "--state-dir", str(state), *read] + (
        ["--max-restarts", "0"] if verb == "run" else []
    )


def run_trial(work: Path, watcher: str, rate: float, config: Path | None) -> float | None:
    trial = Trial(work, watcher, rate, HEALTHY_S * (1 + random.random() / 2), config)
    work.mkdir()
    try:
        trial.start()
        trial.wait_ready()
        trial.go()
        return trial.latency_s()
    finally:
        trial.close()


@dataclass
class Overhead:
    #: sentinel and its relay (run), then sentinel alone.
    cpu_percent: float
    sentinel_cpu_percent: float
    rss_start: int
    rss_end: int


def overhead(work: Path, watcher: str, seconds: float, config: Path | None) -> Overhead:
    """Sentinel's CPU and RSS while the job writes ``OVERHEAD_RATE`` lines a second."""
    trial = Trial(work, watcher, OVERHEAD_RATE, -(WARM_UP_S + seconds + 5.0), config)
    work.mkdir()
    try:
        trial.start()
        trial.wait_ready()
        trial.go()
        sentinel = psutil.Process(trial.procs[-1].pid)
        time.sleep(WARM_UP_S)
        # run's relay (the job's parent, sentinel's child) is part of what watching costs.
        job_pid = int(trial.out.with_suffix(".pid").read_text())
        ours = [sentinel, *(c for c in sentinel.children(recursive=True) if c.pid != job_pid)]

        def reading() -> tuple[float, list[float], int]:
            cpu_s, rss = [], 0
            for process in ours:
                with process.oneshot():
                    cpu = process.cpu_times()
                    cpu_s.append(cpu.user + cpu.system)
                    rss += process.memory_info().rss
            return monotonic(), cpu_s, rss

        t0, cpu0, rss0 = reading()
        time.sleep(seconds)
        t1, cpu1, rss1 = reading()
        percent = [
            100.0 * (after - before) / (t1 - t0) for before, after in zip(cpu0, cpu1, strict=True)
        ]
        return Overhead(sum(percent), percent[0], rss0, rss1)
    finally:
        trial.close()


def percentile(values: list[float], p: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def machine() -> str:
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for row in cpuinfo:
            if row.startswith("model name"):
                model = row.split(":", 1)[1].strip()
                break
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"nproc {len(os.sched_getaffinity(0))} ({model or platform.machine()}),"
        f" Python {platform.python_version()}, Linux {platform.release()}, load {load}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--trials", type=int, default=10, help="trials of each (default 10; 0: overhead only)"
    )
    parser.add_argument(
        "--rates", type=lambda text: [float(r) for r in text.split(",")], default=list(RATES)
    )
    parser.add_argument("--watchers", type=lambda text: text.split(","), default=list(WATCHERS))
    parser.add_argument(
        "--overhead-s", type=float, default=30.0, help="steady window (0: no overhead)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="overhead windows of each watcher, in turns (the median is the figure; a shared"
        " VM's cost per wake-up moves by the minute)",
    )
    parser.add_argument(
        "--config", type=Path, help="a config file for every sentinel watcher (settings compared)"
    )
    parser.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    args = parser.parse_args()
    config = args.config.resolve() if args.config is not None else None
    unknown = set(args.watchers) - set(WATCHERS) - set(MORE_WATCHERS)
    if unknown or args.trials < 0 or args.rounds < 1:
        parser.error(
            f"--watchers from {', '.join(WATCHERS + MORE_WATCHERS)}; --trials 0 or more;"
            " --rounds 1 or more"
        )
    if shutil.which("tail") is None or shutil.which("grep") is None:
        parser.error("tail and grep must be on PATH")

    work = Path(tempfile.mkdtemp(prefix="sentinel-latency-", dir=args.dir))
    (work / "job.py").write_text(JOB)
    started = monotonic()
    samples: dict[str, dict[str, list[float]]] = {
        w: {f"{r:g}": [] for r in args.rates} for w in args.watchers
    }
    missed: dict[str, int] = {w: 0 for w in args.watchers}
    costs: dict[str, list[Overhead]] = {watcher: [] for watcher in OVERHEAD_WATCHERS}
    try:
        count = 0
        for index in range(args.trials):
            for rate in args.rates:
                for watcher in args.watchers:
                    count += 1
                    folder = work / f"{count:04d}-{watcher.replace(' ', '').replace('|', '-')}"
                    latency = run_trial(folder, watcher, rate, config)
                    if latency is None:
                        missed[watcher] += 1
                        print(f"\nmissed: {watcher} at {rate:g}/s ({folder})", file=sys.stderr)
                    else:
                        samples[watcher][f"{rate:g}"].append(latency * 1000)
                    print(
                        f"\rtrial {index + 1}/{args.trials}, {rate:g} lines/s, {watcher}:"
                        f" {'missed' if latency is None else f'{latency * 1000:.1f} ms'}      ",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )
        print(file=sys.stderr)
        if args.overhead_s > 0:
            for round_ in range(args.rounds):
                for watcher in OVERHEAD_WATCHERS:
                    name = watcher.replace(" ", "-").replace("|", "-")
                    folder = work / f"overhead-{name}-{round_ + 1}"
                    costs[watcher].append(overhead(folder, watcher, args.overhead_s, config))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"NaN line written -> job's SIGTERM handler, ms: p50 / p90 of {args.trials} trials")
    print(f"{'lines/s':>8}" + "".join(f"{w:>20}" for w in args.watchers))
    for rate in args.rates:
        row = f"{rate:>8g}"
        for watcher in args.watchers:
            values = samples[watcher][f"{rate:g}"]
            cell = (
                f"{statistics.median(values):.1f} / {percentile(values, 90):.1f}" if values else "-"
            )
            row += f"{cell:>20}"
        print(row)
    if any(missed.values()):
        print("missed: " + ", ".join(f"{w} {n}" for w, n in missed.items() if n))
    for watcher, rounds in costs.items():
        for cost in rounds:
            print(
                f"steady overhead, {watcher} at {OVERHEAD_RATE} lines/s over"
                f" {args.overhead_s:g} s: {cost.cpu_percent:.2f}% of one core"
                + (
                    f" (sentinel {cost.sentinel_cpu_percent:.2f}%, relay"
                    f" {cost.cpu_percent - cost.sentinel_cpu_percent:.2f}%)"
                    if watcher == "run"
                    else ""
                )
                + f", RSS {cost.rss_start / 2**20:.1f} -> {cost.rss_end / 2**20:.1f} MiB"
            )
        if len(rounds) > 1:
            shares = [cost.cpu_percent for cost in rounds]
            print(
                f"steady overhead, {watcher}: median {statistics.median(shares):.2f}% of one"
                f" core over {len(rounds)} rounds in turns ({min(shares):.2f}-{max(shares):.2f}%)"
            )
    print(f"machine: {machine()}")
    print(f"command: {shlex.join(['python', 'bench/latency.py', *sys.argv[1:]])}")
    print(f"took {monotonic() - started:.0f} s" + (f"; kept {work}" if args.keep else ""))
    if args.json:
        record = {
            "samples_ms": samples,
            "missed": missed,
            "overhead": {w: [vars(c) for c in rounds] for w, rounds in costs.items()},
            "machine": machine(),
        }
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
