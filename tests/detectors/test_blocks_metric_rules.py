"""loss_spike, grad_norm_run and loss_plateau raise through blocks what they raise line by line.

Each case feeds one JSON-lines log to two engines, one taking blocks and one line by
line (``blockcheck.run``), and compares every alert and the rule's end state. The logs
make the rule raise, with configs other than the defaults, and sit right on an edge of
the proof each ``can_absorb`` makes: a value exactly at a bar and the next float above
it, a window that fills inside a block, warmup ending inside a block, an episode that
resolves inside a block, a median kept on one side of a bar by a bare majority.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pytest

from sentinel.rules import BaseDetector
from sentinel.rules.grad_norm_run import GradNormRunConfig, GradNormRunDetector
from sentinel.rules.loss_plateau import LossPlateauConfig, LossPlateauDetector
from sentinel.rules.loss_spike import LossSpikeConfig, LossSpikeDetector
from tests.detectors.blockcheck import T0, Run, run, troubled_jsonl

NAN = math.nan
#: Ways to feed a log: replay with timestamps, replay without, live batches.
FEEDS = [
    pytest.param({"timestamps": True, "data_clock": True}, id="stamped"),
    pytest.param({"timestamps": False, "data_clock": True}, id="bare"),
    pytest.param({"timestamps": True, "data_clock": False}, id="live"),
]


def above(value: float) -> float:
    """The next float above ``value``: just over a bar."""
    return math.nextafter(value, math.inf)


def lines(**columns: Sequence[float]) -> list[str]:
    """JSON lines ``{"step": 1, <columns in order>, "time": ...}``, ``{"step": 2, ...``."""
    count = len(next(iter(columns.values())))
    out = []
    for index in range(count):
        step = 1 + index
        record: dict[str, Any] = {"step": step}
        record.update((name, values[index]) for name, values in columns.items())
        record["time"] = T0 + 0.5 * step
        out.append(json.dumps(record))
    return out


def both(
    detector: type[BaseDetector],
    config: Any,
    texts: list[str],
    data_clock: bool = True,
    cut: int | None = None,
) -> Run:
    """The block run, after checking it says and leaves what the line-by-line run does.

    ``cut``: the lines of the first batch, so that a block ends (and the next begins)
    exactly on an edge; the rest follows as one batch. (The clock starts on the first
    line; the rest of a batch is one block, halved where it is refused.)
    """

    def make() -> list[BaseDetector]:
        return [detector(config)]

    sizes = (4096, 37, 1000) if cut is None else (cut, 4096)
    line_by_line = run(make, texts, blocks=False, data_clock=data_clock, batch_sizes=sizes)
    blocks = run(make, texts, blocks=True, data_clock=data_clock, batch_sizes=sizes)
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    assert blocks.lines_absorbed > 0  # the block path was taken somewhere
    return blocks


def raised(result: Run) -> list[tuple[int, str]]:
    """(step, kind) of each alert."""
    return [(alert[5], alert[10]["kind"]) for alert in result.alerts]


# --- loss_spike ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("feed", FEEDS)
def test_loss_spike_raises_the_same_through_blocks(feed: dict[str, bool]) -> None:
    config = LossSpikeConfig(window=20, factor=1.8, sustain=2, resolve_after=5)
    texts = troubled_jsonl(5, timestamps=feed["timestamps"])
    kinds = {kind for _, kind in raised(both(LossSpikeDetector, config, texts, feed["data_clock"]))}
    assert kinds == {"spike", "persistent", "recovered"}


#: Ten values at 2.0: a full default window.
CALM = [2.0] * 10


@pytest.mark.parametrize(
    ("config", "losses", "expected"),
    [
        ({}, [*CALM, *[2.0] * 40, 4.0, *[2.0] * 40], []),
        ({}, [*CALM, *[2.0] * 40, above(4.0), *[2.0] * 40], [(51, "spike"), (54, "recovered")]),
        ({}, [*CALM[:9], 9.0, *[2.0] * 60], []),
        ({}, [*CALM, 9.0, *[2.0] * 60], [(11, "spike"), (14, "recovered")]),
        ({"warmup_steps": 40}, [*[2.0] * 38, 9.0, *[2.0] * 60], []),
        ({"warmup_steps": 40}, [*[2.0] * 39, 9.0, *[2.0] * 60], [(40, "spike"), (43, "recovered")]),
        (
            {"resolve_after": 6},
            [*CALM, 9.0, 2.0, 9.0, *[2.0] * 50, 9.0, *[2.0] * 40],
            [(11, "spike"), (19, "recovered"), (64, "spike"), (70, "recovered")],
        ),
        (
            {"window": 5, "sustain": 2},
            [*CALM[:5], *[7.0] * 5, *[7.5] * 40],
            [(6, "spike"), (7, "persistent"), (10, "level_shift")],
        ),
        (
            {},
            [*CALM, *[2.0] * 20, NAN, *[2.0] * 20, 5.0, *[2.0] * 40],
            [(52, "spike"), (55, "recovered")],
        ),
    ],
    ids=[
        "exactly-factor-x-the-least-is-calm",
        "the-next-float-above-spikes",
        "a-spike-filling-the-window-is-learned",
        "the-first-judged-value-spikes",
        "a-spike-on-the-last-warmup-step-is-learned",
        "a-spike-on-the-first-step-after-warmup",
        "episodes-resolve-inside-blocks",
        "a-level-shift-resolves-inside-a-block",
        "a-nan-in-a-calm-block-is-skipped",
    ],
)
def test_loss_spike_edges(
    config: dict[str, Any], losses: list[float], expected: list[tuple[int, str]]
) -> None:
    result = both(LossSpikeDetector, LossSpikeConfig(**config), lines(loss=losses))
    assert raised(result) == expected


# The LR warms up over steps 1-30 and falls from step 31. On a line "loss" before "lr",
# step 31's loss is still judged in warmup; with "lr" first it is not.
_RATES = [1e-5 * step for step in range(1, 31)] + [2e-4] * 60


@pytest.mark.parametrize(
    ("spike_step", "lr_first", "expected"),
    [
        (31, False, []),
        (32, False, [(32, "spike"), (35, "recovered")]),
        (31, True, [(31, "spike"), (34, "recovered")]),
    ],
    ids=["on-the-line-the-lr-falls", "the-line-after", "lr-before-loss-on-the-line"],
)
def test_loss_spike_lr_warmup_ending_inside_a_block(
    spike_step: int, lr_first: bool, expected: list[tuple[int, str]]
) -> None:
    losses = [9.0 if step == spike_step else 2.0 for step in range(1, len(_RATES) + 1)]
    texts = lines(lr=_RATES, loss=losses) if lr_first else lines(loss=losses, lr=_RATES)
    assert raised(both(LossSpikeDetector, LossSpikeConfig(), texts)) == expected


def test_loss_spike_metrics_share_one_episode_through_blocks() -> None:
    config = LossSpikeConfig(metrics=["loss", "grad_norm"])
    losses = [*CALM, *[2.0] * 30, 9.0, *[2.0] * 30]
    grads = [*CALM, *[2.0] * 31, 9.0, 9.0, *[2.0] * 28]
    result = both(LossSpikeDetector, config, lines(loss=losses, grad_norm=grads))
    assert raised(result) == [(41, "spike"), (46, "recovered")]


# --- grad_norm_run ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("feed", FEEDS)
def test_grad_norm_run_raises_the_same_through_blocks(feed: dict[str, bool]) -> None:
    config = GradNormRunConfig(
        threshold=6.0, sustain=2, max_grad_norm=1.1, clip_fraction=0.5, clip_window=10
    )
    texts = troubled_jsonl(1, timestamps=feed["timestamps"])
    kinds = {
        kind for _, kind in raised(both(GradNormRunDetector, config, texts, feed["data_clock"]))
    }
    assert kinds == {"absolute", "clipping", "recovered"}


_STEADY = [1.0] * 20


_CLIPS = {"max_grad_norm": 1.0, "clip_window": 10, "clip_fraction": 0.5}


@pytest.mark.parametrize(
    ("config", "grads", "cut", "expected"),
    [
        ({"factor": 20.0}, [*_STEADY, *[10.0] * 5, *[1.0] * 40], None, []),
        (
            {"factor": 20.0},
            [*_STEADY, *[above(10.0)] * 3, *[1.0] * 40],
            None,
            [(23, "absolute"), (28, "recovered")],
        ),
        ({"sustain": 1}, [*_STEADY, 5.0, *[1.0] * 40], None, []),
        (
            {"sustain": 1},
            [*_STEADY, above(5.0), *[1.0] * 40],
            None,
            [(21, "relative"), (26, "recovered")],
        ),
        ({"sustain": 1}, [*[1.0] * 9, 6.0, *[1.0] * 40], None, []),
        (
            {"sustain": 1},
            [*[1.0] * 10, 6.0, *[1.0] * 40],
            None,
            [(11, "relative"), (16, "recovered")],
        ),
        (
            _CLIPS,
            [*[0.5] * 20, *[1.0, 0.5] * 4, *[0.5] * 2, *[1.0, 0.5, 0.5] * 20],
            None,
            [],
        ),
        (
            _CLIPS,
            [*[0.5] * 20, *[1.0, 0.5] * 5, *[0.5] * 40],
            None,
            [(29, "clipping"), (35, "recovered")],
        ),
        (
            _CLIPS,
            [*[0.5] * 20, *[1.0, 0.5] * 5, *[0.5] * 40],
            26,
            [(29, "clipping"), (35, "recovered")],
        ),
        ({"warmup_steps": 30}, [*[1.0] * 27, 20.0, 20.0, *[1.0] * 40], None, []),
        (
            {"warmup_steps": 30},
            [*[1.0] * 29, *[20.0] * 3, *[1.0] * 40],
            None,
            [(32, "absolute"), (37, "recovered")],
        ),
        ({"warmup_steps": 30}, [1.0] * 130, 28, []),
        ({"warmup_steps": 30}, [1.0] * 130, 30, []),
        (
            {},
            [*_STEADY, *[20.0] * 3, *[1.0] * 3, 20.0, *[1.0] * 40, *[20.0] * 3, *[1.0] * 20],
            None,
            [(23, "absolute"), (32, "recovered"), (70, "absolute"), (75, "recovered")],
        ),
    ],
    ids=[
        "exactly-the-threshold-is-calm",
        "the-next-float-above-runs",
        "exactly-relative-factor-x-the-least-is-calm",
        "the-next-float-above-is-relative",
        "a-high-value-before-min-history-is-learned",
        "the-first-value-judged-relatively",
        "one-clip-short-of-the-fraction-in-every-window",
        "a-window-at-the-fraction-clips",
        "clips-before-the-block-count-towards-its-windows",
        "a-run-inside-warmup-is-learned",
        "a-run-crossing-the-end-of-warmup",
        "warmup-ends-where-a-block-starts",
        "warmup-ends-on-the-last-line-of-a-block",
        "episodes-resolve-inside-blocks",
    ],
)
def test_grad_norm_run_edges(
    config: dict[str, Any], grads: list[float], cut: int | None, expected: list[tuple[int, str]]
) -> None:
    result = both(GradNormRunDetector, GradNormRunConfig(**config), lines(grad_norm=grads), cut=cut)
    assert raised(result) == expected


# --- loss_plateau -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("feed", FEEDS)
def test_loss_plateau_raises_the_same_through_blocks(feed: dict[str, bool]) -> None:
    config = LossPlateauConfig(window=40, edge_values=5, min_improvement=0.02, high_fraction=0.8)
    texts = troubled_jsonl(2, timestamps=feed["timestamps"])
    kinds = {
        kind for _, kind in raised(both(LossPlateauDetector, config, texts, feed["data_clock"]))
    }
    assert kinds == {"plateau", "recovered"}


#: The first five values make the initial level 10, so the "still high" bar is 9.
_START = [10.0] * 5
_SMALL: dict[str, Any] = {"window": 20, "edge_values": 5}


def _falling(start: float, count: int) -> list[float]:
    return [start * 0.998**index for index in range(count)]


#: With ``high_fraction`` 0.2 the "still high" bar is 8. Steps from 56 on are under it,
#: but the window's last four before step 56 are not (12), and the loss stopped
#: improving there (the window of step 56 starts at the 12.1s): only the tail of the
#: window before a block starting at step 56 says its first line is a plateau.
_UNDER_THE_TAIL = [
    *[40.0] * 5,
    *[40.0 - 0.9 * index for index in range(30)],
    *[13.0] * 3,
    *[12.1] * 3,
    *[12.0] * 14,
    *[5.0] * 60,
]


_FLAT = [2.3] * 160


@pytest.mark.parametrize(
    ("config", "losses", "cut", "expected"),
    [
        (_SMALL, _FLAT[:19], None, []),
        (_SMALL, _FLAT, 20, [(20, "plateau")]),
        ({"window": 16, "edge_values": 5}, _FLAT, 17, [(16, "plateau")]),
        (_SMALL, [*_START, *[5.0] * 40, 20.0, 20.0, *[5.0] * 100], None, []),
        (
            {**_SMALL, "high_fraction": 0.5},
            [*_START, *[4.8] * 40, *[6.0] * 3, *[4.8] * 100],
            None,
            [(48, "plateau"), (51, "recovered")],
        ),
        (_SMALL, [*_START, *[5.0] * 40, 20.0, 5.0, 20.0, *[5.0] * 100], None, []),
        (_SMALL, [*_FLAT[:20], 2.0, 2.0, *_FLAT[:100]], None, [(20, "plateau")]),
        (
            _SMALL,
            [*_FLAT[:20], 2.0, 2.0, 2.0, *_FLAT[:100]],
            None,
            [(20, "plateau"), (23, "recovered"), (43, "plateau")],
        ),
        (
            {**_SMALL, "high_fraction": 0.5},
            [*_falling(4.0, 120), *[3.1] * 100],
            None,
            [(138, "plateau")],
        ),
        ({**_SMALL, "warmup_steps": 30}, _FLAT, None, [(49, "plateau")]),
        ({**_SMALL, "warmup_steps": 30}, _FLAT, 28, [(49, "plateau")]),
        ({**_SMALL, "warmup_steps": 30}, _FLAT, 30, [(49, "plateau")]),
        (
            {**_SMALL, "high_fraction": 0.2},
            _UNDER_THE_TAIL,
            55,
            [(56, "plateau"), (58, "recovered")],
        ),
        (_SMALL, [-1.0] * 100, None, []),
    ],
    ids=[
        "the-window-one-short-of-full",
        "the-window-fills-on-the-last-line-of-a-block",
        "the-initial-level-set-inside-a-block",
        "two-of-five-above-the-high-bar-stay-converged",
        "three-of-five-above-the-high-bar-are-judged",
        "two-of-five-spread-stay-converged",
        "two-of-five-under-the-episode-bar-stay-open",
        "three-of-five-under-the-episode-bar-resolve",
        "a-falling-loss-improves-until-it-flattens",
        "warmup-steps-end-inside-a-block",
        "warmup-steps-end-where-a-block-starts",
        "warmup-steps-end-on-the-last-line-of-a-block",
        "the-window-tail-before-a-block-keeps-it-high",
        "a-level-at-or-below-zero-is-never-judged",
    ],
)
def test_loss_plateau_edges(
    config: dict[str, Any], losses: list[float], cut: int | None, expected: list[tuple[int, str]]
) -> None:
    result = both(LossPlateauDetector, LossPlateauConfig(**config), lines(loss=losses), cut=cut)
    assert raised(result) == expected


def test_loss_plateau_lr_warmup_ending_inside_a_block() -> None:
    # Steps 1 and 2 are judged before two learning rates told the LR rises; then steps
    # 3-31 are warmup (step 31's loss comes before its falling lr). The window holds
    # steps 1, 2 and 32-49.
    rates = [*_RATES, *[2e-4] * 70]
    texts = lines(loss=_FLAT, lr=rates)
    assert raised(both(LossPlateauDetector, LossPlateauConfig(**_SMALL), texts)) == [
        (49, "plateau")
    ]
