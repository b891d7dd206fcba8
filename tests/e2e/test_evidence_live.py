"""Evidence before the kill, end to end: ``sentinel run`` stops a hung job for a stall, and
its report names where the job was stuck (issue 23.2).

A real job deadlocked on a lock, and a real 2-rank ``torchrun`` job (gloo, CPU) whose rank
1 hangs while rank 0 waits in all_reduce. Where py-spy may not read the job (ptrace not
permitted), the test is skipped with the permission that is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sentinel.evidence import chart

pytestmark = pytest.mark.slow

STALL = {
    "SENTINEL_TICK_INTERVAL_S": "0.05",
    # The launcher's step line every 0.2 s may wait a second and more while torchrun starts
    # two torch imports on a loaded machine: a stall then took the evidence before the
    # ranks existed (CI, 2026-11-30: only the launcher and the agent were there).
    "SENTINEL_RULES__STALL__SOFT_TIMEOUT_S": "2.0",
    "SENTINEL_RULES__STALL__HARD_TIMEOUT_S": "5.0",
    "SENTINEL_RULES__STALL__ADAPTIVE": "false",  # else steps every 0.2 s learn longer ones
    "SENTINEL_PROCESS__INTERVAL_S": "0.2",
    "SENTINEL_EVIDENCE__BUDGET_S": "20",  # a loaded CI machine; a stop takes 3 s by default
    "SENTINEL_EVIDENCE__CHART": "true",  # the suite's default is off (tests/conftest.py)
    "OMP_NUM_THREADS": "1",
}


def run_until_stall(
    state: Path, *command: str, timeout_s: float, env: dict[str, str] | None = None
) -> str:
    """``sentinel run`` the command until the stall stops it; the incident's report."""
    done = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
         "--max-restarts", "0", "--", *command],
        env={**os.environ, **STALL, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )  # fmt: skip
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    (report,) = (state / "reports").glob("*.md")
    data = json.loads(report.with_suffix(".json").read_text())
    assert data["rule"] == "stall", data
    missing = [a["text"] for a in data["actions"] if a["text"].startswith("evidence not taken")]
    if missing and "Python stacks" in missing[0]:
        pytest.skip(missing[0])
    return report.read_text()


def test_a_stall_report_names_the_function_the_job_is_stuck_in(tmp_path: Path) -> None:
    job = tmp_path / "train.py"
    job.write_text(
        textwrap.dedent(
            """
            import threading
            lock = threading.Lock()
            def wait_for_checkpoint_writer():
                with lock:
                    print('{"step": 1, "loss": 2.0}', flush=True)
                    lock.acquire()
            wait_for_checkpoint_writer()
            """
        )
    )
    state = tmp_path / "state"
    report = run_until_stall(state, sys.executable, str(job), timeout_s=120)
    assert "evidence taken before the stop" in report
    assert "stuck in wait_for_checkpoint_writer (train.py:7)" in report
    (folder,) = [path for path in (state / "reports").iterdir() if path.is_dir()]
    evidence = (folder / "evidence.txt").read_text()
    assert '{"step": 1, "loss": 2.0}' in evidence  # the output's last lines
    assert f"- [evidence.txt]({folder.name}/evidence.txt)" in report
    # The chart was drawn before sentinel exited.
    assert (folder / "chart.png").exists() is chart.AVAILABLE


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="needs torch: pip install '.[torch]' (CPU build)",
)
def test_a_rank_hung_while_the_other_waits_names_the_collective(tmp_path: Path) -> None:
    job = Path(__file__).with_name("stuck_ranks_job.py")
    started = {"STUCK_RANKS_STARTED": str(tmp_path / "started")}
    report = run_until_stall(
        tmp_path / "state", sys.executable, str(job), timeout_s=300, env=started
    )
    (line,) = [line for line in report.splitlines() if "evidence taken before the stop" in line]
    # Rank 0 waits in the collective its train_step called; rank 1 sits in its loader.
    assert "stuck in torch.distributed.distributed_c10d.all_reduce" in line, line
    assert "<- train_step (stuck_ranks_job.py:46)" in line, line
    assert "stuck in time.sleep" not in line  # a builtin: py-spy shows the caller
    assert "read_shard (stuck_ranks_job.py:40)" in line, line
