"""A rank's own file taken in blocks says exactly what it says line by line (issue 29.4).

Each case feeds the files of a job of several ranks, one JSON-lines log each
(``rank-<r>.log``), to two engines, one taking blocks and one line by line, the files
read in turns as a live watcher reads them (each a batch of its newest lines), and
compares every alert, in order, and the end state of the engine, of each rank's own
rules and of the run's series (``RunSeries``), float for float. The first file read is
the run's series; each other file is a rank's own, found by its first lines, and then
its blocks go to that rank's rules whole, or line by line where they would not take them
(a NaN, a spike, a resume).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from sentinel.config import Settings
from sentinel.engine.core import Engine, build_detectors
from sentinel.engine.ranks import RunSeries
from sentinel.model.records import Alert, Block, Sample
from sentinel.parsing import LineParser
from tests.detectors.blockcheck import T0, alert_key, engine_state, snapshot

RANKS = 4
STEPS = 600
#: Where each kind of trouble is: on which rank, from which step.
NAN = (2, 420)
SPIKE = (1, 200)
RESUME = (3, 300, 240)  # rank 3 goes back from step 300 to 240, as a resumed rank does


def rank_files(seed: int, *, timestamps: bool, trouble: bool = True) -> dict[str, list[str]]:
    """Per rank's file, its lines: one JSON line a step (each rank its own level and
    noise), an eval line every 50 steps; with ``trouble``, a NaN, a spike and a resume."""
    files: dict[str, list[str]] = {}
    for rank in range(RANKS):
        rng = random.Random(seed * 100 + rank)
        level = 2.0 + rank
        out: list[str] = []
        step, index, resumed = 0, 0, False
        while step < STEPS:
            step += 1
            index += 1
            if trouble and rank == RESUME[0] and step == RESUME[1] and not resumed:
                step, resumed = RESUME[2], True
            loss = level * (1 + 2.0 / step) * (1 + 0.02 * rng.gauss(0, 1))
            if trouble and rank == SPIKE[0] and SPIKE[1] <= step < SPIKE[1] + 3:
                loss *= 8
            if trouble and (rank, step) == NAN:
                loss = math.nan
            record: dict[str, Any] = {
                "step": step,
                "loss": loss,
                "grad_norm": 1 + 0.1 * rng.gauss(0, 1),
                "lr": min(1e-5 * step, 3e-4),
                "tokens_per_sec": 15000 * (1 + 0.01 * rng.gauss(0, 1)),
            }
            if timestamps:
                record["time"] = T0 + 0.5 * index + 0.01 * rank
            out.append(json.dumps(record))
            if step % 50 == 0:
                evaluation: dict[str, Any] = {"step": step, "eval_loss": level * 0.9}
                if timestamps:
                    evaluation["time"] = T0 + 0.5 * index + 0.01 * rank
                out.append(json.dumps(evaluation))
        files[f"/job/ranks/rank-{rank}.log"] = out
    return files


def feed(
    files: dict[str, list[str]],
    *,
    blocks: bool,
    data_clock: bool,
    seed: int,
    logging_steps: int | None = None,
    restart_turn: int = -1,
) -> tuple[list[tuple[Any, ...]], dict[str, Any], Engine]:
    """The files read in turns, a batch of 1 to 80 lines of each (the order of the files
    shuffled each turn); live, each turn at its own ``now``, with a tick every other turn.
    ``restart_turn``: a new attempt starts before that turn (``job_started``)."""
    engine = Engine(
        build_detectors(Settings()),
        LineParser(logging_steps=logging_steps),
        data_clock=data_clock,
        blocks=blocks,
        logging_steps=logging_steps,
    )
    rng = random.Random(seed)
    read = dict.fromkeys(files, 0)
    alerts: list[Alert] = []
    turn = 0
    while any(read[source] < len(texts) for source, texts in files.items()):
        now = T0 + 2.0 * turn
        if turn == restart_turn:
            engine.job_started(now, 100)
        if not data_clock and turn % 2:
            alerts += engine.tick(now)
        order = list(files)
        rng.shuffle(order)
        for source in order:
            start = read[source]
            size = rng.choice([1, 3, 17, 40, 80])
            batch = files[source][start : start + size]
            if batch:
                alerts += engine.feed_texts(source, batch, now)
            read[source] = start + len(batch)
        turn += 1
    return [alert_key(alert) for alert in alerts], state(engine), engine


def state(engine: Engine) -> dict[str, Any]:
    """The engine's state, each rank's own rules' and the run's series, as plain data."""

    return {
        **engine_state(engine),
        "ranks": {rank: engine_state(ranked) for rank, ranked in engine._ranked.items()},
        "series": snapshot(engine.series),
    }


def absorbed_by_ranks(engine: Engine) -> int:
    return sum(ranked.lines_absorbed for ranked in engine._ranked.values())


@pytest.mark.parametrize(
    ("seed", "data_clock", "timestamps", "options"),
    [
        pytest.param(1, False, True, {}, id="live-seed1"),
        pytest.param(2, True, True, {}, id="replay-seed2"),
        pytest.param(3, True, False, {}, id="replay-bare-seed3"),
        pytest.param(4, False, False, {}, id="live-bare-seed4"),
        # The cadence's count (step-less lines' steps) and a new attempt part way.
        pytest.param(5, False, True, {"logging_steps": 10, "restart_turn": 6}, id="live-restart"),
        pytest.param(6, True, True, {"logging_steps": 10, "restart_turn": 6}, id="replay-restart"),
    ],
)
def test_rank_files_say_the_same_with_blocks(
    seed: int, data_clock: bool, timestamps: bool, options: dict[str, Any]
) -> None:
    files = rank_files(seed, timestamps=timestamps)
    line_alerts, line_state, _ = feed(
        files, blocks=False, data_clock=data_clock, seed=seed, **options
    )
    block_alerts, block_state, engine = feed(
        files, blocks=True, data_clock=data_clock, seed=seed, **options
    )
    assert block_alerts == line_alerts
    assert block_state == line_state
    lines = sum(map(len, files.values()))
    # Most of the ranks' lines went whole to their rules, or the fast path is not tested
    # (fewer after a new attempt: the rules learn the run again, line by line).
    assert absorbed_by_ranks(engine) > lines // (3 if "restart_turn" in options else 2)
    assert len(engine._ranked) == RANKS - 1


def test_the_rank_files_trouble_is_raised_naming_its_rank() -> None:
    """The trouble the cases share is raised, on the rank it is on: the NaN (and the spike,
    unless it was the run's series read first)."""
    files = rank_files(1, timestamps=True)
    alerts, _, engine = feed(files, blocks=True, data_clock=False, seed=1)
    ranks = engine.series._source_rank if engine.series is not None else {}
    nan_rank = ranks.get(f"/job/ranks/rank-{NAN[0]}.log")
    raised = [(alert[0], alert[5], alert[10].get("rank")) for alert in alerts if not alert[9]]
    assert ("nan_inf", NAN[1], nan_rank) in raised
    assert any(rule == "loss_spike" for rule, _, _ in raised)


def test_a_healthy_job_of_rank_files_goes_whole_to_the_ranks_rules() -> None:
    """No trouble: the ranks' files go whole to their rules as much as one file goes to
    the rules (batches under ``BLOCK_MIN_LINES`` and the short runs between eval lines go
    line by line either way), about 80% of the lines here."""
    files = rank_files(5, timestamps=True, trouble=False)
    alerts, line_state, _ = feed(files, blocks=False, data_clock=False, seed=5)
    block_alerts, block_state, engine = feed(files, blocks=True, data_clock=False, seed=5)
    assert block_alerts == alerts
    assert block_state == line_state
    ranked_lines = sum(
        len(texts) for source, texts in files.items() if source in engine.series._source_rank
    )
    run_lines = sum(map(len, files.values())) - ranked_lines
    run_absorbed = engine.lines_absorbed - absorbed_by_ranks(engine)
    assert absorbed_by_ranks(engine) / ranked_lines > 0.9 * run_absorbed / run_lines


def _block(source: str, steps: list[int], values: list[float]) -> Block:
    """A block of lines holding one metric, ``loss``."""
    return Block(
        source=source,
        texts=[""] * len(steps),
        names=("loss",),
        columns={"loss": values},
        steps=steps,
        times=None,
        clock=[T0] * len(steps),
        start_clock=None,
        ticks=False,
        output=False,
    )


def _admit_each(series: RunSeries, source: str, steps: list[int], values: list[float]) -> None:
    for step, value in zip(steps, values, strict=True):
        series.admit([Sample("loss", value, step)], source)


#: Runs of steps a file brings, in order: rising ones long enough to pass ``RECENT_KEPT``
#: (the oldest steps forgotten), a resume (back, then rising past it over steps still
#: kept), a block of more steps than are kept at once.
_RUNS = [
    list(range(2, 40)),
    list(range(40, 1100)),
    list(range(1100, 1130)),
    list(range(1000, 1010)),  # back: a resume, line by line
    list(range(1010, 1500)),
    list(range(1500, 4000)),
    list(range(4000, 4030)),  # a NaN at step 4010: line by line
    list(range(4030, 4100)),
]
#: A step whose value is NaN (in ``_RUNS``).
_NAN_AT = 4010


@pytest.mark.parametrize("ranked", [True, False], ids=["rank-file", "run-series"])
def test_the_series_moves_past_a_block_as_past_its_lines(ranked: bool) -> None:
    """``took_rank_block`` (a rank's own file) and ``took_block`` (the run's series) leave
    ``RunSeries`` as ``admit`` on each line does: the newest step and value of each
    metric, the recent values per step (the oldest forgotten past ``RECENT_KEPT``), the
    non-finite steps (a block with one goes line by line), and the stream of the run's
    series."""
    rng = random.Random(0)
    source = "/job/rank-1.log" if ranked else "/job/rank-0.log"
    by_line, by_block = RunSeries(), RunSeries()
    for series in (by_line, by_block):
        series.admit([Sample("loss", 1.0, 1)], "/job/rank-0.log")
        if ranked:  # another value at step 1: a rank's own file
            series.admit([Sample("loss", 5.0, 1)], source)
    if ranked:
        assert by_block.rank_of(source) == 1
    for steps in _RUNS:
        values = [
            math.nan if step == _NAN_AT else rng.uniform(0.9, 1.1) * (5.0 if ranked else 1.0)
            for step in steps
        ]
        _admit_each(by_line, source, steps, values)
        block = _block(source, steps, values)
        if ranked and by_block.takes_rank_block(block, 1):
            by_block.took_rank_block(block, 1)
        elif not ranked and by_block.takes_block(block):
            by_block.took_block(block)
        else:
            assert steps[0] in (1000, 4000)  # only the resume and the NaN go line by line
            _admit_each(by_block, source, steps, values)
        assert snapshot(by_block) == snapshot(by_line)
