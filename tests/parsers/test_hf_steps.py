"""HF Trainer stdout: each printed dict at the step ``trainer_state.json`` names for it.

The captures are real (``tests/fixtures/make_hf_steps.py``): 2 epochs of 24 steps,
``logging_steps=4`` and an evaluation every 6 steps, printed by transformers 5.x
(every value a ``.4g`` string) and 4.x (bare floats), with stdout buffered and not,
with the tqdm bar and with ``disable_tqdm=True``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from sentinel.parsers import LineParser
from sentinel.parsers.hf_steps import HfSteps

FIXTURES = Path(__file__).parent.parent / "fixtures" / "hf_steps"
CAPTURES = ["tqdm.log", "tqdm.unbuffered.log", "notqdm.log", "notqdm.unbuffered.log"]
VERSIONS = ["", "v4."]


def _truth(prefix: str) -> list[int]:
    return list(json.loads((FIXTURES / f"{prefix}expected.json").read_text())["steps"])


def _dict_steps(parser: LineParser, capture: Path) -> list[int | None]:
    """The step of each printed dict's loss or eval_loss, in print order."""
    steps: list[int | None] = []
    # Bytes: read_text would turn each \r into a line end.
    for line in capture.read_bytes().decode("utf-8").split("\n"):
        steps += [s.step for s in parser.parse(line) if s.name in ("loss", "eval_loss")]
    return steps


@pytest.mark.parametrize("prefix", VERSIONS, ids=["v5", "v4"])
@pytest.mark.parametrize("capture", CAPTURES)
def test_trainer_state_gives_every_dict_its_step(prefix: str, capture: str) -> None:
    parser = LineParser()
    assert parser.learn_trainer_state((FIXTURES / f"{prefix}trainer_state.json").read_text())
    assert _dict_steps(parser, FIXTURES / f"{prefix}{capture}") == _truth(prefix)


@pytest.mark.parametrize("prefix", VERSIONS, ids=["v5", "v4"])
def test_unbuffered_bar_teaches_steps_per_epoch(prefix: str) -> None:
    """The bar redrawn after each dict shows its step: once two dicts agree, every step is
    exact; before, none is made up (the engine gives those the bar's step)."""
    steps = _dict_steps(LineParser(), FIXTURES / f"{prefix}tqdm.unbuffered.log")
    truth = _truth(prefix)
    assert all(step is None or step == true for step, true in zip(steps, truth, strict=True))
    assert steps[-12:] == truth[-12:]
    assert steps[0] is None


@pytest.mark.parametrize("prefix", VERSIONS, ids=["v5", "v4"])
def test_buffered_output_teaches_nothing_wrong(prefix: str) -> None:
    """With stdout buffered the bar after a dict is another step's: no step is made up."""
    assert set(_dict_steps(LineParser(), FIXTURES / f"{prefix}tqdm.log")) == {None}


def test_eval_dict_between_logging_steps_gets_its_own_step() -> None:
    """An evaluation at step 6 (logging every 4) is at 6, not at the last logged step."""
    parser = LineParser()
    parser.learn_trainer_state((FIXTURES / "trainer_state.json").read_text())
    found = parser.parse(
        "{'eval_loss': '3.897', 'eval_runtime': '0.0055', 'eval_samples_per_second': '2906',"
        " 'eval_steps_per_second': '363.3', 'epoch': '0.25'}"
    )
    assert {s.step for s in found} == {6}


@pytest.mark.parametrize(
    ("epoch", "bar", "expected"),
    [
        pytest.param(0.5, None, 5000, id="exact"),
        pytest.param(1.235, 12345, 12345, id="rounded-epoch-bar-inside"),
        pytest.param(1.235, 12000, 12345, id="rounded-epoch-bar-before-clamped"),
    ],
)
def test_rounded_epoch_picks_the_step_nearest_the_bar(
    epoch: float, bar: int | None, expected: int
) -> None:
    """Past a thousand steps a 4-digit epoch names several steps: the bar picks one."""
    steps = HfSteps(steps_per_epoch=10_000)
    if bar is not None:
        steps.process(f" 12%|█ | {bar}/30000 [00:01<00:19,  9.81it/s]", [])
    found = steps.process(
        f"{{'loss': '1.0', 'epoch': '{epoch}'}}",
        LineParser().parse(f"{{'loss': '1.0', 'epoch': '{epoch}'}}"),
    )
    assert {s.step for s in found} == {expected}


def test_no_step_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    parser = LineParser()
    with caplog.at_level(logging.WARNING, logger="sentinel.parsers.line_parser"):
        for _ in range(3):
            assert [s.step for s in parser.parse("loss=1.5 acc=0.5")] == [None, None]
    assert len([r for r in caplog.records if "names no step" in r.getMessage()]) == 1


def test_no_notice_once_a_step_was_seen(caplog: pytest.LogCaptureFixture) -> None:
    parser = LineParser()
    with caplog.at_level(logging.WARNING, logger="sentinel.parsers.line_parser"):
        parser.parse("step 3 loss 1.5")
        parser.parse("loss=1.5")
    assert not [r for r in caplog.records if "names no step" in r.getMessage()]
