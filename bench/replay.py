r"""How fast does ``sentinel replay`` read a long log, and does its memory stay flat?

Two generated logs of ``--lines`` lines (1,000,000 by default) each:

- ``jsonl``: one JSON object a line, ``{"step": 1, "loss": 4.5006, "grad_norm":
  0.9799, "lr": 0.0005, "tokens_per_sec": 14963.3, "time": 1714564800.5}``;
- ``hf``: HF Trainer output as an unbuffered job writes it (the shape of
  ``tests/fixtures/hf/healthy/train.unbuffered.log``): for each logged step tqdm
  redraws its bar twice with ``\r``, blanks it, and the Trainer prints its dict
  ``{'loss': '4.526', 'grad_norm': '1.072', 'learning_rate': '0.0005', 'epoch':
  '3e-06'}``: four lines as replay reads them (a ``\r`` ends a line, as it does
  on a terminal), so 250,000 steps make 1,000,000 lines. Replayed with
  ``parsers.logging_steps = 1``.

Replay is ``sentinel.engine.replay.replay([path], settings)``, what ``sentinel replay
FILE`` runs: with every default rule, and once more with every rule disabled
(``[rules.*] enabled = false``), which leaves the reading, parsing and engine
alone. With orjson installed, the every-rule replay runs with it and again
without it (the child makes ``import orjson`` fail); ``--no-orjson`` runs all
replays without it.

Beside it, in the same run and on the same file, a bare loop:

- ``jsonl``: ``for line in file: json.loads(line)``;
- ``hf``: ``json.loads`` over every ``\r``-separated part of every line, its errors
  caught (bars, blank-outs and the single-quoted dicts are no JSON): the loop the
  target names, and the baseline. Beside it, stricter, ``json.loads(part.replace("'",
  '"'))`` over the dict parts alone (the cheapest decode of the dicts; it skips the
  bars, which replay must read for the step), and ``ast.literal_eval`` of the same
  parts, the obvious way, for scale.

Every figure is the CPU time of a fresh child process (single-threaded, so its
wall time on an idle machine; CPU time is steadier on a shared one). The
``json.loads`` loops run before and after the replays and the faster run is the
baseline. Lines per second are in replay's lines for all, so the ratio is the
ratio of the times. The replay child counts the lines as replay takes them and
notes its peak RSS (``ru_maxrss``) after a quarter, half and all of the log: the
memory as the log grows, from one pass (counting costs about 0.1 us a line).

    .venv/bin/python bench/replay.py                # about 4 minutes on 2 cores
    .venv/bin/python bench/replay.py --lines 100000 --formats jsonl
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import platform
import random
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FORMATS = ("jsonl", "hf")
T0 = 1_714_564_800.0
#: Fractions of the log at which the replay child notes its time and peak RSS.
CHECKPOINTS = (0.25, 0.5, 1.0)

# --- the logs --------------------------------------------------------------------------------

_NOISE_LEN = 4096  # a power of two: indexed with "& (_NOISE_LEN - 1)"
_JSONL = (
    '{"step": %d, "loss": %.4f, "grad_norm": %.4f, "lr": %.4g,'
    ' "tokens_per_sec": %.1f, "time": %.3f}\n'
)
_HF_DICT = "{'loss': '%.4g', 'grad_norm': '%.4g', 'learning_rate': '%.4g', 'epoch': '%.4g'}"
_BAR_WIDTH = 10
_BLOCKS = " ▏▎▍▌▋▊▉"
_BLANK = " " * 47


def _noise(seed: int) -> list[float]:
    """Gaussian noise, drawn once: drawing per line would cost more than writing it."""
    rng = random.Random(seed)
    return [rng.gauss(0.0, 1.0) for _ in range(_NOISE_LEN)]


def jsonl_lines(count: int, seed: int = 1) -> Iterator[str]:
    """A healthy run: loss decaying with noise, steady grad norm and throughput, cosine LR."""
    noise, mask = _noise(seed), _NOISE_LEN - 1
    for step in range(1, count + 1):
        progress = step / count
        yield _JSONL % (
            step,
            2.0 + 2.5 * math.exp(-5 * progress) + 0.02 * noise[step & mask],
            1.0 + 0.05 * noise[(7 * step + 3) & mask],
            0.00025 * (1 + math.cos(math.pi * progress)),
            15000 + 150 * noise[(13 * step + 5) & mask],
            T0 + 0.5 * step + 0.001 * abs(noise[(5 * step + 1) & mask]),
        )


def hf_lines(count: int, seed: int = 1) -> Iterator[str]:
    """The HF Trainer's unbuffered output, one logged step a line (``logging_steps=1``)."""
    noise, mask = _noise(seed), _NOISE_LEN - 1
    previous = _bar(0, count)
    for step in range(1, count + 1):
        progress = step / count
        bar = _bar(step, count)
        logged = _HF_DICT % (
            2.0 + 2.5 * math.exp(-5 * progress) + 0.02 * noise[step & mask],
            1.0 + 0.05 * noise[(7 * step + 3) & mask],
            0.0005 * (1 - progress),
            3 * progress,
        )
        yield f"\r{previous}\r{bar}\r{_BLANK}\r{logged}\n"
        previous = bar


def _bar(step: int, total: int) -> str:
    """tqdm's bar: ``  2%|▎         | 1/40 [00:00<00:34,  1.12it/s]`` (4 steps a second)."""
    eighths = step * _BAR_WIDTH * 8 // total
    full, part = divmod(eighths, 8)
    blocks = "█" * full + (_BLOCKS[part] if full < _BAR_WIDTH else "")
    return (
        f"{100 * step // total:3d}%|{blocks:<{_BAR_WIDTH}}| {step}/{total}"
        f" [{_clock(step // 4)}<{_clock((total - step) // 4)},  4.00it/s]"
    )


def _clock(seconds: int) -> str:
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


GENERATORS: dict[str, Callable[[int], Iterator[str]]] = {"jsonl": jsonl_lines, "hf": hf_lines}
#: Lines replay reads per record: an hf step is two bar redraws, a blank-out and the dict.
LINES_PER_RECORD = {"jsonl": 1, "hf": 4}


def write_log(path: Path, fmt: str, records: int) -> None:
    with path.open("w", encoding="utf-8") as file:
        file.writelines(GENERATORS[fmt](records))


# --- the children: one measurement each, in a fresh process ----------------------------------


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def replay_child(fmt: str, path: Path, lines: int, json_lib: str, rules: str) -> dict[str, Any]:
    """Replay ``path``; CPU time and peak RSS after a quarter, half and all of its lines."""
    if json_lib == "json":
        sys.modules["orjson"] = None  # type: ignore[assignment]  # "import orjson" now fails
    import sentinel.engine.replay
    from sentinel.config import load_settings
    from sentinel.parsing import fields
    from sentinel.rules import DETECTORS

    used = "json" if fields.loads is json.loads else "orjson"
    if used != json_lib:
        raise RuntimeError(f"asked for {json_lib}, sentinel decodes with {used}")
    environ = {"SENTINEL_PARSERS__LOGGING_STEPS": "1"} if fmt == "hf" else {}
    if rules == "none":
        environ |= {f"SENTINEL_RULES__{rule.upper()}__ENABLED": "false" for rule in DETECTORS}
    settings = load_settings(None, environ=environ)
    marks = [max(1, int(lines * fraction)) for fraction in CHECKPOINTS]
    checkpoints: list[dict[str, float]] = []
    iter_replay_batches = sentinel.engine.replay.iter_replay_batches
    counted_lines = 0

    def counted(paths: list[Path]) -> Iterator[tuple[str, list[str]]]:
        """``iter_replay_batches``, noting CPU time and peak RSS as each mark's line goes by
        (at the end of the batch that holds it: a batch is about a megabyte)."""
        nonlocal counted_lines
        for source, batch in iter_replay_batches(paths):
            yield source, batch
            before, counted_lines = counted_lines, counted_lines + len(batch)
            for mark in marks:
                if before < mark <= counted_lines:
                    seconds = time.process_time() - started
                    checkpoints.append(
                        {"lines": mark, "seconds": seconds, "rss_mib": peak_rss_mib()}
                    )

    sentinel.engine.replay.iter_replay_batches = counted  # type: ignore[assignment]
    rss_start = peak_rss_mib()
    started = time.process_time()
    result = sentinel.engine.replay.replay([path], settings)
    seconds = time.process_time() - started
    if result.lines != lines:
        raise RuntimeError(f"replay read {result.lines} lines of {path}, not {lines}")
    return {
        "seconds": seconds,
        "rss_start_mib": rss_start,
        "checkpoints": checkpoints,
        "samples": result.samples,
        "alerts": len(result.alerts),
        "garbled": result.garbled,
    }


def bare_json_loads(path: Path) -> int:
    decoded = 0
    loads = json.loads
    with path.open(encoding="utf-8") as file:
        for line in file:
            loads(line)
            decoded += 1
    return decoded


def bare_json_loads_caught(path: Path) -> int:
    """``json.loads`` on every line, as the issue words it, the errors of non-JSON lines
    caught: on an HF log that is every line (bars, blank-outs and single-quoted dicts)."""
    decoded = 0
    loads = json.loads
    with path.open(encoding="utf-8", newline="\n") as file:
        for line in file:
            for part in line.split("\r"):
                # try/except, not contextlib.suppress: the cheapest way to write the loop.
                try:  # noqa: SIM105
                    loads(part)
                except ValueError:
                    pass
                decoded += 1
    return decoded


def bare_hf_json_loads(path: Path) -> int:
    decoded = 0
    loads = json.loads
    with path.open(encoding="utf-8", newline="\n") as file:
        for line in file:
            for part in line.split("\r"):
                if part.startswith("{'"):
                    loads(part.replace("'", '"'))
                    decoded += 1
    return decoded


def bare_hf_literal_eval(path: Path) -> int:
    decoded = 0
    literal_eval = ast.literal_eval
    with path.open(encoding="utf-8", newline="\n") as file:
        for line in file:
            for part in line.split("\r"):
                if part.startswith("{'"):
                    literal_eval(part)
                    decoded += 1
    return decoded


BARE_LOOPS: dict[str, Callable[[Path], int]] = {
    "json.loads": bare_json_loads,
    "json.loads(every part, errors caught)": bare_json_loads_caught,
    "json.loads(dict parts)": bare_hf_json_loads,
    "ast.literal_eval(dict parts)": bare_hf_literal_eval,
}
#: The bare loops of each format; the first is the baseline the ratios are taken against.
BARE_FOR = {
    "jsonl": ["json.loads"],
    "hf": [
        "json.loads(every part, errors caught)",
        "json.loads(dict parts)",
        "ast.literal_eval(dict parts)",
    ],
}
#: The loops timed before and after the replays, the best run kept (ast.literal_eval,
#: slow and only for scale, runs once).
TWICE = {"json.loads", "json.loads(every part, errors caught)", "json.loads(dict parts)"}
#: The stricter loop a format's replays are also set beside.
STRICTER = {"hf": "json.loads(dict parts)"}


def bare_child(loop: str, path: Path) -> dict[str, Any]:
    started = time.process_time()
    decoded = BARE_LOOPS[loop](path)
    return {"seconds": time.process_time() - started, "decoded": decoded}


def run_child(*args: str) -> dict[str, Any]:
    """``bench/replay.py --child ARGS`` in a fresh interpreter; its JSON result."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


# --- the parent ------------------------------------------------------------------------------


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


def rate(lines: float, seconds: float) -> str:
    return f"{lines / seconds / 1000:.1f}k"


def bench_format(fmt: str, path: Path, lines: int, json_libs: list[str]) -> None:
    """Bare loops, then replays, then the bare loops again; one table."""
    print(f"\n{fmt}: {lines:,} lines, {path.stat().st_size / 2**20:.0f} MiB")
    loops = BARE_FOR[fmt]
    bare: dict[str, list[float]] = {loop: [] for loop in loops}
    for loop in loops:
        bare[loop].append(run_child("bare", loop, str(path))["seconds"])
    runs = [(lib, "all") for lib in json_libs] + [(json_libs[0], "none")]
    replays = {run: run_child("replay", fmt, str(path), str(lines), *run) for run in runs}
    for loop in loops:
        if loop in TWICE:
            bare[loop].append(run_child("bare", loop, str(path))["seconds"])
    baseline = min(bare[loops[0]])
    print(f"  {'':<44} {'lines/s':>8} {'CPU s':>7} {'vs bare':>8}")
    for loop in loops:
        best = min(bare[loop])
        runs_note = " (best of 2)" if len(bare[loop]) > 1 else ""
        print(
            f"  {'bare ' + loop + runs_note:<44} {rate(lines, best):>8} {best:7.2f}"
            f" {baseline / best:7.2f}x"
        )
    for (lib, rules), result in replays.items():
        label = f"sentinel replay, {lib}, {'every rule' if rules == 'all' else 'no rules'}"
        seconds = result["seconds"]
        stricter = ""
        if fmt in STRICTER:
            stricter = f", {min(bare[STRICTER[fmt]]) / seconds:.2f}x the {STRICTER[fmt]} loop"
        print(
            f"  {label:<44} {rate(lines, seconds):>8} {seconds:7.2f} {baseline / seconds:7.2f}x"
            f"   {result['samples']:,} samples, {result['alerts']} alerts,"
            f" {result['garbled']} garbled{stricter}"
        )
        marks = ", ".join(
            f"{mark['lines'] / 1000:.0f}k lines {mark['rss_mib']:.1f} MiB"
            for mark in result["checkpoints"]
        )
        print(f"  {'':<44}   peak RSS: {result['rss_start_mib']:.1f} MiB at start, {marks}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--lines", type=int, default=1_000_000, help="lines per log, as replay reads them (1000000)"
    )
    parser.add_argument("--formats", default=",".join(FORMATS), help="jsonl,hf (both)")
    parser.add_argument("--dir", type=Path, help="work here (default: a temporary directory)")
    parser.add_argument("--no-orjson", action="store_true", help="replay without orjson only")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "replay":
            fmt, path, lines, json_lib, rules = rest
            result = replay_child(fmt, Path(path), int(lines), json_lib, rules)
        else:
            loop, path = rest
            result = bare_child(loop, Path(path))
        print(json.dumps(result))
        return 0
    formats = [fmt for fmt in args.formats.split(",") if fmt]
    if args.lines < 8 or any(fmt not in FORMATS for fmt in formats):
        parser.error(f"--lines must be at least 8 and --formats among {', '.join(FORMATS)}")
    have_orjson = importlib.util.find_spec("orjson") is not None
    json_libs = ["orjson", "json"] if have_orjson and not args.no_orjson else ["json"]

    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="sentinel-replay-", dir=args.dir))
    try:
        for fmt in formats:
            lines = args.lines - args.lines % LINES_PER_RECORD[fmt]
            path = work / f"{fmt}.log"
            write_log(path, fmt, lines // LINES_PER_RECORD[fmt])
            bench_format(fmt, path, lines, json_libs)
            path.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmachine: {machine()}")
    print(f"orjson: {'installed' if have_orjson else 'not installed'}")
    print(f"command: {shlex.join(['python', 'bench/replay.py', *sys.argv[1:]])}")
    print(f"took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
