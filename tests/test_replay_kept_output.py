"""Replaying what ``run`` kept of an attempt's output says what ``run`` said live.

A Trainer prints its log dicts on stdout (``tqdm.write``) and draws its progress bar on
stderr; its dicts carry no step, which the bar redrawn right after each gives. ``run``
gives the job one terminal for both streams, as a shell does: they reach sentinel, and
``output.log``, in the order written, and live and replayed name the NaN's own step. With
``--no-pty`` the streams are two pipes whose order is lost: stdout alone names no step,
the file of both (in the order the relay sent them) the step of a bar near the dict.
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

#: The Trainer's two streams: a bar redrawn at every step on stderr, a dict every 10 steps
#: written as its ``ProgressCallback.on_log`` does (``training_bar.write(str(logs))``).
JOB = textwrap.dedent(
    f"""
    import sys, time
    from tqdm import tqdm
    bar = tqdm(total=200, file=sys.stderr, mininterval=0, miniters=1)
    for step in range(1, 201):
        bar.update(1)
        if step % 10 == 0:
            loss = float("nan") if step == {NAN_AT} else 2.0 - step / 1000
            bar.write(str({{"loss": loss, "grad_norm": 1.0, "learning_rate": 1e-4,
                           "epoch": round(step / 200, 2)}}))
        time.sleep(0.01)
    """
)


def _nan_steps(output: str) -> list[int | None]:
    alerts = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return [a["step"] for a in alerts if a["rule"] == "nan_inf" and a["severity"] == "critical"]


def _run(tmp_path: Path, *options: str) -> Path:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    state = tmp_path / "state"
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", *options, "--state-dir", str(state),
         "--", sys.executable, str(job)],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 90, result.stderr[-3000:]
    return state


def _live(state: Path) -> dict[str, object]:
    return next(
        json.loads(line)
        for line in (state / "alerts.jsonl").read_text().splitlines()
        if '"nan_inf"' in line
    )


def test_the_kept_output_replayed_gives_the_step_and_decision_run_made_live(
    tmp_path: Path,
) -> None:
    state = _run(tmp_path)
    live = _live(state)
    assert live["step"] == NAN_AT, live

    [attempt] = (state / "job").glob("*-1")
    both = sentinel_here("replay", "--json", str(attempt / "output.log"))
    [replayed] = [
        json.loads(line)
        for line in both.stdout.splitlines()
        if line.startswith("{") and '"nan_inf"' in line and '"critical"' in line
    ]
    assert replayed["step"] == NAN_AT
    assert replayed["diagnosis"]["cause"] == live["diagnosis"]["cause"]  # type: ignore[index]
    # One terminal: the output is kept once (output.log is stdout.log's other name).
    assert (attempt / "output.log").samefile(attempt / "stdout.log")
    assert (attempt / "stderr.log").stat().st_size == 0


def test_with_pipes_the_streams_order_is_lost_and_the_file_of_both_still_gives_a_step(
    tmp_path: Path,
) -> None:
    state = _run(tmp_path, "--no-pty")
    assert _live(state)["step"] is not None

    [attempt] = (state / "job").glob("*-1")
    alone = sentinel_here("replay", "--json", str(attempt / "stdout.log"))
    assert _nan_steps(alone.stdout) == [None], "the dicts alone name no step"
    both = sentinel_here("replay", "--json", str(attempt / "output.log"))
    [replayed] = _nan_steps(both.stdout)
    assert replayed is not None
