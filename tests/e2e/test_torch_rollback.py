"""Rollback for every PyTorch user: a real DDP job (gloo) under `sentinel run`.

For two ways plain scripts save (HF-like folder names holding a ``model.pt``, one ``ckpt.pt``
rewritten in place), the job goes NaN right after a save; every rank must resume from the last
clean step, the clean checkpoints stay where they were, the poisoned one is set aside and not
deleted, and no rank outlives the stop. (``model_step<N>.pt`` files, a third way, are set aside,
kept and put back in ``tests/actions/test_keep_rotation.py``; their resume is the folders'.)

The first layout runs as two ranks under ``torchrun``; the other as one process (a process
group of one, started by ``python`` itself): what they test is how each layout is set aside and
resumed from, the same for one rank or many, and a two-rank attempt costs three torch imports
(the agent and each rank) against one, about 20 s of CPU per test (CI's time).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

# torch is imported by the test, not at collection: the fast loop does not pay for it.
torch_needed = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="needs torch: pip install '.[torch]' (CPU build)",
)

pytestmark = [pytest.mark.slow, torch_needed]

JOB = Path(__file__).with_name("ddp_job.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _sentinel(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "run", *args],
        env={**os.environ, "SENTINEL_JOB__RESTART_BACKOFF_S": "0.1", **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _torch_step(path: Path) -> int:
    import torch

    return int(torch.load(path, weights_only=True)["step"])


@pytest.mark.parametrize(
    ("layout", "ranks", "resume_arg", "clean", "poisoned"),
    [
        pytest.param(
            "hf-names",
            2,
            "{checkpoint}/model.pt",
            ["checkpoint-20", "checkpoint-40"],
            "checkpoint-60",
            id="checkpoint-N-folders-2-ranks",
        ),
        pytest.param(
            "one-file", 1, "{checkpoint}", ["ckpt.pt"], "ckpt.pt", id="one-file-in-place-1-rank"
        ),
    ],
)
def test_a_ddp_job_that_goes_nan_after_a_save_resumes_every_rank_from_its_last_clean_step(
    layout: str, ranks: int, resume_arg: str, clean: list[str], poisoned: str, tmp_path: Path
) -> None:
    ckpt, state, record = tmp_path / "ckpt", tmp_path / "state", tmp_path / "record.jsonl"
    ckpt.mkdir()
    job_args = [str(JOB), layout, str(ckpt), str(record)]
    launcher = TORCHRUN if ranks == 2 else [sys.executable]
    resume = " ".join(["env", f"RESUME_FROM={resume_arg}", *launcher, *job_args])
    # A kept version of the file rewritten in place must settle (0.5 s unchanged here, at
    # looks every 0.25 s) before the next save, 20 steps on, rewrites it.
    step_s = "0.08" if layout == "one-file" else "0.05"
    result = _sentinel(
        "--checkpoints", str(ckpt), "--state-dir", str(state), "--max-restarts", "2",
        "--resume-command", resume, "--", *launcher, *job_args,
        env={
            "SENTINEL_JOB__GRACE_PERIOD_S": "10",
            "DDP_STEP_S": step_s,
            "SENTINEL_KEEP__SETTLE_S": "0.5",
            "SENTINEL_TICK_INTERVAL_S": "0.25",
        },
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]

    records = _records(record)
    first = [r for r in records if r["event"] == "start" and r["restart"] == 0]
    resumed = [r for r in records if r["event"] == "start" and r["restart"] == 1]
    finished = [r for r in records if r["event"] == "finished"]
    every_rank = list(range(ranks))
    assert sorted(r["rank"] for r in first) == every_rank
    assert sorted(r["rank"] for r in resumed) == every_rank, "every rank restarted"
    assert {r["start"] for r in resumed} == {40}, "every rank resumed from the last clean step"
    assert sorted(r["rank"] for r in finished if r["restart"] == 1) == every_rank
    assert not any(psutil.pid_exists(r["pid"]) for r in first), "no rank outlived the stop"

    alerts = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    assert any(a["rule"] == "nan_inf" and a["step"] == 60 for a in alerts)

    quarantined = [p for p in (ckpt / "quarantine").rglob("*.pt") if poisoned in p.parts]
    assert quarantined, "the poisoned checkpoint was set aside, not deleted"
    assert {_torch_step(p) for p in quarantined} == {60}
    for name in clean if layout != "one-file" else []:
        assert (ckpt / name).exists(), f"{name} stayed where it was"
    # The restarted job saved again where it always does, from the clean state on.
    from tests.e2e.ddp_job import checkpoint_path

    assert _torch_step(checkpoint_path(layout, ckpt, 80)) == 80
    assert resumed[0]["resume_from"].startswith(str(ckpt.resolve()))
