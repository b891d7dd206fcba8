"""Many ranks, one stream: a real 2-rank `torchrun` job (gloo, CPU) under `sentinel run`.

Its ranks print their loss into one pipe, an order of magnitude apart (``ranks_job.py``).
Read as one series, the alternation was a loss spike; read per rank, nothing is raised but
the NaN that rank 1 alone prints, at its step, naming rank 1 (issue 20.5).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch_needed = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="needs torch: pip install '.[torch]' (CPU build)",
)

pytestmark = [pytest.mark.slow, torch_needed]

JOB = Path(__file__).with_name("ranks_job.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
STEPS, NAN_STEP = 80, 60


def test_two_ranks_an_order_of_magnitude_apart_raise_only_rank_1s_nan(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sentinel = [sys.executable, "-m", "sentinel", "run", "--dry-run", "--state-dir", str(state)]
    done = subprocess.run(
        [*sentinel, "--", *TORCHRUN, str(JOB), str(STEPS), str(NAN_STEP)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    # On a failure, the job's own error lines too (sentinel's timeline fills the tail).
    errors = [line for line in done.stderr.splitlines() if "Error" in line][:20]
    assert done.returncode == 0, "\n".join([*errors, done.stderr[-2000:]])
    # Both ranks really printed into the one stream, an order of magnitude apart.
    last = {
        int(rank): float(loss)
        for rank, loss in re.findall(r"\[rank(\d)\] step 50 \| loss (\S+)", done.stdout)
    }
    assert last[1] > 4 * last[0], done.stdout[-2000:]
    alerts = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    raised = [(alert["rule"], alert["step"]) for alert in alerts if alert["severity"] != "info"]
    assert raised == [("nan_inf", NAN_STEP)], alerts
    (nan,) = [
        alert for alert in alerts if alert["rule"] == "nan_inf" and alert["severity"] != "info"
    ]
    assert nan["message"].startswith("rank 1: loss is nan")
    (report,) = (state / "reports").glob("*.json")
    assert json.loads(report.read_text())["rank"] == 1
