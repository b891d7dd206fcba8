"""Evidence before the kill: what the job was doing when sentinel decided to stop it.

Before the first signal for a stall, a hang, a crash of one rank while the others
live or a GPU fault, ``take`` collects, in parallel and within a time budget: the
Python stacks of every process of the job (``py-spy``), each thread's state and
wait channel (``/proc``), ``nvidia-smi -q`` and the kernel's NVIDIA XID lines when a
GPU is there, and the last lines of the job's output. What it could not take, it
says once, with the reason; it never raises and never holds the stop past its budget.
A NaN needs no stack: ``wanted`` says no, and the stop goes at once.

Everything goes to ``<state_dir>/reports/<incident>/evidence.txt`` (and a JSON twin),
beside the incident's report, which links it; its summary line names where the main
thread was (``stuck in torch.distributed.distributed_c10d.all_reduce <- train_step
(train.py:88)``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import psutil

from sentinel import install_hint
from sentinel.evidence.stacks import Dump, dump, py_spy_path
from sentinel.process.proctree import descendant_pids
from sentinel.process.relay import STREAM_FILES
from sentinel.process.relayed import JobRecord
from sentinel.store.state import open_private, private_dir

log = logging.getLogger(__name__)

#: The file in the incident's folder, and its JSON twin.
EVIDENCE_FILE = "evidence.txt"
EVIDENCE_JSON = "evidence.json"
#: Lines of output kept from each of the job's output files.
TAIL_LINES = 60
_TAIL_BYTES = 64 * 1024
#: Distinct main-thread stacks the summary names at most.
SUMMARY_STACKS = 4
_XID = re.compile(r"NVRM: Xid", re.IGNORECASE)
_PROCESSES_MAX = 64


def incident_dir(state_dir: Path, incident_id: str) -> Path:
    """The incident's folder, beside its report: evidence, chart."""
    return state_dir / "reports" / incident_id


@dataclass
class Evidence:
    """What was taken, where it is, and what could not be taken and why."""

    folder: Path
    #: Where the main thread was, one line per distinct stack of the job's leaf processes.
    summary: str = ""
    #: What could not be taken, each with its reason.
    missing: list[str] = field(default_factory=list)
    took_s: float = 0.0
    sections: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.folder / EVIDENCE_FILE

    def notes(self) -> list[str]:
        """The incident's record of it: one line, and one for what is missing."""
        where = f"{self.summary}; " if self.summary else ""
        lines = [f"evidence taken before the stop in {self.took_s:.2f} s: {where}{self.path}"]
        if self.missing:
            lines.append("evidence not taken: " + "; ".join(self.missing))
        return lines


def job_processes(root: int, members: Iterable[int] = ()) -> tuple[list[int], list[int]]:
    """The job's live processes (the tree under ``root``, and ``members`` outside it) and
    its leaves, the processes with no child among them (the workers, not their launcher)."""
    found = dict.fromkeys([root, *descendant_pids(root), *members])
    pids = [pid for pid in found if psutil.pid_exists(pid)]
    parents = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            parents.add(psutil.Process(pid).ppid())
    return pids, [pid for pid in pids if pid not in parents]


def output_files(state_dir: Path, pids: Iterable[int], logs: Iterable[str]) -> list[Path]:
    """Where the job's last lines are: the output ``sentinel run`` captured for the running
    attempt (when its record names one of ``pids``), and the logs followed."""
    found: list[Path] = []
    record = JobRecord.load(state_dir)
    if record is not None and {record.job.pid, record.relay.pid} & set(pids):
        found += [record.stream_path(name) for name in STREAM_FILES]
    for pattern in logs:
        found += sorted(Path(path) for path in glob.glob(pattern))[-4:]
    return found


#: The section of the threads' states and kernel wait channels.
_THREADS = "Threads (state, wait channel)"


def take(
    pids: Iterable[int],
    folder: Path,
    *,
    budget_s: float,
    output_files: Iterable[Path] = (),
    leaves: Iterable[int] = (),
    find_py_spy: Callable[[], str | None] = py_spy_path,
) -> Evidence:
    """Collect the evidence of processes ``pids`` into ``folder``, within ``budget_s``.

    ``leaves`` are the processes whose main thread the summary names (the workers,
    not the launcher or the relay above them); all of ``pids`` when empty.
    ``find_py_spy`` says where py-spy is (None: not installed).
    """
    started = time.monotonic()
    deadline = started + budget_s
    pids = list(dict.fromkeys(pids))[:_PROCESSES_MAX]
    evidence = Evidence(folder)
    results: dict[str, Taken] = {}
    named = list(leaves) or pids
    jobs: dict[str, Callable[[], Taken]] = {
        "Python stacks (py-spy dump)": lambda: _stacks(find_py_spy(), pids, named, deadline),
        _THREADS: lambda: Taken(_threads(pids)),
        "GPU (nvidia-smi -q)": lambda: _nvidia_smi(deadline),
        "Kernel NVIDIA XID lines": lambda: _xid_lines(deadline),
        "Last lines of output": lambda: Taken(_tails(output_files)),
    }

    def run(title: str, job: Callable[[], Taken]) -> None:
        try:
            results[title] = job()
        except Exception as error:  # evidence is a bonus: it never costs the stop
            log.exception("evidence: %s failed", title)
            results[title] = Taken("", [f"{title}: failed ({error!r})"])

    # The threads' states first, from /proc (milliseconds): py-spy stops each thread while
    # it reads it, and a state read meanwhile says "t, waiting in ptrace_stop": its doing.
    run(_THREADS, jobs[_THREADS])
    threads = [
        threading.Thread(target=run, args=item, name="evidence", daemon=True)
        for item in jobs.items()
        if item[0] != _THREADS
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    for title in jobs:
        taken = results.get(title)
        if taken is None:
            evidence.missing.append(f"{title}: not done within the {budget_s:g} s budget")
            continue
        evidence.missing += taken.missing
        evidence.summary = evidence.summary or taken.summary
        if taken.text:
            evidence.sections[title] = taken.text
    evidence.took_s = time.monotonic() - started
    _write(evidence)
    return evidence


class Taken(NamedTuple):
    """One kind of evidence: its text, what of it could not be taken, a summary line."""

    text: str
    missing: Sequence[str] = ()
    summary: str = ""


def _stacks(binary: str | None, pids: list[int], leaves: list[int], deadline: float) -> Taken:
    """Every process's dump, in parallel; the summary names each worker's main thread."""
    if binary is None:
        return Taken(
            "",
            [f"Python stacks: py-spy is not installed ({install_hint('evidence')})"],
        )
    dumps: dict[int, Dump] = {}

    def one(pid: int) -> None:
        dumps[pid] = dump(binary, pid, deadline - time.monotonic())

    threads = [threading.Thread(target=one, args=(pid,), daemon=True) for pid in pids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    texts, reasons = [], []
    for pid in pids:
        taken = dumps.get(pid)
        if taken is None:
            reasons.append("py-spy did not finish within the budget")
        elif taken.text:
            texts.append(taken.text.rstrip())
        elif not taken.not_python:
            reasons.append(taken.missing)
    # The workers: the leaves, and a parent that does more than wait for its children (a
    # training process whose data-loader workers are its children).
    named = [pid for pid in pids if pid in dumps and (pid in leaves or not dumps[pid].launcher)]
    summaries = [dumps[pid].summary() for pid in named]
    summary = "; ".join(list(dict.fromkeys(s for s in summaries if s))[:SUMMARY_STACKS])
    missing = [
        f"Python stacks of {count} process(es): {reason}"
        for reason, count in _counted(reasons).items()
    ]
    return Taken("\n\n".join(texts), missing, summary)


def _counted(reasons: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def _threads(pids: list[int]) -> str:
    """Each thread's state letter and kernel wait channel, from /proc."""
    lines = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            tids = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
        except (OSError, ValueError):
            continue  # gone already
        lines.append(f"process {pid}: {command.decode(errors='replace').strip()}")
        for tid in tids:
            task = f"/proc/{pid}/task/{tid}"
            try:
                stat = Path(f"{task}/stat").read_text()
                wchan = Path(f"{task}/wchan").read_text().strip() or "-"
            except OSError:
                continue
            name, _, rest = stat.rpartition(")")
            state = rest.split()[0] if rest.split() else "?"
            comm = name.partition("(")[2]
            lines.append(f"  thread {tid} ({comm}): state {state}, waiting in {wchan}")
    return "\n".join(lines)


def _nvidia_smi(deadline: float) -> Taken:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return Taken("", ["GPU state: no GPU here (nvidia-smi is not on PATH)"])
    text, problem = _run([binary, "-q"], deadline)
    return Taken(text, [f"nvidia-smi -q: {problem}"] if problem else [])


def _xid_lines(deadline: float) -> Taken:
    """The kernel's NVIDIA XID lines (dmesg, else /dev/kmsg); nothing without a GPU driver."""
    if not os.path.exists("/proc/driver/nvidia") and shutil.which("nvidia-smi") is None:
        return Taken("")  # no GPU: said once by the nvidia-smi section
    text, problem = _run(["dmesg"], deadline) if shutil.which("dmesg") else ("", "no dmesg")
    if problem:
        text, kmsg_problem = _read_kmsg()
        if kmsg_problem:
            return Taken(
                "",
                [
                    f"kernel XID lines: the kernel log is not readable (dmesg: {problem};"
                    f" /dev/kmsg: {kmsg_problem}; needs CAP_SYSLOG or kernel.dmesg_restrict 0)"
                ],
            )
    found = [line for line in text.splitlines() if _XID.search(line)]
    return Taken("\n".join(found[-50:]) if found else "no NVIDIA XID line in the kernel log")


def _read_kmsg() -> tuple[str, str]:
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        return "", error.strerror or str(error)
    records: list[str] = []
    try:
        while len(records) < 100_000:
            try:
                records.append(os.read(fd, 8192).decode(errors="replace"))
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
    finally:
        os.close(fd)
    return "".join(records), ""


def _run(argv: list[str], deadline: float) -> tuple[str, str]:
    """A command's output, or why there is none."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=max(0.1, deadline - time.monotonic()),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "", "did not finish within the budget"
    except OSError as error:
        return "", str(error)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return "", said[0] if said else f"exit status {done.returncode}"
    return done.stdout, ""


def _tails(paths: Iterable[Path]) -> str:
    """The last lines of each output file."""
    parts = []
    for path in paths:
        try:
            with open(path, "rb") as file:
                file.seek(max(0, os.fstat(file.fileno()).st_size - _TAIL_BYTES))
                data = file.read()
        except OSError:
            continue
        lines = data.decode(errors="replace").splitlines()[-TAIL_LINES:]
        if lines:
            parts.append(f"--- {path} (last {len(lines)} lines)\n" + "\n".join(lines))
    return "\n\n".join(parts)


def _write(evidence: Evidence) -> None:
    """The text for people and the JSON for tools; a failed write is logged, not raised."""
    head = [
        f"summary: {evidence.summary or 'no Python stack of the main thread'}",
        f"taken in {evidence.took_s:.2f} s",
        *(f"not taken: {line}" for line in evidence.missing),
    ]
    body = [f"== {title} ==\n{text}" for title, text in evidence.sections.items()]
    data = {
        "summary": evidence.summary,
        "missing": evidence.missing,
        "took_s": round(evidence.took_s, 3),
        "sections": sorted(evidence.sections),
    }
    try:
        private_dir(evidence.folder)
        _atomic(evidence.path, "\n".join(head) + "\n\n" + "\n\n".join(body) + "\n")
        _atomic(evidence.folder / EVIDENCE_JSON, json.dumps(data, indent=2) + "\n")
    except OSError as error:
        log.error("evidence: cannot write %s: %s", evidence.folder, error)
        evidence.missing.append(f"cannot write the evidence in {evidence.folder}: {error}")


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(tmp, path)
