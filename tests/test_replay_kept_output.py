"""Replaying what ``run`` kept of an attempt's output says what ``run`` said live.

A Trainer prints its log dicts on stdout and draws its progress bar on stderr; its dicts
carry no step, which the bar gives. ``run`` keeps each stream in a file of its own and both
together, in the order the relay handed them to sentinel (``output.log``): replayed, that
file gives the NaN's step and the decision, where stdout alone gives no step.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.cli import sentinel_here
from tests.helpers.env import clean_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tqdm") is None, reason="needs tqdm (the Trainer's own bar)"
)

NAN_AT = 120

#: The Trainer's two streams: a bar redrawn at every step on stderr, a dict every 10 steps.
JOB = textwrap.dedent(
    f"""
    import sys, time
    from tqdm import tqdm
    bar = tqdm(total=200, file=sys.stderr, mininterval=0, miniters=1)
    for step in range(1, 201):
        bar.update(1)
        if step % 10 == 0:
            loss = float("nan") if step == {NAN_AT} else 2.0 - step / 1000
            print({{"loss": loss, "grad_norm": 1.0, "learning_rate": 1e-4,
                   "epoch": round(step / 200, 2)}}, flush=True)
        time.sleep(0.01)
    """
)


def _nan_steps(output: str) -> list[int | None]:
    alerts = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return [a["step"] for a in alerts if a["rule"] == "nan_inf" and a["severity"] == "critical"]


def test_the_kept_output_replayed_gives_the_step_and_decision_run_made_live(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    state = tmp_path / "state"
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--no-pty", "--state-dir", str(state),
         "--", sys.executable, str(job)],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 90, result.stderr[-3000:]
    live = next(
        json.loads(line)
        for line in (state / "alerts.jsonl").read_text().splitlines()
        if '"nan_inf"' in line
    )
    # The bar's count a dict is paired with comes from another pipe: live, it may be some
    # redraws before or past the dict's own step (within a logging interval, here 10).
    assert live["step"] is not None and abs(live["step"] - NAN_AT) <= 10, live

    [attempt] = (state / "job").glob("*-1")
    alone = sentinel_here("replay", "--json", str(attempt / "stdout.log"))
    assert _nan_steps(alone.stdout) == [None], "the dicts alone name no step"

    both = sentinel_here("replay", "--json", str(attempt / "output.log"))
    [replayed] = _nan_steps(both.stdout)
    # The file has the order the relay sent the lines in; which of its two pipes sentinel
    # read first when both held lines is not recorded: the bar's count replay pairs the dict
    # with is within a logging interval of the truth, as run's is.
    assert replayed is not None and abs(replayed - NAN_AT) <= 10, (replayed, live)
