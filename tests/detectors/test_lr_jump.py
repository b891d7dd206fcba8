"""lr_jump: a jump of the logged learning rate no schedule explains warns; with the loss it
acts, and its onset sends the rollback to before the rate changed. Schedules (warmups from
0, decays, restarts, cycles) never raise it, at any cadence."""

from __future__ import annotations

import json
import math

import pytest

from sentinel.config import load_settings
from sentinel.engine.core import Engine, build_detectors
from sentinel.model.records import Alert, Severity
from sentinel.parsing import LineParser
from sentinel.rules.lr_jump import LrJumpConfig, LrJumpDetector
from tests.detectors.test_paths_agree import assert_paths_agree


def _log(records: list[dict[str, float]]) -> list[str]:
    return [json.dumps(record) for record in records]


def _alerts(texts: list[str], **rules: object) -> list[Alert]:
    environ = {f"SENTINEL_RULES__LR_JUMP__{k.upper()}": str(v) for k, v in rules.items()}
    settings = load_settings(None, environ=environ)
    engine = Engine(build_detectors(settings), LineParser(), data_clock=True)
    found: list[Alert] = []
    for text in texts:
        found += engine.feed_texts("train.log", [text], 0.0)
    return [alert for alert in found if alert.rule == "lr_jump"]


def _run(lrs: list[float], losses: list[float], every: int = 5, first: int = 5) -> list[str]:
    return _log([
        {"step": first + index * every, "loss": loss, "learning_rate": lr}
        for index, (lr, loss) in enumerate(zip(lrs, losses, strict=True))
    ])  # fmt: skip


@pytest.mark.parametrize("every", [1, 5, 100, 500])
@pytest.mark.parametrize("before", [2, 5, 30])
def test_a_jump_that_the_loss_follows_acts_with_its_onset_at_the_last_rate_before(
    every: int, before: int
) -> None:
    lrs = [1e-3] * before + [0.12] * 6
    losses = [3.0 - 0.01 * i for i in range(before)] + [4.7, 8.7, 7.2, 4.6, 4.6, 4.6]
    alerts = _alerts(_run(lrs, losses, every=every))
    assert [(a.severity, a.details["kind"]) for a in alerts] == [
        (Severity.WARNING, "jump"),
        (Severity.CRITICAL, "with_loss"),
    ]
    last_before = 5 + (before - 1) * every
    jump_step = last_before + every
    # The onset is the last step logged at the old rate: a checkpoint saved there may
    # already hold the new one (the Trainer saves after the scheduler's step).
    assert all(a.onset_step == last_before for a in alerts)
    assert alerts[0].step == jump_step
    assert alerts[1].step == jump_step + every, "acts on the second loss value since the jump"
    assert alerts[0].details["lr_jump"] == [jump_step, 1e-3, 0.12]
    assert alerts[1].details["loss_ratio"] > 1.3


def test_a_jump_the_loss_does_not_follow_stays_a_warning() -> None:
    lrs = [1e-3] * 10 + [0.05] * 20
    losses = [2.0 + 0.01 * math.sin(i) for i in range(30)]
    alerts = _alerts(_run(lrs, losses))
    assert [a.severity for a in alerts] == [Severity.WARNING]


def test_a_loss_at_or_below_zero_is_not_judged_by_a_ratio() -> None:
    lrs = [1e-3] * 10 + [0.05] * 10
    losses = [-0.5] * 10 + [-0.1] * 10
    alerts = _alerts(_run(lrs, losses))
    assert [a.severity for a in alerts] == [Severity.WARNING]


@pytest.mark.parametrize(("rise", "acts"), [(3.0, True), (0.02, False)])
def test_a_loss_below_zero_is_judged_by_its_noise(rise: float, acts: bool) -> None:
    """A Gaussian NLL near -2.4 (noise about 0.05 from one value to the next): a rise of
    3 after the jump is far outside its noise and acts; one of 0.02 is within it and
    the jump stays a warning. No ratio is taken of a level below 0."""
    wobbles = [0.04 * math.sin(1.7 * i) for i in range(40)]
    lrs = [1e-3] * 30 + [0.05] * 10
    losses = [-2.4 + w for w in wobbles[:30]] + [-2.4 + rise + w for w in wobbles[30:]]
    alerts = _alerts(_run(lrs, losses))
    expected = [Severity.WARNING, Severity.CRITICAL] if acts else [Severity.WARNING]
    assert [a.severity for a in alerts] == expected
    if acts:
        assert alerts[1].details["loss_ratio"] is None
        assert "noise deviations above its level -2.4" in alerts[1].message


def test_the_rise_needed_to_act_is_the_setting() -> None:
    lrs = [1e-3] * 10 + [0.05] * 10
    losses = [2.0] * 10 + [2.8] * 10  # 1.4x
    assert [a.severity for a in _alerts(_run(lrs, losses))][-1] == Severity.CRITICAL
    quiet = _alerts(_run(lrs, losses), loss_rise=1.5)
    assert [a.severity for a in quiet] == [Severity.WARNING]


def _warmup_cosine(steps: int, peak: float, warmup: int, start: float = 0.0) -> list[float]:
    out = []
    for step in range(1, steps + 1):
        if step <= warmup:
            out.append(start + (peak - start) * step / warmup)
        else:
            progress = (step - warmup) / (steps - warmup)
            out.append(0.5 * peak * (1 + math.cos(math.pi * progress)))
    return out


def _restarts(steps: int, peak: float, period: int) -> list[float]:
    """Cosine annealing with warm restarts (SGDR): back to the peak every ``period``."""
    return [
        1e-6 + 0.5 * (peak - 1e-6) * (1 + math.cos(math.pi * (step % period) / period))
        for step in range(steps)
    ]


def _one_cycle(steps: int, peak: float) -> list[float]:
    """torch's OneCycleLR: from peak/25 up to the peak over 30%, then down to peak/1e4."""
    up = int(0.3 * steps)
    return [
        peak / 25 + (peak - peak / 25) * step / up
        if step < up
        else peak * (1e-4 + (1 - 1e-4) * 0.5 * (1 + math.cos(math.pi * (step - up) / (steps - up))))
        for step in range(steps)
    ]


SCHEDULES = {
    "warmup from 0, cosine": _warmup_cosine(3000, 5e-4, 100),
    "warmup from 1e-3 x peak (LinearLR)": _warmup_cosine(3000, 5e-4, 100, start=5e-7),
    "warm restarts every 500": _restarts(3000, 1e-3, 500),
    "one cycle": _one_cycle(3000, 1e-2),
    "step decay x0.1": [1e-2 * 0.1 ** (step // 1000) for step in range(3000)],
}


@pytest.mark.parametrize("every", [1, 10, 100, 500])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_no_schedule_is_a_jump_at_any_cadence(schedule: str, every: int) -> None:
    rates = SCHEDULES[schedule]
    logged = rates[every - 1 :: every]
    losses = [2.0 + 0.3 * math.sin(i) for i in range(len(logged))]
    assert _alerts(_run(logged, losses, every=every, first=every)) == []


def test_a_new_attempt_judges_its_own_rates() -> None:
    """A resume logs its rates afresh: the jump of the first attempt is not carried over."""
    detector = LrJumpDetector(LrJumpConfig())
    settings = load_settings(None, environ={})
    engine = Engine([detector], LineParser(), data_clock=True)
    engine.facts = settings.run_facts()
    for text in _run([1e-3] * 5 + [0.1], [2.0] * 6):
        engine.feed_texts("train.log", [text], 0.0)
    engine.job_started(0.0, start_step=20)
    found = []
    for text in _run([0.1] * 6, [2.0] * 6, first=21):
        found += engine.feed_texts("train.log", [text], 0.0)
    assert found == []


def test_a_jump_is_read_the_same_line_by_line_and_in_blocks() -> None:
    lrs = [1e-3 / (1 + 0.01 * i) for i in range(60)] + [0.2] * 60
    losses = [2.0 - 0.005 * i for i in range(60)] + [3.5] * 60
    texts = _run(lrs, losses, every=1)
    assert_paths_agree(LrJumpDetector, LrJumpConfig(), texts, replay=True)
    assert [a.severity for a in _alerts(texts)] == [Severity.WARNING, Severity.CRITICAL]


def test_a_jump_in_records_that_name_no_step_acts_as_live() -> None:
    """The Trainer's dicts with ``disable_tqdm`` and no ``trainer_state.json`` name no step
    (a real run's, every 50 steps, its rate x100 at the 7th). The loss of the jump's own
    record ran on the new rate, as a step would say: replay acts on the second value, as
    the live run did (it had the steps), not a warning alone."""
    losses = [3.417, 2.824, 2.343, 1.961, 1.673, 1.473, 2.13, 1.856, 1.699, 1.536]
    texts = [
        str({"loss": str(loss), "grad_norm": "0.7", "learning_rate": "0.05" if i >= 6 else "0.0005",
             "epoch": str(round(0.2 * (i + 1), 1))})
        for i, loss in enumerate(losses)
    ]  # fmt: skip
    alerts = _alerts(texts)
    assert [(a.severity, a.details["kind"]) for a in alerts] == [
        (Severity.WARNING, "jump"),
        (Severity.CRITICAL, "with_loss"),
    ]
    assert alerts[1].details["loss_since"][:2] == [2.13, 1.856]
    assert "step None" not in alerts[0].message + alerts[1].message


def test_another_run_from_its_start_in_the_same_log_is_no_jump() -> None:
    """Keras' CSVLogger(append=True) appends each fit to one file: a log seen from the
    middle of the first (its rate decayed to 1e-4) whose second starts again at 1e-3 from
    epoch 0, its loss back at its start. A resume to a step in between with the rate 10x is
    the same run's schedule, and still a jump."""
    first = _log([{"epoch": 5 + i, "loss": 0.5 - 0.01 * i, "lr": 1e-4} for i in range(5)])
    again = _log([{"epoch": i, "loss": 1.2 - 0.05 * i, "lr": 1e-3} for i in range(4)])
    assert _alerts(first + again) == []
    resumed = _log([{"epoch": 7 + i, "loss": 1.2 - 0.05 * i, "lr": 1e-3} for i in range(4)])
    assert [a.severity for a in _alerts(first + resumed)][-1] == Severity.CRITICAL
