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

from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.parsing import LineParser
from sentinel.parsing.hf_steps import HfSteps

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
    """With stdout buffered the bar after a dict is mostly another step's: no step is
    made up (no two pairs in a row agree)."""
    steps = _dict_steps(LineParser(), FIXTURES / f"{prefix}tqdm.log")
    truth = _truth(prefix)
    assert all(step is None or step == true for step, true in zip(steps, truth, strict=True))


def _live(capture: Path) -> list[str]:
    """The lines of a capture as ``run`` reads a job's terminal: ``\r`` ends a line, and
    blank lines (a bar tqdm cleared to print a dict) are dropped."""
    text = capture.read_bytes().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    return [line for line in text.split("\n") if line.strip()]


@pytest.mark.parametrize("prefix", VERSIONS, ids=["v5", "v4"])
def test_live_output_gives_every_dict_but_the_first_its_exact_step(prefix: str) -> None:
    """Read live, a dict is its own line and the bar redrawn after it the next (5.x: the
    first two pairs, whose bounds hold the bar's total (48) over two epochs, teach 24
    steps per epoch exactly). Before, no pair was taken live and the bar alone put 5.x's
    dicts up to a logging interval early."""
    parser = LineParser()
    steps: list[int | None] = []
    for line in _live(FIXTURES / f"{prefix}tqdm.unbuffered.log"):
        steps += [s.step for s in parser.parse(line) if s.name in ("loss", "eval_loss")]
    truth = _truth(prefix)
    assert all(step is None or step == true for step, true in zip(steps, truth, strict=True))
    assert steps[:2] == [None, None]  # before two pairs agree: the engine's to place
    if prefix == "":
        assert steps[2:] == truth[2:]
        assert parser._hf.steps_per_epoch == 24.0
    else:  # two decimals: the epochs past 0.5 bound it within 2%, pairs that agree teach it
        assert steps[-12:] == truth[-12:]


def _feed(steps: HfSteps, line: str) -> list[int | None]:
    """``line`` read as ``LineParser`` reads it: the steps of its samples."""
    return [s.step for s in steps.process(line, LineParser().parse(line)) if s.name == "loss"]


def _bar(count: int, total: int) -> str:
    return f" 10%|#         | {count}/{total} [00:01<00:09, 9.81it/s]"


def test_pairs_on_a_whole_number_of_epochs_are_exact() -> None:
    """3 epochs of 1362 steps (a 4086-step bar): the bars redrawn after the first two
    dicts (steps 50 and 100) teach 1362, not 100 / 0.07342 = 1362.03; one pair alone
    teaches nothing (it may be another step's bar)."""
    steps = HfSteps()
    for step, epoch in ((50, "0.03671"), (100, "0.07342")):
        assert steps.steps_per_epoch is None
        _feed(steps, _bar(step - 1, 4086))
        _feed(steps, f"{{'loss': '2.5', 'epoch': '{epoch}'}}")
        _feed(steps, _bar(step, 4086))
    assert steps.steps_per_epoch == 1362.0


def test_max_steps_off_a_whole_epoch_needs_two_pairs_that_agree() -> None:
    """A 40-step bar over 64-step epochs (``max_steps``): no whole number of epochs, so
    one pair teaches nothing; two that agree do."""
    steps = HfSteps()
    for step in (10, 20):
        _feed(steps, _bar(step - 1, 40))
        _feed(steps, f"{{'loss': '2.5', 'epoch': '{format(step / 64, '.4g')}'}}")
        _feed(steps, _bar(step, 40))
        if step == 10:
            assert steps.steps_per_epoch is None
    assert steps.steps_per_epoch == pytest.approx(64, rel=1e-3)


def test_two_decimal_epochs_take_the_step_on_the_logging_interval_nearest_the_bar() -> None:
    """Older 4.x prints ``'epoch': 0.18``: at 1362 steps per epoch that is any step from
    239 to 251. Training dicts 10 steps apart teach the interval; the dict at 250 is read
    at 250 though the bar still shows 247."""
    steps = HfSteps(steps_per_epoch=1362)
    found: list[int | None] = []
    for step, bar in ((10, 10), (20, 20), (30, 30), (250, 247)):
        _feed(steps, _bar(bar, 4086))
        found += _feed(steps, f"{{'loss': 1.89, 'epoch': {round(step / 1362, 2)}}}")
    assert found == [10, 20, 30, 250]


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
    with caplog.at_level(logging.WARNING, logger="sentinel.parsing.line_parser"):
        for _ in range(3):
            assert [s.step for s in parser.parse("loss=1.5 acc=0.5")] == [None, None]
    said = [r.getMessage() for r in caplog.records if "names no step" in r.getMessage()]
    assert len(said) == 1
    assert "[parsers] regexes" in said[0] and "--regex" not in said[0]  # an option that exists


def test_no_notice_once_a_step_was_seen(caplog: pytest.LogCaptureFixture) -> None:
    parser = LineParser()
    with caplog.at_level(logging.WARNING, logger="sentinel.parsing.line_parser"):
        parser.parse("step 3 loss 1.5")
        parser.parse("loss=1.5")
    assert not [r for r in caplog.records if "names no step" in r.getMessage()]


def test_what_the_bars_taught_is_forgotten_when_they_stop_showing_the_dicts_steps() -> None:
    """Bars and dicts from two pipes reach sentinel in no sure order: once two dicts in a
    row are not at the bar read after them, the steps per epoch they taught are dropped
    (the engine gives the dicts the bar's step again), and learned afresh."""
    steps = HfSteps()
    for step in (4, 8):  # one stream, in order: 16 steps per epoch
        _feed(steps, _bar(step - 1, 32))
        _feed(steps, f"{{'loss': '2.5', 'epoch': '{step / 16:.4g}'}}")
        _feed(steps, _bar(step, 32))
    assert steps.steps_per_epoch == 16.0
    assert _feed(steps, "{'loss': '2.5', 'epoch': '0.75'}") == [12]
    _feed(steps, _bar(9, 32))  # a bar read late
    assert _feed(steps, "{'loss': '2.5', 'epoch': '1'}") == [16]
    _feed(steps, _bar(10, 32))
    assert steps.steps_per_epoch is None
    assert _feed(steps, "{'loss': '2.5', 'epoch': '1.25'}") == [None]


def test_a_set_logging_cadence_leaves_the_steps_to_the_engine() -> None:
    """With ``[parsers] logging_steps`` set the engine counts the dicts' steps; the bars
    teach nothing (a dict's own step would keep it from counting that dict)."""
    parser = LineParser(logging_steps=4)
    steps: list[int | None] = []
    for line in _live(FIXTURES / "tqdm.unbuffered.log"):
        steps += [s.step for s in parser.parse(line) if s.name in ("loss", "eval_loss")]
    assert set(steps) == {None}


def test_bars_and_dicts_out_of_order_are_said_once_not_at_every_dict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """stdout and stderr interleaved out of order: each dict lands two bars after its step.
    The bars teach, the next dicts contradict them, and then they teach no more: a couple
    of lines in the log, not two per dict (issue 29: 73,795 lines for a 30,000-line log)."""
    lines = []
    for step in range(1, 3001):
        lines.append(f" {step // 30}%|#####     | {step}/3000 [00:{step % 60:02d}<00:10,  9.1it/s]")
        if step % 5 == 0:
            lines.append(
                f"{{'loss': {2.0 - step / 3000:.4f}, 'grad_norm': 1.0,"
                f" 'learning_rate': 5e-05, 'epoch': {(step - 2) / 1000:.2f}}}"
            )
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.INFO, logger="sentinel"):
        result = replay([log], load_settings(None, environ={}))
    said = [r.getMessage() for r in caplog.records if r.name.startswith("sentinel.parsing")]
    assert len(said) <= 4, said
    assert result.samples >= 600 * 3
