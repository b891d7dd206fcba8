"""A real HF Trainer job under ``sentinel run``, with nothing but its output to read: no
``trainer_state.json`` (nothing is saved), so each printed dict's step comes from its epoch
and the bar redrawn after it (``parsers.hf_steps``), not from the bar drawn before it,
which tqdm leaves up to a logging interval behind (issue 20).

The job (``hf_nan_job.py``) breaks its weights at step 22; the Trainer logs every 4
steps, so the first non-finite value printed is the grad norm of step 24, the next of 28.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None,
        reason="needs torch and transformers: pip install '.[frameworks]'",
    ),
]

JOB = Path(__file__).with_name("hf_nan_job.py")


def test_a_printed_nan_is_raised_at_its_logged_step(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sentinel = [sys.executable, "-m", "sentinel", "run", "--dry-run", "--state-dir", str(state)]
    done = subprocess.run(
        # Its stderr (the bar) into its stdout (the dicts): one stream, in order, as on a
        # terminal or in a `2>&1` log; two pipes reach sentinel in no sure order.
        [*sentinel, "--", "sh", "-c", f'exec "{sys.executable}" "{JOB}" 22 2>&1'],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'grad_norm': 'nan'" in done.stdout and "'epoch': '1.5'" in done.stdout
    assert not list(tmp_path.rglob("trainer_state.json"))  # the output is all there is
    alerts = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    # A NaN grad norm with a finite loss is critical on its second logged value (28); the
    # alert names where it began: both at their logged steps, not where the bar was.
    (nan,) = [alert for alert in alerts if alert["severity"] == "critical"]
    assert (nan["rule"], nan["step"]) == ("nan_inf", 28), alerts
    assert "non-finite since step 24" in nan["message"], nan["message"]
