"""Evidence before the kill, taken from real stuck jobs: their stacks name where they wait.

Each job is a real child process stuck the way training jobs get stuck; ``take``
reads it with the real py-spy and /proc. Where py-spy cannot read another process
(ptrace not permitted), the test is skipped with the permission that is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sentinel.evidence.capture import EVIDENCE_FILE, Evidence, job_processes, take
from sentinel.evidence.stacks import py_spy_path
from sentinel.rules import DETECTORS

Start = Callable[[str], "subprocess.Popen[bytes]"]

# A job deadlocked on a lock it already holds, in a function that says what it waits for.
DEADLOCK = """
import threading
lock = threading.Lock()
def wait_for_checkpoint_writer():
    with lock:
        print("ready", flush=True)
        lock.acquire()
wait_for_checkpoint_writer()
"""
# A job stuck reading a pipe nobody writes to.
BLOCKING_READ = """
import sys
def read_next_batch():
    print("ready", flush=True)
    return sys.stdin.buffer.read(1)
read_next_batch()
"""
# Two threads: the main one waits for a loader thread that waits forever.
TWO_THREADS = """
import threading
never = threading.Event()
def load_shard():
    never.wait()
def wait_for_loader(loader):
    print("ready", flush=True)
    loader.join()
loader = threading.Thread(target=load_shard, name="shard-loader")
loader.start()
wait_for_loader(loader)
"""

# A training process with a worker process of its own (a data loader's), deadlocked itself.
WITH_A_WORKER = """
import subprocess, sys, threading
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
lock = threading.Lock()
def wait_for_checkpoint_writer():
    with lock:
        print("ready", flush=True)
        lock.acquire()
wait_for_checkpoint_writer()
"""


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start a job from source; it is killed at the end of the test."""
    children: list[subprocess.Popen[bytes]] = []

    def run(source: str) -> subprocess.Popen[bytes]:
        script = tmp_path / f"job{len(children)}.py"
        script.write_text(textwrap.dedent(source))
        child = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        children.append(child)
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        asleep(child.pid)
        return child

    yield run
    for child in children:
        child.kill()
        child.communicate()


def asleep(pid: int) -> None:
    """Wait until the job's main thread sleeps in the kernel: it said "ready" just before."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "S":
            return
        time.sleep(0.01)


def stacks_or_skip(evidence: Evidence) -> Evidence:
    """Skip, naming what is missing, when py-spy could not read the job."""
    for line in evidence.missing:
        if "Python stacks" in line:
            pytest.skip(line)
    return evidence


def test_a_deadlock_names_the_function_it_is_stuck_in(start: Start, tmp_path: Path) -> None:
    job = start(DEADLOCK)
    evidence = stacks_or_skip(take([job.pid], tmp_path / "incident", budget_s=10))
    assert evidence.summary.startswith("stuck in wait_for_checkpoint_writer (job0.py:7)")
    text = (tmp_path / "incident" / EVIDENCE_FILE).read_text()
    assert "wait_for_checkpoint_writer" in text
    # The thread sleeps in the kernel, on the lock's futex.
    assert f"thread {job.pid} (python" in text
    assert "state S, waiting in " in text


def test_a_blocking_read_is_named_and_its_thread_sleeps(start: Start, tmp_path: Path) -> None:
    job = start(BLOCKING_READ)
    evidence = stacks_or_skip(take([job.pid], tmp_path / "incident", budget_s=10))
    assert evidence.summary.startswith("stuck in read_next_batch (job0.py:5)"), evidence.summary
    assert "state S" in evidence.sections["Threads (state, wait channel)"]


def test_two_threads_both_stacks_kept_the_main_one_summed_up(start: Start, tmp_path: Path) -> None:
    job = start(TWO_THREADS)
    evidence = stacks_or_skip(take([job.pid], tmp_path / "incident", budget_s=10))
    stacks = evidence.sections["Python stacks (py-spy dump)"]
    assert '"shard-loader"' in stacks and "load_shard" in stacks
    # The main thread's innermost frame is the standard library's join; the job's own
    # function that called it is named after it.
    assert evidence.summary.startswith("stuck in threading."), evidence.summary
    assert "<- wait_for_loader (job0.py:8)" in evidence.summary
    threads = evidence.sections["Threads (state, wait channel)"]
    assert threads.count("  thread ") == 2


def test_what_cannot_be_taken_is_said_once_with_its_reason(start: Start, tmp_path: Path) -> None:
    job = start(DEADLOCK)
    evidence = take([job.pid], tmp_path / "incident", budget_s=10, find_py_spy=lambda: None)
    stacks = [line for line in evidence.missing if "Python stacks" in line]
    assert stacks == [
        "Python stacks: py-spy is not installed (pip install '.[evidence]' in sentinel's clone,"
        " or 'sentinel_watchdog-0.1.0-py3-none-any.whl[evidence]' from a built wheel)"
    ]
    # The rest is still taken, and the incident's record says what is missing.
    assert f"process {job.pid}:" in evidence.sections["Threads (state, wait channel)"]
    notes = evidence.notes()
    assert len(notes) == 2 and notes[1].startswith("evidence not taken: Python stacks: py-spy")
    if shutil.which("nvidia-smi") is None:
        assert "GPU state: no GPU here (nvidia-smi is not on PATH)" in evidence.missing


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to another user")
def test_ptrace_refused_is_said_as_such(start: Start, tmp_path: Path) -> None:
    """py-spy run as another user than the job's is refused by the kernel (no ptrace)."""
    setpriv, py_spy = shutil.which("setpriv"), py_spy_path()
    if setpriv is None or py_spy is None:
        pytest.skip("needs setpriv (util-linux) and py-spy")
    wrapper = tmp_path / "py-spy-as-nobody"
    wrapper.write_text(
        f'#!/bin/sh\nexec {setpriv} --reuid=65534 --regid=65534 --clear-groups {py_spy} "$@"\n'
    )
    wrapper.chmod(0o755)
    job = start(DEADLOCK)
    evidence = take([job.pid], tmp_path / "incident", budget_s=10, find_py_spy=lambda: str(wrapper))
    assert evidence.summary == ""
    (line,) = [line for line in evidence.missing if "Python stacks" in line]
    assert "ptrace not permitted" in line and "CAP_SYS_PTRACE" in line, line


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to write a file capability")
def test_a_py_spy_the_bounding_set_refuses_is_said_as_such(tmp_path: Path) -> None:
    """The image's py-spy carries cap_sys_ptrace as a file capability; in a container not
    given SYS_PTRACE, exec itself refuses it (EPERM), which the report says in words."""
    setpriv, setcap, py_spy = shutil.which("setpriv"), shutil.which("setcap"), py_spy_path()
    if setpriv is None or setcap is None or py_spy is None:
        pytest.skip("needs setpriv (util-linux), setcap (libcap) and py-spy")
    capable = tmp_path / "py-spy"
    shutil.copy(py_spy, capable)
    if subprocess.run([setcap, "cap_sys_ptrace=ep", str(capable)], check=False).returncode:
        pytest.skip("this filesystem holds no file capabilities")
    said = subprocess.run(
        [setpriv, "--bounding-set=-sys_ptrace", sys.executable, "-c",
         "import os, sys; from sentinel.evidence.stacks import dump;"
         " print(dump(sys.argv[1], os.getpid(), 5).missing)", str(capable)],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    assert said.startswith("py-spy could not start: ptrace not permitted"), said
    assert "SYS_PTRACE" in said, said


def test_only_hangs_crashes_and_gpu_faults_wait_for_evidence() -> None:
    def wanted(rule: str) -> bool:
        return DETECTORS[rule].evidence_before_stop

    assert [wanted(rule) for rule in ("stall", "job_crash", "gpu_health")] == [True] * 3
    assert [wanted(rule) for rule in ("nan_inf", "loss_spike")] == [False] * 2


def test_the_job_tree_and_its_leaves(start: Start) -> None:
    job = start(DEADLOCK)
    pids, leaves = job_processes(os.getpid(), [job.pid])
    assert pids[0] == os.getpid() and job.pid in pids
    assert job.pid in leaves and os.getpid() not in leaves


def test_a_parent_that_works_is_named_beside_its_worker(start: Start, tmp_path: Path) -> None:
    job = start(WITH_A_WORKER)
    pids, leaves = job_processes(job.pid)
    (worker,) = leaves
    try:
        evidence = stacks_or_skip(take(pids, tmp_path / "incident", budget_s=10, leaves=leaves))
    finally:
        os.kill(worker, signal.SIGKILL)
    assert worker != job.pid and pids == [job.pid, worker]
    # The parent does more than wait for its child: its deadlock is named, then the worker's.
    assert evidence.summary.startswith("stuck in wait_for_checkpoint_writer (job0.py:8)")
    assert f"Process {worker}:" in evidence.sections["Python stacks (py-spy dump)"]


@pytest.mark.slow
def test_the_budget_bounds_the_wait_and_says_what_ran_out(start: Start, tmp_path: Path) -> None:
    """A py-spy that never answers costs the stop the budget, no more, and is named."""
    stuck_tool = tmp_path / "py-spy-that-hangs"
    stuck_tool.write_text("#!/bin/sh\nexec sleep 30\n")
    stuck_tool.chmod(0o755)
    job = start(DEADLOCK)
    evidence = take(
        [job.pid], tmp_path / "incident", budget_s=0.5, find_py_spy=lambda: str(stuck_tool)
    )
    assert evidence.took_s < 10  # bounded by the budget (and a loaded machine), not by 30 s
    # Cut by the dump's own timeout or by the wait for it, whichever came first: said once.
    (stacks,) = [line for line in evidence.missing if line.startswith("Python stacks")]
    assert "budget" in stacks, stacks
    # What did not wait for py-spy was taken all the same.
    assert f"process {job.pid}:" in evidence.sections["Threads (state, wait channel)"]
