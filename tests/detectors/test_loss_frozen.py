"""loss_frozen: a training loss that logs the very same value again and again."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.loss_frozen import (
    LossFrozenConfig,
    LossFrozenDetector,
    classes_of,
    significant_digits,
)
from tests.detectors.blockcheck import run

NOW = 1_700_000_000.0


def feed(values: Sequence[float], *, first_step: int = 1, **config: int) -> list[Alert]:
    detector = LossFrozenDetector(LossFrozenConfig(**config))
    alerts: list[Alert] = []
    for index, value in enumerate(values):
        alerts += detector.observe(Sample("loss", value, first_step + index), "train.log", NOW)
    return alerts


def test_a_binary_classifier_stuck_at_ln_2_warns_at_its_tenth_value_naming_ln_2() -> None:
    """A real TF run (its issue thread's log): 0.6931 from step 8 on."""
    (alert,) = feed([0.68, 2.46, 1.2, 10.69, 3.1, 0.9, 0.71] + [0.6931] * 20)
    assert (alert.severity, alert.step, alert.onset_step) == (Severity.WARNING, 17, 8)
    assert alert.details == {"kind": "frozen", "repeats": 10, "since": 8, "classes": 2}
    assert "exactly 0.6931 for 10 logged values" in alert.message
    assert "ln 2" in alert.message


def test_it_resolves_when_the_loss_moves_and_a_new_run_warns_again() -> None:
    alerts = feed([2.3026] * 10 + [2.29] + [2.3026] * 10)
    assert [(a.severity, a.resolves, a.step) for a in alerts] == [
        (Severity.WARNING, False, 10),
        (Severity.INFO, True, 11),
        (Severity.WARNING, False, 21),
    ]
    assert alerts[0].details["classes"] == 10


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([0.0002] * 30, id="a-loss-near-0-at-four-decimals"),
        pytest.param([0.0] * 30, id="exactly-0-is-nan_ins"),
        pytest.param([1.2345] * 9 + [1.2346], id="nine-in-a-row"),
        pytest.param([2.0 + 0.0001 * math.sin(i) for i in range(40)], id="flat-but-moving"),
        pytest.param([0.5, math.nan] * 20, id="a-nan-between-breaks-the-run"),
    ],
)
def test_what_is_not_a_frozen_loss(values: list[float]) -> None:
    assert feed(values) == []


def test_repeats_and_min_digits_are_settings() -> None:
    assert [a.step for a in feed([0.69] * 6, repeats=5, min_digits=2)] == [5]
    assert feed([0.69] * 6, repeats=5) == []


@pytest.mark.parametrize(
    ("value", "digits"),
    [
        (0.6931, 4),
        (0.0002, 1),
        (100.0, 1),
        (0.0, 0),
        (2.302585092994046, 7),
        (1.5e-05, 2),
        (0.1 + 0.2, 1),
        (0.0002 * 1.3, 2),
    ],
)
def test_significant_digits_as_logged(value: float, digits: int) -> None:
    assert significant_digits(value) == digits


@pytest.mark.parametrize(
    ("value", "classes"),
    [(0.6931, 2), (2.3026, 10), (6.9078, 1000), (10.8249, 50257), (1.5, None), (0.3, None)],
)
def test_ln_k_is_named_for_a_uniform_guess(value: float, classes: int | None) -> None:
    assert classes_of(value) == classes


def test_a_block_of_lines_says_what_line_by_line_says() -> None:
    """Replay in blocks: a block that would complete a frozen run is refused; one that
    continues a run, or holds repeats too coarse to judge, is taken whole."""
    losses = (
        [3.0 - i / 500 for i in range(300)] + [0.6931] * 30 + [0.65 - i / 1e4 for i in range(80)]
    )
    losses += [0.0002] * 100 + [1.1111] * 5 + [1.2] * 40
    texts = [json.dumps({"step": i + 1, "loss": v}) for i, v in enumerate(losses)]

    def only() -> list[LossFrozenDetector]:
        return [LossFrozenDetector(LossFrozenConfig())]

    line_by_line = run(only, texts, blocks=False)
    blocks = run(only, texts, blocks=True)
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    assert blocks.lines_absorbed > len(texts) // 2
    assert [(alert[1], alert[9]) for alert in blocks.alerts] == [
        ("warning", False),
        ("info", True),
    ]


FULLBATCH = Path(__file__).resolve().parents[1] / "fixtures" / "fullbatch" / "train.log"


def test_a_converged_loss_creeping_under_its_printed_precision_is_not_frozen() -> None:
    """A real converged full-batch run printed to 4 decimals (``make_fullbatch.py``): its
    loss repeats ten times and more at 0.0379, then 0.0378, 0.0377, 0.0376, with bumps in
    between. Each run one printed digit from an earlier one creeps: no warning (there were
    four, "no longer depends on its input"). The same in blocks; and a loss that comes back
    to its very value after a blip is still frozen (the ln 10 test above)."""
    values = [
        float(line.split("loss: ")[1].split()[0]) for line in FULLBATCH.read_text().splitlines()
    ]
    assert feed(values) == []
    stairs = [0.0381, 0.0392] + [0.0380] * 12 + [0.0395] + [0.0379] * 12 + [0.0401] + [0.0378] * 12
    assert feed(stairs) == []
    texts = [json.dumps({"step": i + 1, "loss": v}) for i, v in enumerate(values * 3)]

    def only() -> list[LossFrozenDetector]:
        return [LossFrozenDetector(LossFrozenConfig())]

    line_by_line = run(only, texts, blocks=False)
    blocks = run(only, texts, blocks=True)
    assert (blocks.alerts, blocks.state) == (line_by_line.alerts, line_by_line.state)


@pytest.mark.parametrize(
    ("values", "classes"),
    [
        # A FractalNet on CIFAR-10 (keras-team/keras issue): every epoch at ln 10.
        ([2.3030, 2.3030, 2.3029, 2.3029, 2.3030, 2.3028, 2.3029, 2.3030, 2.3029, 2.3029], 10),
        # A DINO run collapsed to a uniform output over its 65,536 prototypes.
        ([11.0879 + 0.00005 * i for i in range(10)], 65536),
    ],
    ids=["ln-10", "ln-2-to-the-16"],
)
def test_a_loss_that_stays_at_a_chance_level_warns(values: list[float], classes: int) -> None:
    detector = LossFrozenDetector(LossFrozenConfig())
    alerts = [
        a
        for step, v in enumerate(values)
        for a in detector.observe(Sample("loss", v, step), "x", 0.0)
    ]
    assert [(a.severity, a.details["kind"], a.details["classes"]) for a in alerts] == [
        (Severity.WARNING, "chance", classes)
    ]
    assert f"ln {classes}" in alerts[0].message
    back = detector.observe(Sample("loss", 1.9, 10), "x", 0.0)
    assert [(a.severity, a.resolves) for a in back] == [(Severity.INFO, True)]


@pytest.mark.parametrize(
    "values",
    [
        [2.3030, 2.3030, 2.3029, 2.3029, 2.3030, 2.2100, 2.3029, 2.3030, 2.3029, 2.3029],  # moved
        [2.302, 2.3, 2.302, 2.3, 2.302, 2.3, 2.302, 2.3, 2.302, 2.3],  # every other: 2 digits
        [5.8103 + 0.0001 * i for i in range(10)],  # ln 333.7: no K told at that precision
    ],
    ids=["a-value-off-the-level", "too-few-digits", "no-chance-level"],
)
def test_values_near_but_not_at_a_chance_level_raise_nothing(values: list[float]) -> None:
    detector = LossFrozenDetector(LossFrozenConfig())
    assert [
        a for s, v in enumerate(values) for a in detector.observe(Sample("loss", v, s), "x", 0.0)
    ] == []


def test_grad_norms_of_exactly_0_in_a_row_are_no_gradient() -> None:
    """A TRL DPO run (its issue): loss 0.6934 and ``'grad_norm': 0.0`` on every line."""
    detector = LossFrozenDetector(LossFrozenConfig())
    alerts: list[Alert] = []
    for step in (10, 20, 30):
        alerts += detector.observe(Sample("loss", 0.6934, step), "x", 0.0)
        alerts += detector.observe(Sample("grad_norm", 0.0, step), "x", 0.0)
    assert [(a.severity, a.step, a.onset_step, a.details["kind"]) for a in alerts] == [
        (Severity.WARNING, 30, 10, "no_gradient")
    ]
    back = detector.observe(Sample("grad_norm", 0.4, 40), "x", 0.0)
    assert [(a.severity, a.resolves) for a in back] == [(Severity.INFO, True)]


def test_a_zero_grad_norm_now_and_then_is_no_alarm() -> None:
    detector = LossFrozenDetector(LossFrozenConfig())
    values = [0.5, 0.0, 0.4, 0.0, 0.0, 0.3, 0.0]
    assert [
        a
        for s, v in enumerate(values)
        for a in detector.observe(Sample("grad_norm", v, s), "x", 0.0)
    ] == []
