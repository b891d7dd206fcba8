"""The run's series moves past a block as past its lines (``RunSeries.took_block``).

A block the rules took whole leaves ``RunSeries`` as ``admit`` on each of its lines
does: what tells a late copy from another rank's value, and a resume from a rank, must
not depend on how the lines were read.
"""

from __future__ import annotations

import random

import pytest

from sentinel.engine.ranks import RunSeries
from sentinel.model.records import Block, Sample
from tests.detectors.blockcheck import T0, snapshot


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
]


@pytest.mark.parametrize("ranked", [False], ids=["run-series"])
def test_the_series_moves_past_a_block_as_past_its_lines(ranked: bool) -> None:
    """``took_rank_block`` (a rank's own file) and ``took_block`` (the run's series) leave
    ``RunSeries`` as ``admit`` on each line does: the newest step and value of each
    metric, the recent values per step (the oldest forgotten past ``RECENT_KEPT``), and
    the stream of the run's series."""
    rng = random.Random(0)
    source = "/job/rank-1.log" if ranked else "/job/rank-0.log"
    by_line, by_block = RunSeries(), RunSeries()
    for series in (by_line, by_block):
        series.admit([Sample("loss", 1.0, 1)], "/job/rank-0.log")
        if ranked:  # another value at step 1: a rank's own file
            series.admit([Sample("loss", 5.0, 1)], source)
    for steps in _RUNS:
        values = [rng.uniform(0.9, 1.1) * (5.0 if ranked else 1.0) for _ in steps]
        _admit_each(by_line, source, steps, values)
        block = _block(source, steps, values)
        if not ranked and by_block.takes_block(block):
            by_block.took_block(block)
        else:
            assert steps[0] == 1000  # only the resume goes line by line
            _admit_each(by_block, source, steps, values)
        assert snapshot(by_block) == snapshot(by_line)
