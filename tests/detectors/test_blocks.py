"""Rules that take whole blocks (``can_absorb``/``absorb``) say exactly what they say line by line.

Each case feeds one troubled JSON-lines log to two engines, one taking blocks and
one line by line, and compares every alert, in order, and the end state of the
engine and of every rule, float for float. A rule with a block path must also have
taken most of the calm lines as blocks, or its fast path is not being tested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from sentinel.config import Settings
from sentinel.engine.core import build_detectors
from sentinel.rules import DETECTORS, BaseDetector
from tests.detectors.blockcheck import run, troubled_jsonl

#: Rules with a block path: each must take most of a troubled log's lines as blocks alone.
BLOCK_RULES = tuple(
    rule
    for rule, detector_class in DETECTORS.items()
    if detector_class.can_absorb is not BaseDetector.can_absorb
)


def _only(rule: str) -> Callable[[], Sequence[BaseDetector]]:
    detector_class = DETECTORS[rule]
    return lambda: [detector_class(detector_class.config_model())]


def _every_rule() -> Sequence[BaseDetector]:
    return build_detectors(Settings())


#: Every rule with stamped and with bare lines, the two logs' seeds by turns (each seed
#: meets every rule: a second seed for each case doubled the time and found nothing more
#: than the every-rule test's three seeds do). The fast loop has one case a rule.
CASES = [
    pytest.param(
        rule,
        seed,
        stamps,
        id=f"{rule}-seed{seed}-{'stamped' if stamps else 'bare'}",
        marks=() if seed == 1 else pytest.mark.slow,
    )
    for index, rule in enumerate(BLOCK_RULES)
    for stamps in (True, False)
    for seed in [1 + (index + stamps) % 2]
]


@pytest.mark.slow
@pytest.mark.parametrize(("rule", "seed", "timestamps"), CASES)
def test_a_rule_alone_says_the_same_with_blocks(rule: str, seed: int, timestamps: bool) -> None:
    texts = troubled_jsonl(seed, timestamps=timestamps)
    line_by_line = run(_only(rule), texts, blocks=False)
    blocks = run(_only(rule), texts, blocks=True)
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    assert blocks.lines_absorbed > len(texts) // 2


def test_the_troubled_log_makes_nan_inf_raise_and_resolve() -> None:
    """The log the cases share is trouble enough: here for nan_inf (each rule's own test
    file shows it for its rule)."""
    alerts = run(_only("nan_inf"), troubled_jsonl(1), blocks=True).alerts
    assert [alert[9] for alert in alerts[:2]] == [False, True]


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(1, id="seed1"),
        pytest.param(2, id="seed2", marks=pytest.mark.slow),
        pytest.param(3, id="seed3", marks=pytest.mark.slow),
    ],
)
@pytest.mark.slow
def test_every_rule_together_says_the_same_with_blocks(seed: int) -> None:
    texts = troubled_jsonl(seed)
    line_by_line = run(_every_rule, texts, blocks=False)
    blocks = run(_every_rule, texts, blocks=True)
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    assert {alert[0] for alert in line_by_line.alerts} >= {"nan_inf", "loss_spike"}


@pytest.mark.slow
@pytest.mark.parametrize("rule", BLOCK_RULES)
def test_live_batches_say_the_same_with_blocks(rule: str) -> None:
    """Live, a batch is read at one ``now`` and the clock does not come from the data."""
    texts = troubled_jsonl(4)
    line_by_line = run(_only(rule), texts, blocks=False, data_clock=False)
    blocks = run(_only(rule), texts, blocks=True, data_clock=False)
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    assert blocks.lines_absorbed > 0


def test_a_live_batch_ending_in_a_nan_has_the_lines_before_it_taken_whole() -> None:
    """A look hands on the NaN with the lines read since the last batch (25 at 100 lines/s):
    those go to the rules as one block, the NaN alone, with the alerts and state that line
    by line gives. (Halved, the batch went line by line: 1.5 ms more before the stop.)"""
    calm = [
        f'{{"step": {step}, "loss": {2.0 + 0.01 * (step % 7)}, "grad_norm": 1.0, "lr": 0.0003}}'
        for step in range(1, 325)
    ]
    texts = [*calm, '{"step": 325, "loss": NaN, "grad_norm": 1.0, "lr": 0.0003}']  # 13 x 25
    line_by_line = run(_every_rule, texts, blocks=False, data_clock=False, batch_sizes=(25,))
    blocks = run(_every_rule, texts, blocks=True, data_clock=False, batch_sizes=(25,))
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    assert [alert[0] for alert in blocks.alerts if alert[1] == "critical"] == ["nan_inf"]
    # Every calm line of the last batch went whole, as every earlier batch (but the few at
    # the start, where the rules' first values are set line by line).
    before = run(_every_rule, calm[:300], blocks=True, data_clock=False, batch_sizes=(25,))
    assert blocks.lines_absorbed - before.lines_absorbed == 24


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_derived_steps_per_sec_over_a_second_says_the_same_with_blocks(seed: int) -> None:
    """Steps/sec derived from timestamps a few milliseconds apart, measured over a second
    at least (``MIN_SPAN_S``), in bursts that share a time, with slow stretches: the block
    path's rates are the line path's."""
    import json
    import random

    rng = random.Random(seed)
    texts, time = [], 1_700_000_000.0
    for step in range(1, 8001):
        slow = 3000 < step % 5000 < 4000
        time += rng.choice((0.0, 0.003, 0.004, 0.011)) * (4 if slow else 1)
        texts.append(json.dumps({"step": step, "loss": 2.0, "time": round(time, 3)}))
    line_by_line = run(_only("throughput_drop"), texts, blocks=False)
    blocks = run(_only("throughput_drop"), texts, blocks=True)
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    assert [a[0] for a in blocks.alerts].count("throughput_drop") >= 1
