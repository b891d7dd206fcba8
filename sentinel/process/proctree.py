"""The job's process tree as a source: CPU, memory, states and I/O of the job and its descendants.

Read with psutil on a thread of its own every ``interval_s``. Each reading first
checks that the root is still the job (pid + create time), so a pid the kernel
has handed to another process is never reported as the job. Processes come and
go while a tree is read; one that vanishes mid-read is simply left out.

On Linux the tree is walked through each thread's ``/proc/<pid>/task/<tid>/children``:
a file per thread of the tree, where psutil's ``children()`` reads the stat file of
every process on the machine (milliseconds a reading on a busy node). The kernel does
not promise that list is exact while children exit; neither is a scan of every process
atomic. A process missed once is counted again at the next reading; its CPU time in
between is an underestimate, never a jump.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

import psutil

from sentinel.model.machine import (
    PROC_COUNT,
    PROC_CPU,
    PROC_D_STATE,
    PROC_IO,
    PROC_RSS,
    PROC_ZOMBIES,
    PROCESS_SOURCE,
    OnSamples,
)
from sentinel.model.records import Sample
from sentinel.process.identity import ProcessIdentity

log = logging.getLogger(__name__)

#: What psutil raises for a process that exited, became a zombie, or is not ours to read.
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)

#: CPU times count in clock ticks (10 ms): a rate over a shorter window than this is noise,
#: so a reading that soon after the last one gives none and keeps measuring from that one.
MIN_RATE_WINDOW_S = 0.1

#: A process is told apart from a later one with the same pid by (pid, start time): psutil's
#: ``Process`` compares and hashes so, reading its start time from the process's own stat
#: (``create_time()`` would read /proc/stat for the boot time too: dear on a large host).
_Key = psutil.Process

#: Whether the kernel lists children in /proc (CONFIG_PROC_CHILDREN, Linux 3.5 and later).
PROC_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


@dataclass(frozen=True, slots=True)
class _CpuTimes:
    """CPU seconds of one process: its own, and those of its children it has reaped."""

    own_s: float
    reaped_s: float
    #: Epoch seconds it started, read only for a process the last reading did not see.
    started_s: float | None = None


@dataclass(frozen=True, slots=True)
class _Baseline:
    """What the previous reading saw, for the CPU rate of the next one."""

    cpu: dict[_Key, _CpuTimes]
    monotonic_s: float
    wall_s: float


class ProcessMonitor:
    """Reads the job's process tree every ``interval_s`` and hands the samples to ``on_samples``.

    ``proc_cpu_percent`` is the tree's CPU time between two readings over the wall
    time between them (100 = one core busy), so the first reading of an attempt has
    none. A child that exits between readings still counts once its parent has
    reaped it (its time moves to the parent's ``children_*`` times); one reaped
    outside the tree loses the time since the last reading: an underestimate,
    never a negative or giant value (the rate is capped at every core busy).
    """

    def __init__(self, *, interval_s: float, on_samples: OnSamples) -> None:
        self.interval_s = interval_s
        self.on_samples = on_samples
        #: Wall time of the last reading that found the job (a stuck source shows here).
        self.last_read_at: float | None = None
        self._root: ProcessIdentity | None = None
        #: The root once checked against ``_root``; from then on psutil's identity holds.
        self._root_process: psutil.Process | None = None
        self._pids: frozenset[int] = frozenset()
        self._baseline: _Baseline | None = None
        # Readings may come from the thread and from a caller (tests, a one-off check).
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._max_percent = 100.0 * (psutil.cpu_count() or 1)

    def set_root(self, identity: ProcessIdentity | None) -> None:
        """The job's attempt now running, or None between attempts."""
        with self._lock:
            if identity == self._root:
                return
            self._root = identity
            self._root_process = None
            self._baseline = None
            self._pids = frozenset()

    def pids(self) -> frozenset[int]:
        """The tree's pids as last read (empty when no job is running or it was not found)."""
        return self._pids

    @property
    def running(self) -> bool:
        """Whether the reading thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Read now and then every ``interval_s`` on a daemon thread, until ``stop``."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="proctree", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop reading; returns once the thread has finished. Safe to call twice."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            try:
                samples = self.read_once(now)
                if samples:
                    self.on_samples(PROCESS_SOURCE, samples, now)
            except Exception:
                # A bug here must not leave the job unwatched for the rest of the run.
                log.exception("reading the job's process tree failed")
            self._stop.wait(self.interval_s)

    def read_once(self, now: float) -> list[Sample]:
        """One reading of the tree at wall time ``now``; no samples if the job is not there."""
        with self._lock:
            root = self._root
            if root is None:
                return []
            processes = self._tree(root)
            if processes is None:
                self._pids = frozenset()
                self._baseline = None
                return []
            before = self._baseline
            samples, cpu = _read(processes, {} if before is None else before.cpu)
            monotonic_s = time.monotonic()
            if not processes[0].is_running():
                # The job exited while it was read; its pid may already be another's.
                self._pids = frozenset()
                self._baseline = None
                return []
            if before is None or monotonic_s - before.monotonic_s >= MIN_RATE_WINDOW_S:
                rate = self._cpu_percent(cpu, monotonic_s)
                if rate is not None:
                    samples.insert(0, Sample(PROC_CPU, rate))
                self._baseline = _Baseline(cpu, monotonic_s, now)
            self._pids = frozenset(process.pid for process in processes)
            self.last_read_at = now
            return samples

    def _tree(self, root: ProcessIdentity) -> list[psutil.Process] | None:
        """The root and its descendants, or None if the job is not there (a root found
        earlier is checked by the caller, after the reading)."""
        process = self._root_process
        if process is None:
            try:
                process = psutil.Process(root.pid)
            except _GONE:
                return None
            # Checked after the Process was made, so it cannot be an older holder of the pid.
            if root.liveness() != "same":
                return None
            self._root_process = process
        # Whether the root still runs is asked once, after the reading (``read_once``): a pid
        # taken over by another process meanwhile only costs a reading that is dropped.
        if not PROC_CHILDREN:
            try:
                return [process, *process.children(recursive=True)]
            except _GONE:
                return [process]
        tree = [process]
        for pid in descendant_pids(root.pid):
            try:
                tree.append(psutil.Process(pid))
            except _GONE:
                continue
        return tree

    def _cpu_percent(self, cpu: dict[_Key, _CpuTimes], monotonic_s: float) -> float | None:
        """The tree's CPU since the last reading, percent of one core; None on the first."""
        before = self._baseline
        if before is None:
            return None
        elapsed_s = monotonic_s - before.monotonic_s
        if elapsed_s <= 0:
            return None
        used_s = 0.0
        reaped_growth_s = 0.0
        for key, times in cpu.items():
            previous = before.cpu.get(key)
            if previous is not None:
                used_s += max(0.0, times.own_s - previous.own_s)
                reaped_growth_s += max(0.0, times.reaped_s - previous.reaped_s)
            elif times.started_s is not None and times.started_s >= before.wall_s:
                # Born since the last reading: all of its time is this interval's.
                used_s += times.own_s + times.reaped_s
        # A child that exited since is in its parent's reaped time with its whole life;
        # what the last reading already counted of it is taken back out.
        vanished_s = sum(
            times.own_s + times.reaped_s for key, times in before.cpu.items() if key not in cpu
        )
        used_s += max(0.0, reaped_growth_s - vanished_s)
        percent = 100.0 * used_s / elapsed_s
        return round(min(percent, self._max_percent), 3)


def descendant_pids(pid: int) -> list[int]:
    """The pids below ``pid``, read from /proc (``PROC_CHILDREN``); parents before children."""
    found: list[int] = []
    seen = {pid}
    parents = [pid]
    while parents:
        for child in _children(parents.pop()):
            if child not in seen:  # a pid reused during the walk must not loop it
                seen.add(child)
                found.append(child)
                parents.append(child)
    return found


def _children(pid: int) -> list[int]:
    """``pid``'s children, from each of its threads' list: a child belongs to the thread that
    forked it (none once ``pid`` is gone)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for thread in threads:
        try:
            fd = os.open(f"/proc/{pid}/task/{thread}/children", os.O_RDONLY)
        except OSError:
            continue  # the thread ended
        try:
            data = b""
            while chunk := os.read(fd, 65536):
                data += chunk
        except OSError:
            continue
        finally:
            os.close(fd)
        children.extend(int(field) for field in data.split())
    return children


def _read(
    processes: list[psutil.Process], known: dict[_Key, _CpuTimes]
) -> tuple[list[Sample], dict[_Key, _CpuTimes]]:
    """The samples of one reading (but the CPU rate) and each process's CPU times; the start
    time only of processes not ``known`` from the last reading."""
    rss_bytes = 0
    d_state = zombies = 0
    io_bytes: int | None = None
    cpu: dict[_Key, _CpuTimes] = {}
    counted = 0
    for process in processes:
        try:
            with process.oneshot():
                status = process.status()
                counted += 1
                # A zombie's times are its final ones: kept, so that its last moments count
                # and, once reaped, its parent's growth is matched against them.
                times = process.cpu_times()
                cpu[process] = _CpuTimes(
                    times.user + times.system,
                    getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0),
                    None if process in known else process.create_time(),
                )
                if status == psutil.STATUS_ZOMBIE:
                    # Exited, not yet reaped: it holds no memory and does no I/O.
                    zombies += 1
                    continue
                if status == psutil.STATUS_DISK_SLEEP:
                    d_state += 1
                rss_bytes += process.memory_info().rss
                io = _io_bytes(process)
                if io is not None:
                    io_bytes = io if io_bytes is None else io_bytes + io
        except _GONE:
            continue
    samples = [
        Sample(PROC_RSS, float(rss_bytes)),
        Sample(PROC_COUNT, float(counted)),
        Sample(PROC_D_STATE, float(d_state)),
        Sample(PROC_ZOMBIES, float(zombies)),
    ]
    if io_bytes is not None:
        samples.append(Sample(PROC_IO, float(io_bytes)))
    return samples, cpu


def _io_bytes(process: psutil.Process) -> int | None:
    """Bytes the process read and wrote to storage, where the platform counts them."""
    reader = getattr(process, "io_counters", None)
    if reader is None:  # macOS has no per-process I/O counters
        return None
    try:
        counters = reader()
    except psutil.AccessDenied:
        return None  # another user's process (a setuid helper): skipped, not fatal
    return int(counters.read_bytes + counters.write_bytes)
