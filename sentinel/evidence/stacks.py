"""The Python stacks of a job's processes (``py-spy dump``), and where its main thread was.

``py-spy`` reads another process's memory (ptrace): it needs to be installed (the
``evidence`` extra ships its binary) and allowed (root, ``CAP_SYS_PTRACE``, or
``kernel.yama.ptrace_scope`` 0: at 1 only an ancestor may attach, and py-spy, started by
sentinel, is the job's sibling, not its ancestor). When it cannot, ``Dump.missing`` says
which, in words a person can act on.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

#: The py-spy binary: beside sentinel's Python (the extra's wheel puts it there), else on PATH.
PY_SPY = "py-spy"
#: What py-spy prints when the process is not Python (a shell, the launcher's binary).
_NOT_PYTHON = ("Failed to find python version", "Failed to find a python interpreter")
_NOT_PERMITTED = ("permission denied", "operation not permitted", "eperm", "ptrace")
#: Wrappers that name nothing: a decorator's inner function, a logging shim.
#: Where a launcher's main thread waits for its children.
_LAUNCHERS = ("subprocess.", "torch.distributed.elastic.", "multiprocessing.", "os.wait")
_RELAY = "sentinel/process/relay.py"
_WRAPPERS = {"wrapper", "wrapped", "inner", "_fn", "decorate_context", "_call_impl"}

#: A thread's header; a job that never imported threading has threads with no name.
_THREAD = re.compile(r'^Thread (?:0x[0-9a-fA-F]+|\d+) \((?P<state>[^)]*)\)(?:: "(?P<name>[^"]*)")?')
#: Where a library's files live; what follows is its dotted module path.
_LIBRARIES = (re.compile(r"/(?:site|dist)-packages/"), re.compile(r"/lib/python3\.\d+/"))
_FRAME = re.compile(r"^\s+(?P<function>\S.*?) \((?P<file>[^()]*?):(?P<line>\d+)\)$")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    @property
    def library(self) -> bool:
        """A frame of an installed package or the standard library, not the job's own code."""
        return self.file.startswith("<") or _module_path(self.file) is not None

    def qualified(self) -> str:
        """``torch.distributed.distributed_c10d.all_reduce``; the bare name for the job's code."""
        module = _module_path(self.file)
        name = self.function.rsplit(".", 1)[-1] if "<locals>" in self.function else self.function
        return f"{module}.{name}" if module else name

    def where(self) -> str:
        return f"{self.function} ({os.path.basename(self.file)}:{self.line})"


def _module_path(file: str) -> str | None:
    """The dotted module of a library file (``.../site-packages/torch/distributed/x.py``,
    ``.../lib/python3.11/threading.py``); None for the job's own code."""
    if not file.endswith(".py"):
        return None
    # site-packages first: it lies inside lib/python3.X.
    ends = [[match.end() for match in library.finditer(file)] for library in _LIBRARIES]
    end = next((found[-1] for found in ends if found), None)
    if end is None:
        return None
    parts = file[end : -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or None


@dataclass(frozen=True)
class Dump:
    """One process's ``py-spy dump``: its text, its main thread's frames (innermost first)."""

    pid: int
    text: str
    main_frames: tuple[Frame, ...] = ()
    #: Why there is no stack: not Python, not permitted, py-spy missing or timed out.
    missing: str = ""
    #: Not Python, or ended meanwhile: no stack, and nothing to report missing.
    not_python: bool = False

    @property
    def launcher(self) -> bool:
        """Its main thread waits for its children: a launcher (torchrun's agent, a relay,
        a script that runs another), not a worker."""
        return any(
            frame.qualified().startswith(_LAUNCHERS) or frame.file.endswith(_RELAY)
            for frame in self.main_frames
        )

    def summary(self) -> str:
        """``stuck in torch.distributed.distributed_c10d.all_reduce <- train_step (train.py:88)``:
        the innermost frame of the main thread, and the job's own frame that called it."""
        frames = [f for f in self.main_frames if f.function.rsplit(".", 1)[-1] not in _WRAPPERS]
        if not frames:
            return ""
        innermost = frames[0]
        caller = next((f for f in frames[1:] if not f.library), None)
        said = innermost.qualified() if innermost.library else innermost.where()
        return f"stuck in {said}" + (f" <- {caller.where()}" if caller is not None else "")


def py_spy_path() -> str | None:
    """Where py-spy is: beside this Python first (the ``evidence`` extra), then on PATH."""
    beside = Path(sys.executable).with_name(PY_SPY)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(PY_SPY)


def dump(binary: str, pid: int, timeout_s: float) -> Dump:
    """``py-spy dump --pid``, within ``timeout_s``."""
    try:
        done = subprocess.run(
            [binary, "dump", "--full-filenames", "--pid", str(pid)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=max(0.1, timeout_s),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Dump(pid, "", missing="py-spy did not finish within the budget")
    except OSError as error:
        if error.errno == errno.EPERM:
            # A binary with a file capability (the image's py-spy, cap_sys_ptrace) that the
            # container's bounding set lacks is refused by exec itself.
            return Dump(pid, "", missing=f"py-spy could not start: {not_permitted(str(error))}")
        return Dump(pid, "", missing=f"py-spy could not run: {error}")
    if done.returncode == 0 and done.stdout.strip():
        return Dump(pid, done.stdout, main_frames=main_frames(done.stdout, pid))
    said = (done.stderr or done.stdout).strip()
    first = next((line for line in said.splitlines() if line.strip()), "no output")
    if any(text in said for text in _NOT_PYTHON):
        return Dump(pid, "", missing="not a Python process", not_python=True)
    if not psutil.pid_exists(pid):  # it ended meanwhile: nothing is missing
        return Dump(pid, "", missing="gone", not_python=True)
    if any(text in said.lower() for text in _NOT_PERMITTED):
        return Dump(pid, "", missing=not_permitted(first.partition(":")[0]))
    return Dump(pid, "", missing=f"py-spy failed: {first}")


def not_permitted(said: str) -> str:
    return (
        f"ptrace not permitted ({said.removeprefix('Error: ')}): py-spy needs root, "
        "CAP_SYS_PTRACE (Kubernetes: securityContext.capabilities.add [SYS_PTRACE]), or "
        "kernel.yama.ptrace_scope 0"
    )


def main_frames(text: str, pid: int) -> tuple[Frame, ...]:
    """The main thread's frames in a dump (the thread named MainThread, else the pid's own,
    else the first), innermost first."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append((line, []))
        elif threads and (frame := _FRAME.match(line)):
            threads[-1][1].append(
                Frame(frame["function"], frame["file"].strip(), int(frame["line"]))
            )
    if not threads:
        return ()
    for header, frames in threads:
        if header.endswith('"MainThread"'):
            return tuple(frames)
    for header, frames in threads:
        if header.startswith(f"Thread {pid} "):
            return tuple(frames)
    return tuple(threads[0][1])
