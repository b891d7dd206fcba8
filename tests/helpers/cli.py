"""``sentinel ARGS`` run by the real ``main`` in this process, for the verbs that start nothing.

Starting ``python -m sentinel`` costs about a second of CPU (the interpreter and sentinel's
imports), and the suite started about 220: a third of its CPU, on CI's 2 cores. A verb that
reads and prints (``replay``, ``check-config``, ``checkpoints``, ``status``, ``verdict``
without ``--wait``) runs here as it runs in its own process: the same ``main``, its
arguments, the environment
and working directory given, stdout and stderr captured, the exit status returned. What
``main`` sets for the whole process (logging's handlers, the excepthooks) and the
environment and working directory are put back afterwards. ``run``, ``watch`` and ``demo``
start jobs, threads and signal handlers: their tests start a real process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from sentinel.cli.main import main
from tests.helpers.env import clean_env

#: Verbs that start a job, threads or signal handlers: never in the test's process.
STARTS_THINGS = frozenset({"run", "watch", "demo"})


@contextlib.contextmanager
def main_undone() -> Iterator[None]:
    """Put back, afterwards, what ``main`` sets for the whole process: logging's handlers,
    levels and propagation, and the excepthooks."""
    loggers = [logging.getLogger(), logging.getLogger("sentinel"), logging.getLogger("apprise")]
    saved_logging = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    saved_hooks = (sys.excepthook, threading.excepthook)
    try:
        yield
    finally:
        sys.excepthook, threading.excepthook = saved_hooks
        for logger, handlers, level, propagate in saved_logging:
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


def sentinel_here(
    *args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``sentinel ARGS`` by ``main`` in this process; ``env`` replaces the environment for the
    call (None: this process's), ``cwd`` the working directory."""
    argv = [str(arg) for arg in args]
    verb = next((arg for arg in argv if not arg.startswith("-")), "")
    assert verb not in STARTS_THINGS, f"sentinel {verb} starts things: run it as a process"
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        with main_undone(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse's usage errors and --help
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["sentinel", *argv], code, out.getvalue(), err.getvalue())


def run_job(
    checkpoints: Path,
    state: Path,
    *command: str | Path,
    max_restarts: int = 3,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """``sentinel run`` of ``command`` as a process, with ``checkpoints`` and ``state`` and
    restarts 0.1 s apart (no backoff to wait out), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--checkpoints", str(checkpoints),
         "--state-dir", str(state), "--max-restarts", str(max_restarts),
         "--", *map(str, command)],
        env=clean_env(SENTINEL_JOB__RESTART_BACKOFF_S="0.1"), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
