"""The RL consoles read live: ``sentinel run`` over a job that prints a real run's console
(``tests/fixtures/sb3``, ``tests/fixtures/rsl_rl``) as the framework does, a table or a
block at a time, with one objective value turned NaN. The job is stopped at the step the
table or block names: the live path (the relay, the batches, the rules' blocks) reads these
multi-line records as replay does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import clean_env

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

#: Prints FILE's lines, the value on line N made ``nan``, pausing between records.
PLAYER = """\
import sys, time
path, poisoned = sys.argv[1], int(sys.argv[2])
for number, line in enumerate(open(path).read().splitlines(), 1):
    if number == poisoned:
        if line.startswith("|"):
            cells = line.split("|")
            cells[2] = " nan".ljust(len(cells[2]))
            line = "|".join(cells)
        else:
            line = line.rpartition(": ")[0] + ": nan"
    print(line, flush=True)
    if not line.strip() or line.startswith("---"):
        time.sleep(0.01)
"""


def poisoned_line(path: Path, marker: str, nth: int) -> int:
    """The number of the ``nth`` line holding ``marker`` (1-based, as the player counts)."""
    found = [i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line]
    return found[nth - 1]


@pytest.mark.parametrize(
    ("console", "marker", "metric", "step"),
    [
        # The 50th table's train/loss: the table at 13,056 environment steps.
        ("sb3/ppo_healthy/console.txt", "|    loss ", "train/loss", 13056),
        # The 60th block's value loss: iteration 59 (RSL-RL counts from 0).
        ("rsl_rl/healthy/console.txt", "Mean value loss", "value_loss", 59),
    ],
)
def test_a_nan_in_an_rl_console_stops_the_job_at_its_records_step(
    tmp_path: Path, console: str, marker: str, metric: str, step: int
) -> None:
    path = FIXTURES / console
    nth = 50 if console.startswith("sb3") else 60
    line = poisoned_line(path, marker, nth)
    state = tmp_path / "state"
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state), "--",
         sys.executable, "-c", PLAYER, str(path), str(line)],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 90, result.stderr[-3000:]  # stopped; no checkpoints to resume
    alerts = [json.loads(text) for text in (state / "alerts.jsonl").read_text().splitlines()]
    first = alerts[0]
    assert (first["rule"], first["severity"], first["metric"], first["step"]) == (
        "nan_inf",
        "critical",
        metric,
        step,
    )
