r"""What does ``sentinel run`` cost the machine it watches: CPU and memory over time?

A job prints 100 JSON metric lines a second (step, loss, grad_norm, lr,
tokens/sec) for ``--seconds`` (60 by default). It runs twice:

- alone: ``python job.py``;
- watched: ``sentinel run --config C -- python job.py``, with the GPU source
  reading 8 GPUs once a second and the process tree once a second. On a
  machine without a GPU the GPUs are ``tests.helpers.nvml.FakeNvml``'s (the
  child swaps it in for pynvml before ``sentinel`` starts); with ``--real-nvml``
  they are the machine's own.

Every second the bench reads, with psutil, the CPU time (user + system) and
RSS of sentinel's own process, of its relay (which holds the job's terminals and
copies its output: sentinel's cost too), and of the job. It prints sentinel's
CPU as a percent of one core over the run and over each third of it, its RSS at
each third and its peak, beside the job's own figures alone and watched (so a
slowdown of the job would show).

    .venv/bin/python bench/overhead.py              # about 2 minutes
    .venv/bin/python bench/overhead.py --seconds 20
    .venv/bin/python bench/overhead.py --no-gpu --no-process --no-rules   # the plumbing alone

``--no-gpu``, ``--no-process`` and ``--no-rules`` turn the GPU source, the process
source or every rule off in sentinel's config, for a breakdown of where its CPU goes;
``--output-batch-s S`` sets ``[tail] batch_s`` (how long sentinel gathers the
job's output; its default otherwise), for the cost of a shorter or longer window.

Targets (issue 4): under 1% of one core and under 60 MB RSS, flat over time.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
LINES_PER_S = 100
GPUS = 8

JOB = r"""
import json, math, random, sys, time

seconds, rate = float(sys.argv[1]), int(sys.argv[2])
rng = random.Random(1)
start = time.monotonic()
step = 0
while True:
    now = time.monotonic()
    if now - start >= seconds:
        break
    step += 1
    print(json.dumps({
        "step": step,
        "loss": 2.0 + 2.0 * math.exp(-step / 2000) + 0.02 * rng.gauss(0, 1),
        "grad_norm": 1.0 + 0.05 * rng.gauss(0, 1),
        "lr": 3e-4,
        "tokens_per_sec": 15000 + 100 * rng.gauss(0, 1),
        "time": time.time(),
    }), flush=True)
    next_at = start + step / rate
    time.sleep(max(0.0, next_at - time.monotonic()))
"""

#: The child that runs ``sentinel`` with a fake pynvml in place of the real one.
SENTINEL_WITH_FAKE_NVML = r"""
import sys
from sentinel.gpu import monitor
from tests.helpers.nvml import FakeNvml

monitor.NVML_FACTORY = lambda: FakeNvml(gpus=int(sys.argv[1]))
from sentinel.cli.main import main

sys.exit(main(sys.argv[2:]))
"""

CONFIG = """
state_dir = "{state_dir}"

[gpu]
interval_s = 1.0

[process]
interval_s = 1.0

[cost]
price_per_gpu_hour = 2.0
"""


@dataclass
class Trace:
    """CPU seconds and RSS of one process, read once a second."""

    times_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)

    def read(self, process: psutil.Process, at_s: float) -> None:
        try:
            with process.oneshot():
                cpu = process.cpu_times()
                rss = process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return
        self.times_s.append(at_s)
        self.cpu_s.append(cpu.user + cpu.system)
        self.rss_bytes.append(rss)

    def core_percent(self, start_s: float, end_s: float) -> float:
        """CPU use between two times, percent of one core (from the readings nearest them)."""
        first = min(range(len(self.times_s)), key=lambda i: abs(self.times_s[i] - start_s))
        last = min(range(len(self.times_s)), key=lambda i: abs(self.times_s[i] - end_s))
        wall = self.times_s[last] - self.times_s[first]
        return 100.0 * (self.cpu_s[last] - self.cpu_s[first]) / wall if wall > 0 else 0.0

    def rss_at(self, at_s: float) -> int:
        index = min(range(len(self.times_s)), key=lambda i: abs(self.times_s[i] - at_s))
        return self.rss_bytes[index]


def find_job(
    sentinel: psutil.Process, job: Path, timeout_s: float = 30.0
) -> tuple[psutil.Process, psutil.Process | None]:
    """The process running the job script ``job``, and the relay that holds it (None where
    sentinel is its parent). ``run`` starts the job under its relay, which outlives
    sentinel (``sentinel.process.relay``): the job is looked for among sentinel's
    descendants, then among every process."""
    deadline = time.monotonic() + timeout_s
    wanted = str(job)
    while time.monotonic() < deadline:
        try:
            candidates = [*sentinel.children(recursive=True), *psutil.process_iter()]
        except psutil.NoSuchProcess:
            break
        for process in candidates:
            try:
                if wanted not in process.cmdline()[1:2]:
                    continue
                parent = process.parent()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            relay = parent if parent is not None and parent.pid != sentinel.pid else None
            return process, relay
        time.sleep(0.05)
    raise RuntimeError("sentinel did not start the job")


def trace(processes: dict[str, psutil.Process], popen: subprocess.Popen[bytes]) -> dict[str, Trace]:
    """Read the processes once a second until ``popen`` exits."""
    traces = {name: Trace() for name in processes}
    start = time.monotonic()
    while popen.poll() is None:
        at_s = time.monotonic() - start
        for name, process in processes.items():
            traces[name].read(process, at_s)
        time.sleep(1.0 - (time.monotonic() - start) % 1.0)
    return traces


def run_alone(job: Path, seconds: float) -> Trace:
    popen = subprocess.Popen(
        [sys.executable, str(job), str(seconds), str(LINES_PER_S)], stdout=subprocess.DEVNULL
    )
    return trace({"job": psutil.Process(popen.pid)}, popen)["job"]


def config_text(
    state_dir: Path, *, gpu: bool, process: bool, rules: bool, output_batch_s: float | None = None
) -> str:
    """sentinel's config: the bench's, with the sources or rules turned off as asked."""
    from sentinel.rules import DETECTORS

    text = CONFIG.format(state_dir=state_dir)
    if output_batch_s is not None:
        text += f"\n[tail]\nbatch_s = {output_batch_s}\n"
    if not gpu:
        text = text.replace("[gpu]\ninterval_s = 1.0\n", "[gpu]\nenabled = false\n")
    if not process:
        text = text.replace("[process]\ninterval_s = 1.0\n", "[process]\nenabled = false\n")
    if not rules:
        text += "".join(f"\n[rules.{rule}]\nenabled = false\n" for rule in DETECTORS)
    return text


def run_watched(
    job: Path, seconds: float, work: Path, real_nvml: bool, config_body: str
) -> dict[str, Trace]:
    config = work / "sentinel.toml"
    config.write_text(config_body, encoding="utf-8")
    args = ["run", "--config", str(config), "--", sys.executable, str(job)]
    args += [str(seconds), str(LINES_PER_S)]
    if real_nvml:
        argv = [sys.executable, "-m", "sentinel", *args]
    else:
        argv = [sys.executable, "-c", SENTINEL_WITH_FAKE_NVML, str(GPUS), *args]
    popen = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=(work / "sentinel.err").open("wb")
    )
    sentinel = psutil.Process(popen.pid)
    job_process, relay = find_job(sentinel, job)
    watched = {"sentinel": sentinel, "job": job_process}
    if relay is not None:
        watched["relay"] = relay
    traces = trace(watched, popen)
    if popen.returncode != 0:
        sys.stderr.write((work / "sentinel.err").read_text(encoding="utf-8")[-3000:])
        raise RuntimeError(f"sentinel exited {popen.returncode}")
    return traces


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def report(seconds: float, alone: Trace, watched: dict[str, Trace], real_nvml: bool) -> None:
    sentinel, job = watched["sentinel"], watched["job"]
    end = min(seconds, sentinel.times_s[-1])
    thirds = [(end * k / 3, end * (k + 1) / 3) for k in range(3)]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs,")
    print(f"  Python {platform.python_version()}, psutil {psutil.__version__}")
    gpus = "the machine's GPUs (real NVML)" if real_nvml else f"{GPUS} fake GPUs (FakeNvml)"
    print(f"job: {LINES_PER_S} JSON lines/s for {seconds:g} s; GPU source at 1 Hz on {gpus}")
    print()
    print(f"{'':24}{'CPU, % of one core':>22}{'RSS peak':>14}")
    print(f"{'job alone':24}{alone.core_percent(0, end):>21.2f}%{mib(max(alone.rss_bytes)):>14}")
    print(f"{'job, watched':24}{job.core_percent(0, end):>21.2f}%{mib(max(job.rss_bytes)):>14}")
    print(
        f"{'sentinel (itself)':24}{sentinel.core_percent(0, end):>21.2f}%"
        f"{mib(max(sentinel.rss_bytes)):>14}"
    )
    relay = watched.get("relay")
    if relay is not None:
        print(
            f"{'its relay':24}{relay.core_percent(0, end):>21.2f}%{mib(max(relay.rss_bytes)):>14}"
        )
        both = sentinel.core_percent(0, end) + relay.core_percent(0, end)
        print(f"{'sentinel + relay':24}{both:>21.2f}%")
    print()
    print("sentinel over time:")
    for start_s, end_s in thirds:
        print(
            f"  {start_s:5.0f}-{end_s:3.0f} s: CPU {sentinel.core_percent(start_s, end_s):5.2f}%"
            f" of one core, RSS at end {mib(sentinel.rss_at(end_s))}"
        )
    cpu_s = sentinel.cpu_s[-1] - sentinel.cpu_s[0]
    print(f"sentinel CPU seconds over the run: {cpu_s:.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the job runs")
    parser.add_argument("--real-nvml", action="store_true", help="read the machine's own GPUs")
    parser.add_argument("--no-gpu", action="store_true", help="sentinel without the GPU source")
    parser.add_argument(
        "--no-process", action="store_true", help="sentinel without the process-tree source"
    )
    parser.add_argument("--no-rules", action="store_true", help="sentinel with every rule off")
    parser.add_argument(
        "--output-batch-s",
        type=float,
        default=None,
        help="sentinel's [tail] batch_s (default: sentinel's own default)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sentinel-overhead-") as tmp:
        work = Path(tmp)
        job = work / "job.py"
        job.write_text(JOB, encoding="utf-8")
        on = {"gpu": not args.no_gpu, "process": not args.no_process, "rules": not args.no_rules}
        config = config_text(work / "state", **on, output_batch_s=args.output_batch_s)
        alone = run_alone(job, args.seconds)
        watched = run_watched(job, args.seconds, work, args.real_nvml, config)
    report(args.seconds, alone, watched, args.real_nvml)
    off = [name for name, flag in (("GPU", args.no_gpu), ("process", args.no_process)) if flag]
    if args.no_rules:
        off.append("every rule")
    if off:
        print(f"turned off in sentinel: {', '.join(off)}")
    if args.output_batch_s is not None:
        print(f"sentinel's [tail] batch_s = {args.output_batch_s:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
