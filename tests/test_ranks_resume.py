"""A resume in a text log is not a second rank (issue 20).

A job resumed from a checkpoint one or two logged steps back logs those steps again into
the same stream. Two ranks printing into one stream log every step twice and keep doing
so; a resumed job goes back once, then rises alone. ``RunSeries`` reads the first as one
series started again and the second as two.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sentinel.config import Settings
from sentinel.engine.ranks import RANK_WINDOW, RunSeries
from sentinel.engine.replay import replay
from sentinel.model.records import Sample
from sentinel.parsing import LineParser

JOB = Path(__file__).parent / "e2e" / "resume_job.py"


def ranks(lines: list[tuple[int, float]], source: str = "train.log") -> list[int | None]:
    """The rank ``RunSeries`` gives each ``(step, loss)`` line of one stream."""
    series = RunSeries()
    return [series.admit([Sample("loss", loss, step, None)], source)[1] for step, loss in lines]


def logged(steps: range, level: float = 2.0) -> list[tuple[int, float]]:
    return [(step, level + 1.0 / step) for step in steps]


@pytest.mark.parametrize("back_to", [110, 120], ids=["two-logged-steps-back", "the-newest-step"])
def test_a_resume_one_or_two_logged_steps_back_is_one_series(back_to: int) -> None:
    lines = logged(range(10, 130, 10)) + logged(range(back_to, 300, 10), level=2.01)
    assert set(ranks(lines)) == {None}


def test_resumes_far_apart_are_each_one_series() -> None:
    lines = logged(range(10, 130, 10))
    lines += logged(range(110, 250, 10), 2.01) + logged(range(230, 400, 10), 2.02)
    assert set(ranks(lines)) == {None}


def test_two_ranks_in_lockstep_are_two_series_from_their_second_step() -> None:
    lines = []
    for step in range(10, 200, 10):
        lines += [(step, 1.0 + 1.0 / step), (step, 10.0 + 1.0 / step)]
    got = ranks(lines)
    # One step twice is a resume until the stream goes back again: then rank 1 is apart.
    assert got[:3] == [None, None, None]
    assert got[3:] == [1, 0] * ((len(lines) - 3) // 2) + [1]


def test_a_rank_printing_its_lines_in_bursts_is_still_a_rank() -> None:
    """Rank 1 prints ``RANK_WINDOW`` steps after rank 0 has printed them: it interleaves."""
    lines = []
    for first in range(10, 400, 10 * RANK_WINDOW):
        burst = range(first, first + 10 * RANK_WINDOW, 10)
        lines += [(step, 1.0 + 1.0 / step) for step in burst]
        lines += [(step, 10.0 + 1.0 / step) for step in burst]
    got = ranks(lines)
    tail = lines[-8 * RANK_WINDOW :], got[-8 * RANK_WINDOW :]
    assert {rank for (_, loss), rank in zip(*tail, strict=True) if loss < 5} == {0}
    assert {rank for (_, loss), rank in zip(*tail, strict=True) if loss > 5} == {1}


def test_two_ranks_resumed_one_step_back_are_two_series_again() -> None:
    lines = []
    for step in [*range(10, 130, 10), *range(110, 300, 10)]:
        lines += [(step, 1.0 + 1.0 / step), (step, 10.0 + 1.0 / step)]
    got = ranks(lines)
    assert got[-20:] == [0, 1] * 10
    assert max(rank or 0 for rank in got) == 1  # never a third series


def test_a_one_writer_file_never_holds_a_second_rank() -> None:
    lines = []
    for step in range(10, 100, 10):
        lines += [(step, 1.0), (step, 10.0)]
    assert set(ranks(lines, "metrics.csv")) == {None}


def run_until(command: list[str], log: Path, hang_line: str) -> None:
    """Run ``command`` with its output appended to ``log``; kill it once it logged
    ``hang_line`` (where it hangs), as a scheduler ends a job past its time."""
    with log.open("a") as out:
        job = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while hang_line not in log.read_text():
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize("hang_at", [110, 120], ids=["killed-after-110", "killed-after-120"])
def test_a_real_job_killed_and_resumed_into_its_log_is_one_series(
    tmp_path: Path, hang_at: int
) -> None:
    """A real job, killed after logging ``hang_at`` and resumed from its checkpoint at 100
    into the same log: its NaN after the resume names no rank, and no line was read as
    another rank's."""
    log, checkpoint = tmp_path / "train.log", tmp_path / "checkpoint"
    job = [sys.executable, str(JOB), str(checkpoint)]
    run_until([*job, "100000", str(hang_at)], log, f"step {hang_at} |")
    assert checkpoint.read_text() == "100"
    with log.open("a") as out:
        subprocess.run([*job, "200", "0", "190"], stdout=out, check=True, timeout=30)
    text = log.read_text()
    assert text.count("step 110 |") == 2 and "step 190 | loss nan" in text

    parser, series = LineParser(), RunSeries()
    line_ranks = {series.admit(parser.parse(line), "train.log")[1] for line in text.splitlines()}
    assert line_ranks == {None}
    result = replay([log], Settings())
    raised = [alert for alert in result.alerts if not alert.resolves]
    assert [(alert.rule, alert.step, alert.details.get("rank")) for alert in raised] == [
        ("nan_inf", 190, None)
    ]


@pytest.mark.parametrize(
    ("text", "rank"),
    [
        pytest.param("rank 1: step 5 | loss 2.5", 1, id="rank-colon"),
        pytest.param("Rank 1 | step 5 | loss 2.5", 1, id="rank-bar"),
        pytest.param("RANK 1 step=5 loss=2.5", 1, id="bare-rank-with-a-step"),
        pytest.param("rank 1 loss 2.5", None, id="bare-rank-without-a-step-is-no-rank"),
        pytest.param("ranking 5: loss 2.5", None, id="not-a-rank"),
    ],
)
def test_a_scripts_own_rank_prefix_names_the_rank(text: str, rank: int | None) -> None:
    """Lines that name their rank are read per rank, whatever their steps do."""
    (sample,) = LineParser().parse(text)
    assert (sample.name, sample.value, sample.rank) == ("loss", 2.5, rank)
