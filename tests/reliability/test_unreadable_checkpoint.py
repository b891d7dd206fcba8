"""A checkpoint sentinel cannot read is named, never trusted: the rollback goes back to the
newest checkpoint it can read, the restart resumes from there, and the incident's actions say
which checkpoint was unreadable. sentinel runs as a root without CAP_DAC_OVERRIDE (a
locked-down pod), so a file of mode 000 is as unreadable to it as another user's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.env import clean_env

pytestmark = pytest.mark.slow

# step_<N> every 5 steps; step_10's weights are written unreadable (mode 000) on the first
# attempt; a NaN at step 14; after the restart it resumes where sentinel says and trains on.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    ckpt, record = Path(sys.argv[1]), Path(sys.argv[2])
    restart = int(os.environ.get("SENTINEL_RESTART") or 0)
    start = int(os.environ.get("SENTINEL_RESUME_STEP") or 0)
    (record / f"attempt-{restart}").write_text(json.dumps({"start": start}))
    for step in range(start + 1, 21):
        if step % 5 == 0:
            (ckpt / f"step_{step}").mkdir(parents=True, exist_ok=True)
            weights = ckpt / f"step_{step}" / "weights.json"
            weights.write_text(json.dumps({"step": step}))
            if step == 10 and restart == 0:
                weights.chmod(0)
        loss = float("nan") if restart == 0 and step == 14 else 2.0 - step / 100
        print(json.dumps({"step": step, "loss": loss}), flush=True)
        if restart == 0 and step == 14:
            time.sleep(60)  # sentinel must stop it
        time.sleep(0.01)
    """
)


def test_an_unreadable_checkpoint_is_passed_over_for_the_newest_readable_one(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run sentinel without CAP_DAC_OVERRIDE")
    state, ckpt, record = tmp_path / "state", tmp_path / "ckpt", tmp_path / "record"
    record.mkdir()
    (tmp_path / "job.py").write_text(JOB)
    env = {
        **clean_env(),
        "SENTINEL_JOB__RESTART_BACKOFF_S": "0.1",
    }
    result = subprocess.run(
        ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
         sys.executable, "-m", "sentinel", "run", "--checkpoints", str(ckpt),
         "--state-dir", str(state), "--max-restarts", "1", "--",
         sys.executable, str(tmp_path / "job.py"), str(ckpt), str(record)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    attempts = [json.loads((record / f"attempt-{n}").read_text()) for n in (0, 1)]
    assert [a["start"] for a in attempts] == [0, 5], "resumed from step_5, not step_10"
    (report,) = (state / "reports").glob("*.json")
    actions = " ".join(a["text"] for a in json.loads(report.read_text())["actions"])
    assert "rolled back to step_5" in actions, actions
    assert "step_10 (unreadable)" in actions, actions
    # Set aside (never deleted), so that nothing resumes from what could not be checked.
    (kept,) = (ckpt / "quarantine").glob("*/step_10")
    assert (kept / "weights.json").stat().st_size > 0
