"""HF Trainer output read in blocks (bars, blank-outs and dicts together) says exactly what
it says line by line.

Each case feeds one troubled HF log, drawn by a real tqdm (``hfcheck.troubled_hf``), to
two engines in replay, one taking blocks and one line by line, and compares every
alert, in order, and the end state of the engine and of every rule, float for float.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from sentinel.config import Settings
from sentinel.engine.core import build_detectors
from sentinel.model.records import PROGRESS, Block, Sample
from sentinel.rules import BaseDetector
from sentinel.rules.stall import StallConfig, StallDetector
from tests.detectors.blockcheck import SOURCE, run, snapshot
from tests.detectors.hfcheck import troubled_hf
from tests.detectors.test_blocks import BLOCK_RULES, _only

#: (steps between printed dicts, the engine's logging_steps): the Trainer's every-step
#: log read with and without ``parsers.logging_steps``, and a sparser one.
LOGGING = [(1, 1), (1, None), (5, 5)]
#: Batches as replay reads them (about a megabyte) would hold the whole log: smaller
#: ones, so that states are compared all along and pieces are cut at batch ends.
BATCH_SIZES = (701, 37, 1000, 129)


def _every_rule() -> Sequence[BaseDetector]:
    return build_detectors(Settings())


def _compare(
    make: Callable[[], Sequence[BaseDetector]],
    texts: list[str],
    logging_steps: int | None,
    *,
    data_clock: bool = True,
) -> int:
    """Both runs' alerts, and their states after every batch, are equal; the lines the
    block run absorbed. (Without a clock most rules' state settles by the end, so the
    end alone would hide a step or a count gone astray on the way.)"""
    line_by_line = run(
        make,
        texts,
        blocks=False,
        logging_steps=logging_steps,
        data_clock=data_clock,
        batch_sizes=BATCH_SIZES,
        states=True,
    )
    blocks = run(
        make,
        texts,
        blocks=True,
        logging_steps=logging_steps,
        data_clock=data_clock,
        batch_sizes=BATCH_SIZES,
        states=True,
    )
    assert blocks.alerts == line_by_line.alerts
    states = zip(blocks.states, line_by_line.states, strict=True)
    for batch, (state, expected) in enumerate(states):
        assert state == expected, f"after batch {batch}"
    return blocks.lines_absorbed


#: The one case of the fast loop (under a second); the others run in the full run only.
FAST_CASES = {"seed1-every5-ls5-4.x"}


@pytest.mark.parametrize(
    ("seed", "every", "logging_steps", "strings"),
    [
        pytest.param(
            seed,
            every,
            steps,
            strings,
            id=case,
            marks=() if case in FAST_CASES else pytest.mark.slow,
        )
        for index, (every, steps) in enumerate(LOGGING)
        for strings, kind in ((True, "5.x"), (False, "4.x"))
        # Each logging and version with one of the two logs, by turns: both logs meet
        # every logging and both versions (each case takes 2-5 s).
        for seed in [1 + (index + strings) % 2]
        for case in [f"seed{seed}-every{every}-ls{steps}-{kind}"]
    ],
)
@pytest.mark.slow
def test_every_rule_together_says_the_same_with_blocks(
    seed: int, every: int, logging_steps: int | None, strings: bool
) -> None:
    texts = troubled_hf(seed, logging_steps=every, strings=strings)
    absorbed = _compare(_every_rule, texts, logging_steps)
    assert absorbed > len(texts) // 2


@pytest.mark.slow  # about a second a rule; the fast loop has every rule together
@pytest.mark.parametrize("rule", BLOCK_RULES)
def test_a_rule_alone_says_the_same_with_blocks(rule: str) -> None:
    texts = troubled_hf(3)
    assert _compare(_only(rule), texts, 1) > len(texts) // 2


@pytest.mark.slow  # about a second: the guard of the full parametrisation above
def test_the_troubled_log_raises_what_it_holds() -> None:
    """The log is trouble enough: NaN, spikes and grad-norm runs are all in it."""
    alerts = run(_every_rule, troubled_hf(1), blocks=True, logging_steps=1).alerts
    assert {alert[0] for alert in alerts} >= {"nan_inf", "loss_spike", "grad_norm_run"}


@pytest.mark.slow
def test_bars_alone_move_the_step_and_stall_with_blocks() -> None:
    """Logging every 50 steps, most lines are bars: pieces of bars with few dicts, and
    bars after the last dict, are absorbed too (by stall, the rule that sees progress)."""
    texts = troubled_hf(4, steps=2000, logging_steps=50)
    assert _compare(_only("stall"), texts, None) > len(texts) * 2 // 3


@pytest.mark.slow
def test_after_a_timestamp_hf_output_goes_line_by_line() -> None:
    """Once the data's clock runs (a timestamped line), rules see output and ticks: the
    HF block path, which has neither, steps aside."""
    stamped = json.dumps({"step": 0, "loss": 4.0, "time": 1_700_000_000.0})
    texts = [stamped, *troubled_hf(5, steps=600)]
    assert _compare(_every_rule, texts, 1) == 0


@pytest.mark.slow
def test_live_hf_output_goes_line_by_line() -> None:
    """Live, each batch is read at its own ``now`` and rules watch output: line by line."""
    texts = troubled_hf(6, steps=600)
    assert _compare(_every_rule, texts, 1, data_clock=False) == 0


# --- stall's side alone: a block with bars beside its lines ----------------------------------

#: A line as stall is shown it: ("bar", step) or ("dict", step, metric names).
Shown = tuple[Any, ...]


def _stall_both_ways(shown: list[Shown], *, started: bool = False) -> tuple[Any, Any, bool]:
    """``stall`` fed the lines one by one and, fresh, the same as one block read at 0.0:
    both states and whether it took the block."""
    one_by_one, whole = StallDetector(StallConfig()), StallDetector(StallConfig())
    for detector in (one_by_one, whole):
        detector.observe_samples([Sample("loss", 3.0, 1)], SOURCE, 0.0)  # a step before
        if started:
            detector.job_started(0.0)
    dicts = [line for line in shown if line[0] == "dict"]
    names: tuple[str, ...] = dicts[0][2] if dicts else ()
    for line in shown:
        if line[0] == "bar":
            samples = [Sample(PROGRESS, float(line[1]), line[1])]
        else:
            samples = [Sample(name, 1.0, line[1]) for name in line[2]]
        one_by_one.observe_samples(samples, SOURCE, 0.0)
    block = Block(
        source=SOURCE,
        texts=["{'...'}"] * len(dicts),
        names=names,
        columns={name: [1.0] * len(dicts) for name in names},
        steps=[line[1] for line in dicts],
        times=None,
        clock=[0.0] * len(dicts),
        start_clock=None,
        ticks=False,
        output=False,
        progress=[line[1] for line in shown],
        progress_at=0.0,
    )
    took = whole.can_absorb(block)
    if took:
        whole.absorb(block)
    return snapshot(whole), snapshot(one_by_one), took


@pytest.mark.parametrize(
    "shown",
    [
        pytest.param([("bar", step) for step in range(2, 40)], id="bars-alone"),
        pytest.param(
            [line for step in range(2, 20) for line in (("bar", step), ("dict", step, ("loss",)))],
            id="one-metric-dicts-at-the-bars-step",
        ),
        pytest.param(
            [("dict", step, ("loss",)) for step in range(2, 20)], id="one-metric-dicts-new-steps"
        ),
        pytest.param(
            [
                line
                for step in range(2, 20)
                for line in (("bar", step), ("dict", step, ("loss", "grad_norm")))
            ],
            id="many-metric-dicts",
        ),
        pytest.param(
            [("dict", step, ("loss", "grad_norm")) for step in range(2, 20)],
            id="many-metric-dicts-new-steps",
        ),
        pytest.param(
            [("dict", step, ("loss",)) for step in (5, 5, 4, 9, 9)], id="dicts-stepping-back"
        ),
    ],
)
def test_stall_takes_bars_and_lines_as_one_by_one(shown: list[Shown]) -> None:
    whole, one_by_one, took = _stall_both_ways(shown)
    assert took
    assert whole == one_by_one


def test_stall_refuses_such_a_block_once_its_clock_runs() -> None:
    """An attempt started: progress is measured from it and gaps are learned; a block
    read at one moment has no clock to give them (replay's come before the first one)."""
    _, _, took = _stall_both_ways([("bar", step) for step in range(2, 40)], started=True)
    assert not took
