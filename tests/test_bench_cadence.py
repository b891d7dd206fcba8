"""bench/cadence.py: a sparser cadence is the framework's average, and every figure of a
cell is what the engine raised on the changed run."""

from __future__ import annotations

import math

from bench import cadence
from sentinel.config import load_settings


def _run(losses: list[float], lrs: list[float] | None = None) -> cadence.Run:
    records = [{"loss": loss} for loss in losses]
    for record, lr in zip(records, lrs or [], strict=False):
        record["lr"] = lr
    return cadence.Run("synthetic", list(range(1, len(losses) + 1)), records)


def test_a_sparser_cadence_averages_the_loss_and_keeps_the_windows_last_rate() -> None:
    run = _run([1.0, 3.0, 2.0, 6.0, 5.0], lrs=[0.1, 0.2, 0.3, 0.4, 0.5])
    logged = cadence.at_cadence(run, run.records, 2)
    assert logged.steps == [2, 4]
    assert [r["loss"] for r in logged.records] == [2.0, 4.0]
    assert [r["lr"] for r in logged.records] == [0.2, 0.4]


def test_a_nan_shape_is_found_on_its_first_value_and_a_healthy_run_raises_nothing() -> None:
    settings = load_settings(None, environ={})
    run = _run([2.0 - 0.001 * i for i in range(400)])
    found = cadence.run_cell(cadence.Cell("nan", 10, 5), [run], settings)
    assert (found.cases, found.found, found.to_warning, found.criticals) == (1, 1, [0], 1)
    healthy = cadence.run_healthy(10, [run], settings)
    assert (healthy.runs, healthy.values, healthy.warnings, healthy.criticals) == (1, 40, 0, 0)


def test_a_run_too_short_or_too_coarse_for_a_cell_is_skipped_and_counted() -> None:
    settings = load_settings(None, environ={})
    short = _run([2.0] * 8)
    cell = cadence.run_cell(cadence.Cell("shift_x2", 1, 20), [short], settings)
    assert (cell.cases, cell.skipped) == (0, {"too short": 1})
    coarse = cadence.Run("every-50", [50 * i for i in range(1, 30)], [{"loss": 2.0}] * 29)
    cell = cadence.run_cell(cadence.Cell("shift_x2", 10, 5), [coarse], settings)
    assert cell.skipped == {"logs less often": 1}


def test_a_target_a_cell_misses_says_not_met_and_names_the_cell() -> None:
    missed = cadence.Cell("shift_x2", 100, 5, cases=4, found=3, apart=3, apart_found=2)
    met = cadence.Cell("nan", 100, 5, cases=4, found=4, to_warning=[0, 0, 0, 0])
    lines = cadence.targets([missed, met], [], "hf-every-step")
    assert lines[0].startswith("- met: NaN")
    assert lines[1].startswith("- NOT met: LR jumps") and "shift_x2 @100 pre 5: 2 of 3" in lines[1]
    # Beside it, what sentinel did with every injected case, the log showing it or not.
    assert lines[2].startswith("- the same, as injected: 3 of 4; the others stay within")
    assert math.isclose(missed.recall or 0, 0.75)


def test_a_failure_stands_apart_only_above_the_run_past_its_descent_with_two_values_after() -> None:
    before = [{"loss": loss} for loss in (8.0, 4.0, 2.0, 1.0)]
    assert cadence.stands_apart(before, [{"loss": 9.0}, {"loss": 9.5}])
    # x2 of a loss still falling fast stays under its level before: no rule can tell.
    assert not cadence.stands_apart(before, [{"loss": 1.8}, {"loss": 1.6}, {"loss": 1.5}])
    assert not cadence.stands_apart(before, [{"loss": 9.0}]), "one value: spike or shift"
    # Under where the run began, but above all it showed once its first descent ended.
    learnt = [{"loss": loss} for loss in (0.855, 0.448, 0.332, 0.376, 0.329)]
    assert cadence.stands_apart(learnt, [{"loss": v} for v in (0.65, 0.62, 0.71, 0.49, 0.5)])
    # Within the run's own swings from one value to the next (0.0018 -> 0.0433): no shift.
    swinging = [{"loss": loss} for loss in (0.29, 0.036, 0.014, 0.0018, 0.0433)]
    assert not cadence.stands_apart(swinging, [{"loss": v} for v in (0.0012, 0.061, 0.075)])


def test_a_blow_up_is_judged_as_the_log_shows_it_against_a_floor_of_scale() -> None:
    def records(losses: list[float], grad: float = 0.5) -> list[cadence.Record]:
        return [{"loss": loss, "grad_norm": grad} for loss in losses]

    fell = records([0.69, 0.48, 0.19, 0.002, 0.001, 0.0009])
    # 179x its level, but a fifth of where the run began: a hard batch, no blow-up.
    assert not cadence.blows_up(fell, records([0.16], grad=12.0))
    assert cadence.blows_up(fell, records([48.0], grad=12.0))
    assert not cadence.blows_up(fell, records([48.0], grad=2.0)), "not corroborated"
    missed = cadence.Cell("blowup_x150", 10, 20, cases=3, criticals=3, to_critical=[0, 1, 0])
    missed.blowups, missed.blowups_first = 2, 1
    line = next(t for t in cadence.targets([missed], [], "x") if "blow-up of x100" in t)
    assert line.startswith("- NOT met") and "blowup_x150 @10 pre 20: 1 of 2" in line


def test_a_shape_that_stays_needs_three_values_from_its_onset() -> None:
    settings = load_settings(None, environ={})
    # 5 values before the onset and 2 from it: that a shift stays does not show yet.
    cell = cadence.run_cell(cadence.Cell("shift_x2", 1, 5), [_run([2.0] * 7)], settings)
    assert (cell.cases, cell.skipped) == (0, {"too short to stay": 1})
    # A spike needs only its own value.
    cell = cadence.run_cell(cadence.Cell("spike_x10", 1, 5), [_run([2.0] * 7)], settings)
    assert (cell.cases, cell.skipped) == (1, {})


def test_a_log_whose_steps_start_again_is_one_run_per_start() -> None:
    """Keras' CSVLogger(append=True) appends each run to one file, each from epoch 0: the
    real corpus file holds four runs (5, 4, 10 and 5 epochs)."""
    folder = cadence.CORPUS / "keras-csvlogger-appended-runs"
    runs = cadence.read_runs(folder, load_settings(None, environ={}))
    assert [run.name for run in runs] == [f"keras-csvlogger-appended-runs#{i}" for i in range(1, 5)]
    assert [len(run.records) for run in runs] == [5, 4, 10, 5]
    assert all(run.steps == sorted(run.steps) for run in runs)
