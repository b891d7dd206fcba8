"""One run, many files: the files of one run share one view of it (issue 20.7).

Real files of real tiny runs that wrote their scalars twice: ``fixtures/run_files`` (TensorBoard
events and a CSV in one folder, ``make_run_files.py``) and ``fixtures/torch/spikes`` (its
``metrics.jsonl`` and ``tb/`` events, ``make_torch_logs.py``). However they are replayed,
together, in either order or as their folder, each failure is reported once, at its step, as
replaying one of the files alone reports it; no file's detector state bleeds into the other's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sentinel.config import Settings
from sentinel.engine.replay import ReplayResult, replay, run_batches
from sentinel.parsing.files import replay_plan

FIXTURES = Path(__file__).parent / "fixtures"
RUN = FIXTURES / "run_files"
RUN_EVENTS = RUN / "events.out.tfevents.1700000000.sentinel-fixture"
RUN_CSV = RUN / "metrics.csv"
SPIKES = FIXTURES / "torch" / "spikes"
SPIKES_EVENTS = SPIKES / "tb" / "events.out.tfevents.1700000000.sentinel-fixture"
SPIKES_JSONL = SPIKES / "metrics.jsonl"


def openers(result: ReplayResult) -> list[tuple[str, str, int | None]]:
    """Each episode's first alert: (rule, severity, step)."""
    return [(alert.rule, str(alert.severity), alert.step) for alert in result._openers]


def run_files_expected() -> list[tuple[str, str, int | None]]:
    expected = json.loads((RUN / "expected.json").read_text())
    spikes = [("loss_spike", "warning", step) for step in expected["spike_steps"]]
    return [*spikes, ("nan_inf", "critical", expected["first_nonfinite_step"])]


def test_one_file_alone_reports_the_runs_failures() -> None:
    """The reference: the CSV alone gives the run's two spikes and its NaN."""
    assert openers(replay([RUN_CSV], Settings())) == run_files_expected()


@pytest.mark.parametrize(
    "paths",
    [
        pytest.param([RUN_EVENTS, RUN_CSV], id="events-then-csv"),
        pytest.param([RUN_CSV, RUN_EVENTS], id="csv-then-events"),
        pytest.param([RUN], id="the-run-folder"),
    ],
)
@pytest.mark.slow
def test_a_runs_events_and_csv_together_report_each_failure_once(paths: list[Path]) -> None:
    result = replay(paths, Settings())
    assert openers(result) == run_files_expected()
    assert result.incidents == 3
    # Each metric at each step is one observation: as many samples as one file gives.
    assert result.samples == replay([RUN_CSV], Settings()).samples


@pytest.mark.parametrize(
    "paths",
    [
        pytest.param([SPIKES_EVENTS, SPIKES_JSONL], id="events-then-jsonl"),
        pytest.param([SPIKES_JSONL, SPIKES_EVENTS], id="jsonl-then-events"),
    ],
)
@pytest.mark.slow
def test_no_state_bleeds_from_one_file_into_the_other(paths: list[Path]) -> None:
    """Read one after the other, the second file's step 1 came after the first's step 300:
    a false critical loss_spike at the start. Now only the three real spikes, as warnings."""
    result = replay(paths, Settings())
    expected = json.loads((SPIKES / "expected.json").read_text())["spike_steps"]
    assert openers(result) == [("loss_spike", "warning", step) for step in expected]
    assert result.worst() == "warning"


def test_the_files_of_one_run_are_read_merged_in_step_order() -> None:
    """Step by step: each step's event records, then its CSV row (the header first)."""
    batches = list(run_batches(replay_plan([RUN_EVENTS, RUN_CSV])))
    sources = [Path(source).name for source, _ in batches]
    assert len(batches) == 1 + 2 * 130  # the header, then per step its events and its row
    assert set(sources[1::2]) == {RUN_EVENTS.name}
    assert set(sources[2::2]) == {RUN_CSV.name}
    rows = [line for source, lines in batches if source == str(RUN_CSV) for line in lines]
    assert rows == RUN_CSV.read_text().splitlines()  # every line, in the file's own order


def test_two_attempts_whose_steps_do_not_overlap_are_read_one_after_the_other(
    tmp_path: Path,
) -> None:
    """The run's CSV cut in two at step 60, as two attempts would write it."""
    header, *rows = RUN_CSV.read_text().splitlines()
    first, second = tmp_path / "a" / "metrics.csv", tmp_path / "b" / "metrics.csv"
    for path, part in ((first, rows[:60]), (second, rows[60:])):
        path.parent.mkdir()
        path.write_text("\n".join([header, *part]) + "\n")
    batches = list(run_batches(replay_plan([second, first])))
    assert [source for source, _ in batches] == [str(second), str(first)]
