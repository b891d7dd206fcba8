"""divergence: a loss that shifts up and does not come back is critical, with its onset."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import pydantic
import pytest

from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.divergence import DivergenceConfig, DivergenceDetector, crept, never_creeps

NOW = 1_700_000_000.0
CRIT, INFO = Severity.CRITICAL, Severity.INFO


def noisy(level: float, count: int, noise: float = 0.02, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rng.gauss(0, noise)) for _ in range(count)]


def feed(values: Sequence[float], lrs: Sequence[float] | None = None, **config: Any) -> list[Alert]:
    detector = DivergenceDetector(DivergenceConfig(**config))
    alerts: list[Alert] = []
    for index, value in enumerate(values):
        step = index + 1
        if lrs is not None:
            alerts += detector.observe(Sample("lr", lrs[index], step), "log", NOW)
        alerts += detector.observe(Sample("loss", value, step), "log", NOW)
    return alerts


def summary(alerts: Sequence[Alert]) -> list[tuple[Severity, int | None, int | None]]:
    return [(alert.severity, alert.step, alert.onset_step) for alert in alerts]


def test_a_shift_that_stays_up_is_critical_with_its_onset() -> None:
    values = noisy(2.0, 40) + noisy(3.2, 30, seed=8)
    alerts = feed(values)
    assert summary(alerts) == [(CRIT, 50, 41)]
    details = alerts[0].details
    assert details["kind"] == "unrecovered"
    assert 1.5 < details["ratio"] < 1.7
    assert details["steps"][-1] == 50 and 41 in details["steps"]
    assert "shifted up at step 41" in alerts[0].message


@pytest.mark.parametrize("before", [20, 30, 45])
def test_a_shift_after_a_fast_descent_is_judged_against_where_the_run_settled(
    before: int,
) -> None:
    """The run fell fast before it settled (10 -> 2 in its first values): those values are
    its descent, not the top of its wobble. A shift x2 that stays, under the first of them,
    is still a shift from where the run is (a real CIFAR run shifted x2 after 20 epochs
    went unreported when they set the bar)."""
    descent = [10.0, 6.0, 4.0, 3.0, 2.5]
    values = descent + noisy(1.9, before - len(descent)) + noisy(3.8, 15, seed=8)
    assert max(values[before:]) < max(descent[:3])  # under the descent's top: no envelope
    assert summary(feed(values)) == [(CRIT, before + 10, before + 1)]


def test_a_spike_that_recovers_is_not_a_divergence() -> None:
    values = [*noisy(2.0, 40), 8.0, 6.0, 4.0, 2.1, *noisy(2.0, 30, seed=9)]
    assert feed(values) == []


def test_a_confirmed_shift_resolves_when_the_loss_comes_back() -> None:
    values = noisy(2.0, 40) + noisy(3.0, 15, seed=8) + noisy(2.0, 5, seed=9)
    assert summary(feed(values)) == [(CRIT, 50, 41), (INFO, 56, 41)]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(noisy(2.0, 200, noise=0.1), id="healthy-noise"),
        pytest.param([4.0 * 0.995**i for i in range(200)], id="falling-loss"),
        pytest.param(noisy(2.0, 60) + noisy(1.6, 60, seed=3), id="lr-decay-step-down"),
        pytest.param(
            [0.5 + 1.2 * math.sin(math.pi * (i % 24) / 24) ** 2 for i in range(240)],
            id="per-epoch-rhythm",
        ),
        pytest.param(noisy(0.0003, 100, noise=0.6), id="tiny-noisy-loss"),
        pytest.param([0.0] * 30 + [0.01] * 30, id="level-zero-is-not-judged"),
    ],
)
def test_healthy_series_raise_nothing(values: list[float]) -> None:
    assert feed(values) == []


def absolute_noise(level: float, count: int, sigma: float, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [level + rng.gauss(0, sigma) for _ in range(count)]


@pytest.mark.parametrize("level", [-5.0, -0.02, 0.0])
def test_a_loss_at_or_below_zero_is_judged_by_its_noise(level: float) -> None:
    """A Gaussian NLL, a flow's or an RL objective sits at or below 0, where no ratio
    means anything: a shift of many of its noise deviations that stays is critical, its
    onset the shift's first value, and the message says how far in noise."""
    values = absolute_noise(level, 40, 0.05) + absolute_noise(level + 1.0, 15, 0.05, seed=8)
    alerts = feed(values)
    assert summary(alerts) == [(CRIT, 50, 41)]
    assert alerts[0].details["ratio"] is None
    assert "noise deviations above its level" in alerts[0].message


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(absolute_noise(-2.4, 300, 0.08), id="noisy"),
        pytest.param([-1.0 - 0.01 * i for i in range(200)], id="falling"),
        pytest.param(
            [-0.5 + 0.4 * math.sin(math.pi * (i % 24) / 24) ** 2 for i in range(240)],
            id="per-epoch-rhythm",
        ),
    ],
)
def test_healthy_series_at_or_below_zero_raise_nothing(values: list[float]) -> None:
    assert feed(values) == []


def test_a_loss_below_zero_is_not_judged_from_few_values() -> None:
    """With fewer than ``min_history`` values below 0 there is no noise to judge by and no
    ratio: nothing, where a positive loss would have a warning."""
    values = absolute_noise(-2.0, 8, 0.05) + absolute_noise(3.0, 8, 0.05, seed=8)
    assert feed(values) == []
    assert feed([v + 10.0 for v in values]) != []


def test_in_warmup_a_shift_is_judged_as_from_few_values_a_warning_at_most() -> None:
    """While the logged rate still rises the loss may wobble up with it: a shift then is
    judged as from few values, a warning, never what stops the job."""
    values = noisy(2.0, 40) + noisy(3.2, 30, seed=8)
    rising = [0.001 * (i + 1) for i in range(len(values))]
    alerts = feed(values, lrs=rising)
    assert [(a.severity, a.details["early"]) for a in alerts] in ([], [(Severity.WARNING, True)])
    assert feed(values) and feed(values)[0].severity == CRIT, "out of warmup: critical"


#: A real CIFAR CNN's train loss, one value an epoch (tests/corpus/healthy/cifar10-cnn-epochs):
#: 20 epochs still falling, and the 15 after them.
CIFAR = [
    1.6279, 1.2434, 1.1221, 1.0465, 0.9993, 0.9583, 0.9241, 0.8957, 0.8695, 0.8487,
    0.8262, 0.8007, 0.7802, 0.7655, 0.75, 0.7282, 0.716, 0.7, 0.6864, 0.6735,
    0.6605, 0.6482, 0.6354, 0.6293, 0.6153, 0.6072, 0.6025, 0.5947, 0.5881, 0.5811,
    0.5767, 0.5748, 0.5755, 0.5729, 0.572,
]  # fmt: skip


def test_a_step_up_of_a_run_still_falling_is_judged_from_where_it_now_is() -> None:
    """A run still falling through its last values is at its latest, not at their median
    (which lags above it): the same run x1.5 from its 21st epoch on, still falling at its
    own pace, is a shift that stays (the median of the ten values before it put the bar at
    the top of the step; the cadence benchmark's case)."""
    shifted = CIFAR[:20] + [1.5 * value for value in CIFAR[20:]]
    alerts = feed(shifted)
    assert [(a.severity, a.onset_step) for a in alerts] == [(CRIT, 21)]
    assert feed(CIFAR) == []
    # A run that is not falling through its last values keeps the median: the same step
    # on a flat, noisy run x1.2 is under the rise and says nothing.
    assert feed(noisy(0.7, 20) + noisy(0.84, 15, seed=8)) == []


def test_a_shift_before_min_history_warns_judged_by_the_values_it_has() -> None:
    """Ten values are enough to see a loss move 1.6x and stay; too few to stop the job on."""
    alerts = feed(noisy(2.0, 10) + noisy(3.2, 30, seed=8))
    assert [(alert.severity, alert.details["early"]) for alert in alerts] == [
        (Severity.WARNING, True)
    ]
    assert alerts[0].onset_step == 11
    assert "judged from 10 values before it" in alerts[0].message


def test_a_shift_seen_from_three_values_warns_and_two_say_nothing() -> None:
    assert [a.severity for a in feed([2.0, 1.9, 1.85, *noisy(3.0, 12, seed=3)])] == [
        Severity.WARNING
    ]
    assert feed([2.0, 1.9, *noisy(3.0, 12, seed=3)]) == []


def test_a_loss_that_more_than_doubles_after_two_values_and_stays_warns_from_its_onset() -> None:
    """Two values show no noise, but a loss more than twice the least of them that stays
    up is a shift (a LoRA run logging every 25 iterations, its loss doubled after its second
    value): a warning, its onset the first value of it. Once, or under twice: nothing."""
    alerts = feed([1.35, 1.22, *noisy(2.9, 10, seed=3)])
    assert [(a.severity, a.onset_step, a.step) for a in alerts] == [(Severity.WARNING, 3, 5)]
    assert "judged from 2 values before it" in alerts[0].message
    assert feed([1.35, 1.22, 2.9, *noisy(1.2, 10, seed=3)]) == []
    assert feed([1.35, 1.22, *noisy(2.3, 10, seed=3)]) == []
    # Stays up but well under twice after its first value: not confirmed.
    assert feed([2.0, 1.9, 4.0, *noisy(2.3, 10, seed=3)]) == []
    # Two values at one step are two runs' (ranks printing to one stream unlabelled), not
    # a run's course: nothing is judged from them.
    detector = DivergenceDetector(DivergenceConfig())
    steps = [1, 1, *range(2, 12)]
    values = [12.0, 1.2, *noisy(3.0, 10, seed=3)]
    pairs = zip(values, steps, strict=True)
    alerts = [detector.observe(Sample("loss", value, step), "log", NOW) for value, step in pairs]
    assert [alert for batch in alerts for alert in batch] == []


def test_early_values_falling_fast_are_no_shift() -> None:
    """Early in a run the loss falls fast: its level is its last values', and the step
    from one value to the next is its trend, not its noise."""
    falling = [6.0 * 0.9**index for index in range(15)]
    assert feed(falling) == []


#: A real Whisper fine-tune's train loss, every 100 steps (tests/corpus/healthy/
#: whisper-bashkir-gradnorm, its logged values averaged by 4): falling fast, ever slower.
WHISPER = [
    7.672, 3.784, 2.304, 1.624, 1.6, 1.461, 1.338, 1.242, 1.195, 1.15,
    1.223, 1.313, 1.068, 1.08, 1.023, 0.967, 0.98, 1.084, 1.214, 1.069,
]  # fmt: skip


def test_a_shift_after_a_descent_ever_slower_is_judged_by_the_bend_not_the_steps() -> None:
    """Five values falling 7.7 -> 1.6, each step shorter than the one before: the steps
    from one value to the next are the trend bending, not noise (taken for noise, they
    put the bar at 4.6, over a shift x2 that stays). Their second differences leave it
    out. The run as it was says nothing; x2 from its sixth value on warns."""
    assert feed(WHISPER) == []
    shifted = WHISPER[:5] + [2 * value for value in WHISPER[5:]]
    alerts = feed(shifted)
    assert [(a.severity, a.onset_step, a.details["early"]) for a in alerts] == [
        (Severity.WARNING, 6, True)
    ]


#: A real sentiment classifier's train loss every 100 steps (tests/corpus/healthy/
#: sentiment-customer-feedback, its logged values averaged by 2): a first descent, then a
#: wobble of 0.05.
SENTIMENT = [0.855, 0.448, 0.3315, 0.3763, 0.3289, 0.3237, 0.3098, 0.3557, 0.2457, 0.2504]


def test_a_shift_after_a_first_descent_is_judged_by_the_wobble_past_it() -> None:
    """The first step, 0.855 -> 0.448, is the run learning: taken for noise, it put the
    bar of four wobbles at 0.67, over the run doubled from its sixth value on (0.65, 0.62,
    0.71). Past the descent's trough the run wobbles by 0.05."""
    assert feed(SENTIMENT) == []
    shifted = SENTIMENT[:5] + [2 * value for value in SENTIMENT[5:]]
    alerts = feed(shifted)
    assert [(a.severity, a.onset_step, a.details["early"]) for a in alerts] == [
        (Severity.WARNING, 6, True)
    ]


def test_a_wobble_of_few_values_past_a_descent_is_never_taken_for_less_than_the_whole() -> None:
    """A real ViT's loss every 10 steps (tests/corpus/healthy/vit-irrigation): past its
    first descent two steps alike (-0.028, -0.026) give a median deviation of nothing; the
    wobble of the whole history bounds the noise, and its swing back to 0.044 is none."""
    vit = [0.2579, 0.1457, 0.0975, 0.0565, 0.0579, 0.0302, 0.0039, 0.0441, 0.0414, 0.0443]
    vit += [0.1463, 0.0683, 0.0551, 0.1104, 0.0087, 0.0566, 0.1618, 0.1098, 0.0608, 0.0349]
    assert feed(vit) == []


def test_a_shift_after_a_descent_that_keeps_falling_is_confirmed_by_not_coming_back() -> None:
    """x1.5 from the sixth value of a run that fell through all five before it: the shifted
    run goes on falling as the run did (2.19, 2.01, 1.86), so the median of its values sinks
    under the shift bar (2.08) before it is judged, and the shift passed for one that
    recovered. Not coming back to its level over three values is what shows it stays.
    Where the values before it did not all fall, a value that stays off the least of them
    is the run's own wobble: the shift bar still judges it."""
    shifted = WHISPER[:5] + [1.5 * value for value in WHISPER[5:]]
    alerts = feed(shifted)
    assert [(a.severity, a.onset_step, a.step) for a in alerts] == [
        (Severity.WARNING, 6, 8),
        (INFO, 6, 10),  # falling on, it is back under 1.1x the level of before (1.6)
    ]
    # The same three values after a history that wobbled: no shift confirmed.
    wobbly = [7.672, 3.784, 1.7, 2.1, 1.6, *shifted[5:8], *WHISPER[8:]]
    assert feed(wobbly) == []
    # Back at the level within three values: a bump, not a shift.
    bump = [*WHISPER[:5], 2.19, 1.7, *WHISPER[7:]]
    assert feed(bump) == []


def test_an_early_climb_past_anything_before_it_is_judged_and_one_within_it_is_not() -> None:
    """With few values a climb may be a rhythm's rising half, and opens no shift; but one
    past the highest value before it by the rise is no rhythm coming back. (A real nanoGPT
    log's first values, its learning rate x30 from the sixth on: cadence benchmark.)"""
    before = [4.086, 3.744, 3.985, 3.872, 3.985]
    jumped = [4.219, 4.794, 4.987, 5.771, 5.851, 6.793]
    alerts = feed(before + jumped)
    assert [(a.severity, a.details["early"], a.step) for a in alerts] == [
        (Severity.WARNING, True, 11)
    ]
    # The same climb back up to where the run was (a rhythm): nothing.
    assert feed([5.0, 4.6, 4.0, 3.7, 3.8, 4.1, 4.4, 4.7, 5.0, 5.1, 4.9]) == []


def test_a_long_early_climb_past_anything_before_it_is_judged_from_its_trough() -> None:
    """A real minitorch run's first five epochs, falling, and its learning rate x30 from
    the sixth on (cadence benchmark): the loss climbs ten values in a row, past its first
    value. Its own last values are no level (it rose through them, and a climb never
    clears 1.3x them); once past anything before the climb by the rise, it is judged from
    where it began."""
    before = [0.692, 0.681, 0.65, 0.619, 0.599]
    climb = [0.651, 0.714, 0.738, 0.831, 0.851, 0.883, 0.992, 0.973, 1.065, 1.151]
    alerts = feed(before + climb)
    assert [(a.severity, a.details["early"]) for a in alerts] == [(Severity.WARNING, True)]
    assert alerts[0].details["level"] == 0.599
    assert feed([*before, 0.58, 0.57, 0.575, 0.56, 0.55]) == []


def test_a_climb_after_a_run_learning_is_judged_from_its_trough() -> None:
    """A real CIFAR CNN's first five epochs, falling ever slower (1.63 -> 1.0), and its
    learning rate x30 from the sixth on, not logged (cadence benchmark): the loss climbs 6%
    an epoch and stays under its first value. A rhythm's rising half would too, but a
    rhythm's falling half does not slow as a run learning does: after a learning curve, a
    climb past the trough by the rise is judged from the trough. After a fall whose steps
    do not shrink (a rhythm), the same climb says nothing."""
    learning = [1.63, 1.24, 1.12, 1.05, 0.999]
    climb = [1.07, 1.14, 1.21, 1.28, 1.35, 1.41, 1.46, 1.52]
    alerts = feed(learning + climb)
    assert [(a.severity, a.details["early"], a.details["level"]) for a in alerts] == [
        (Severity.WARNING, True, 0.999)
    ]
    assert max(climb) < learning[0]  # within what the run showed: no rule judged it before
    rhythm = [1.63, 1.45, 1.24, 1.12, 0.999]  # falling faster, then slower: no learning curve
    assert feed(rhythm + climb) == []
    # The run learning on, ever slower: nothing.
    assert feed([*learning, 0.97, 0.95, 0.94, 0.935, 0.93]) == []


def test_a_new_normal_that_neither_recovers_nor_confirms_is_learned() -> None:
    # Up past the bar once, then hovering between the recovery bar and the shift bar.
    values = [*noisy(2.0, 40), 3.0, *([2.4] * 60), *noisy(3.5, 12, seed=4)]
    alerts = feed(values, window=50)
    assert [alert.severity for alert in alerts] == [CRIT]


def attempt(detector: DivergenceDetector, values: Sequence[float], first: int) -> list[Alert]:
    detector.job_started(NOW)
    alerts: list[Alert] = []
    for step, value in enumerate(values, start=first):
        alerts += detector.observe(Sample("loss", value, step), "log", NOW)
    return alerts


def test_a_rolled_back_attempt_that_diverges_again_is_caught_again() -> None:
    detector = DivergenceDetector(DivergenceConfig())
    first = attempt(detector, [*noisy(2.0, 40), *noisy(3.2, 20, seed=8)], first=1)
    assert summary(first) == [(CRIT, 50, 41)]
    # Rolled back to step 35: the history before it holds, the shift comes again.
    again = attempt(detector, [*noisy(2.0, 6, seed=2), *noisy(3.2, 20, seed=8)], first=35)
    assert summary(again) == [(CRIT, 50, 41)]


def test_a_restart_from_scratch_keeps_no_history() -> None:
    detector = DivergenceDetector(DivergenceConfig())
    attempt(detector, noisy(2.0, 60), first=1)
    # Step 1 again, the loss high as a fresh run's is: nothing to compare with yet.
    assert attempt(detector, [*[6.0] * 15, *noisy(2.0, 30)], first=1) == []


@pytest.mark.parametrize(
    "config",
    [{"recover": 1.5, "rise": 1.3}, {"patience": 60}, {"level_window": 30, "min_history": 20}],
    ids=["recover-above-rise", "patience-over-window", "level-window-over-min-history"],
)
def test_config_rejects_incoherent_values(config: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        DivergenceConfig(**config)


def test_a_megatron_style_jump_that_never_recovers_is_caught() -> None:
    # `lm loss` 6.4 -> 11.4 in one logged interval, and it stays there.
    values = [*noisy(6.4, 30, noise=0.01), *noisy(11.4, 12, noise=0.01, seed=5)]
    assert summary(feed(values)) == [(CRIT, 40, 31)]


def test_an_eval_at_a_new_epoch_is_not_the_train_loss() -> None:
    detector = DivergenceDetector(DivergenceConfig())
    alerts: list[Alert] = []
    for step, value in enumerate(noisy(2.0, 80), start=1):
        alerts += detector.observe(Sample("loss", value, step), "log", NOW)
        if step % 20 == 0:  # an evaluation, well above the train loss
            alerts += detector.observe(Sample("eval_loss", 3.5, step), "log", NOW)
    assert alerts == []
    # The eval loss is read, as the second signal of a shift judged from few values only.
    assert detector.watches == frozenset({"loss", "lr", "eval_loss"})


def six_values(evals: Sequence[float]) -> list[Alert]:
    """A fine-tune that logs five train losses and five evaluations in all (every 500
    steps, each evaluation after the train loss of its step): the train loss climbs by half
    at the fourth and stays, and ``evals`` are its evaluations."""
    detector = DivergenceDetector(DivergenceConfig())
    alerts: list[Alert] = []
    for index, (loss, evaluation) in enumerate(zip([2.0, 1.6, 1.4, 2.2, 2.4], evals, strict=True)):
        step = 500 * (index + 1)
        alerts += detector.observe(Sample("loss", loss, step), "log", NOW)
        alerts += detector.observe(Sample("eval_loss", evaluation, step), "log", NOW)
    return alerts


def test_a_short_runs_shift_is_confirmed_by_the_eval_loss_rising_with_it() -> None:
    """Two values after the onset are all a run that logs six values has: with the eval
    loss up with them (a real fine-tune's five entries, train and eval loss both up by half)
    it warns, at the second."""
    [alert] = six_values([1.5, 1.3, 1.25, 2.0, 2.2])
    assert (alert.severity, alert.step, alert.onset_step) == (Severity.WARNING, 2500, 2000)
    assert "eval_loss rose with it (1.25 before the onset, 2 at step 2000)" in alert.message


def test_an_evaluations_file_goes_line_by_line_while_a_shift_is_open() -> None:
    """A block of evaluations alone (a file of its own) may confirm an open shift: the
    rule refuses it then, and reads it line by line as ``observe``; with no shift open it
    takes it whole."""
    detector = DivergenceDetector(DivergenceConfig())
    evals = Block(
        source="eval.jsonl",
        texts=['{"step": 1500, "eval_loss": 1.25}'],
        names=("eval_loss",),
        columns={"eval_loss": [1.25]},
        steps=[1500],
        times=None,
        clock=[NOW],
        start_clock=None,
        ticks=False,
        output=False,
    )
    assert detector.can_absorb(evals)
    for index, loss in enumerate([2.0, 1.6, 1.4, 2.2]):
        assert detector.observe(Sample("loss", loss, 500 * (index + 1)), "log", NOW) == []
    assert not detector.can_absorb(evals)


def test_two_values_up_with_the_eval_loss_flat_are_not_enough() -> None:
    assert six_values([1.5, 1.3, 1.25, 1.24, 1.22]) == []


def test_a_final_evaluation_that_rose_confirms_the_shift_when_it_comes() -> None:
    """The evaluation after the onset comes after the last train loss (the run's final
    one): the shift is confirmed then."""
    detector = DivergenceDetector(DivergenceConfig())
    alerts: list[Alert] = []
    for index, loss in enumerate([2.0, 1.6, 1.4, 2.2, 2.4]):
        step = 500 * (index + 1)
        if index == 2:
            alerts += detector.observe(Sample("eval_loss", 1.25, step), "log", NOW)
        alerts += detector.observe(Sample("loss", loss, step), "log", NOW)
    assert alerts == []
    alerts += detector.observe(Sample("eval_loss", 2.1, 2500), "log", NOW)
    assert summary(alerts) == [(Severity.WARNING, 2500, 2000)]


def test_an_early_shift_is_critical_when_the_rate_jumped_above_anything_it_had_been() -> None:
    losses = [2.0, 1.9, 1.85, 1.8, *noisy(3.0, 6, seed=3)]
    jumped = [1e-3] * 4 + [0.1] * 6
    (alert,) = feed(losses, lrs=jumped)
    assert alert.severity == CRIT
    assert alert.details["lr_jump"] == [5, 1e-3, 0.1]


def test_an_early_shift_after_a_rate_back_at_its_old_peak_stays_a_warning() -> None:
    """A schedule's restart goes back to a rate it had: a jump, but one a schedule explains."""
    losses = [2.0, 1.9, 1.85, 1.8, *noisy(3.0, 6, seed=3)]
    restarted = [1e-3, 1e-4, 1e-5, 1e-5, *[1e-3] * 6]
    (alert,) = feed(losses, lrs=restarted)
    assert alert.severity == Severity.WARNING
    assert alert.details["lr_jump"] is not None


def climb(before: int, rate: float, count: int, seed: int = 3) -> list[float]:
    """``before`` values at 2.0, then ``count`` climbing by ``rate`` of 2.0 a value."""
    rng = random.Random(seed)
    flat = [2.0 * (1 + 0.02 * rng.gauss(0, 1)) for _ in range(before)]
    return flat + [2.0 * (1 + rate * k) * (1 + 0.02 * rng.gauss(0, 1)) for k in range(1, count)]


@pytest.mark.parametrize(("rate", "count"), [(0.01, 60), (0.03, 30), (0.05, 30)])
def test_a_loss_that_creeps_up_past_the_bar_of_its_level_before_warns(
    rate: float, count: int
) -> None:
    """A climb of a few per cent a value never puts one value above the bar of a level that
    follows it (each value is learned, the level with it); the run at its best before the
    climb has a bar the climb passes. A warning (nothing known says why), its onset after
    that best; it resolves when the loss comes back."""
    values = climb(40, rate, count)
    alerts = feed(values + [2.0] * 3)
    assert [(a.severity, a.details["kind"], a.details["crept"]) for a in alerts] == [
        (Severity.WARNING, "unrecovered", True),
        (INFO, "recovered", True),
    ]
    first = alerts[0]
    assert "crept up from step" in first.message and "over the last 10 values" in first.message
    assert first.details["ratio"] >= 1.3
    # The onset is after the run's best before the climb (from step 41; of the values its
    # history still holds), not where the climb is seen: a rollback goes to before it.
    assert first.onset_step is not None and 30 <= first.onset_step <= first.step - 15
    # A loss that stays where it was, or comes back down after a few values up, does not.
    assert feed(noisy(2.0, 70)) == []
    assert feed(noisy(2.0, 40) + [4.6] * 7 + noisy(2.0, 20, seed=5)) == []


def test_the_block_proof_of_no_creep_holds_wherever_a_window_creeps() -> None:
    """``never_creeps`` says a block ends no window ``crept`` judges: on random runs that
    climb, wherever it says so, no value of the block ends one."""
    settings = DivergenceConfig()
    rng = random.Random(11)
    checked = creeping = 0
    for _ in range(300):
        rate = rng.choice([0.0, 0.01, 0.03, 0.06])
        noise = rng.choice([0.005, 0.02, 0.1])
        values = [
            2.0 * (1 + rate * max(0, k - 30)) * (1 + noise * rng.gauss(0, 1)) for k in range(80)
        ]
        cut, size = rng.randint(25, 60), rng.randint(1, 20)
        history, block = values[:cut][-settings.window :], values[cut : cut + size]
        fired = any(
            crept((history + block[:end])[-settings.window :], settings)
            for end in range(1, len(block) + 1)
        )
        creeping += fired
        if never_creeps(history, block, settings):
            checked += 1
            assert not fired
    assert checked > 50 and creeping > 20


@pytest.mark.parametrize(
    ("factor", "severity"), [(1e6, CRIT), (50.0, CRIT), (12.0, CRIT), (5.0, Severity.WARNING)]
)
def test_a_shift_of_orders_of_magnitude_from_few_values_is_critical(
    factor: float, severity: Severity
) -> None:
    """A run that logs every 50 steps went from 4.9 to 1e27 and stayed: judged from three
    values it only warned. No healthy loss stays 10x above where it was; 5x is a warning
    still, as any shift judged from few values."""
    values = [4.9, 4.1, 3.5] + [3.5 * factor * (1 + 0.01 * i) for i in range(4)]
    alerts = feed(values)
    assert [(a.severity, a.onset_step) for a in alerts] == [(severity, 4)]


def test_a_loss_two_orders_of_magnitude_up_for_a_second_value_is_confirmed() -> None:
    """A real MindYOLO run (mindspore-lab/mindyolo issue #402), logged every 100 steps:
    11.67, 8.85, then 8,713 and 15,806, where its log ends. Two values that far up are no
    spike: critical at the second, onset at the first, where it waited for a third. Two
    values at 50x wait for the shift's patience, as any shift judged from few values."""
    (alert,) = feed([11.67, 8.85, 8712.6, 15806.4])
    assert (alert.severity, alert.step, alert.onset_step) == (Severity.CRITICAL, 4, 3)
    assert feed([4.9, 4.1, 3.5, 3.5 * 50, 3.5 * 50]) == []


def ended(values: Sequence[float], **config: Any) -> tuple[list[Alert], list[Alert]]:
    """The alerts while ``values`` are fed, and those at the end of the log."""
    detector = DivergenceDetector(DivergenceConfig(**config))
    alerts: list[Alert] = []
    for step, value in enumerate(values, start=1):
        alerts += detector.observe(Sample("loss", value, step), "log", NOW)
    return alerts, detector.log_ended(NOW, [])


#: A Keras run's last epochs (DeepJ issue #49): flat at 0.047, then the loss doubles and the
#: paste ends two epochs later.
KERAS_DEEPJ = [0.0475, 0.0474, 0.0473, 0.0471, 0.0472, 0.0612, 0.0958, 0.0877]


def test_a_log_that_ends_two_values_into_a_shift_warns_at_its_end() -> None:
    during, at_end = ended(KERAS_DEEPJ)
    assert during == []  # too few values since the onset to confirm it while it ran
    assert [(a.severity, a.onset_step, a.step, a.details["early"]) for a in at_end] == [
        (Severity.WARNING, 7, 8, True)
    ]
    message = at_end[0].message
    assert "shifted up at step 7 and the log ended 2 values later" in message
    assert "1.95x its level 0.0471" in message


@pytest.mark.parametrize(
    "tail",
    [
        [0.0958],  # one value up: a spike, as far as the log shows
        [0.0958, 0.0480],  # back near the level
        [0.0958, 0.0500, 0.0600],  # back under the recovery bar once
    ],
)
def test_a_log_that_ends_without_two_values_up_says_nothing_at_its_end(
    tail: list[float],
) -> None:
    during, at_end = ended(KERAS_DEEPJ[:5] + tail)
    assert during == [] and at_end == []


def test_a_shift_confirmed_before_the_log_ended_is_not_raised_again_at_its_end() -> None:
    during, at_end = ended([*KERAS_DEEPJ, 0.0901, 0.0930])
    assert [a.severity for a in during] == [Severity.WARNING]
    assert at_end == []


@pytest.mark.parametrize("before", [1, 3, 5])
def test_the_log_ended_two_values_into_a_shift_of_the_deepj_run_from_few_values(
    before: int,
) -> None:
    """The DeepJ excerpt started ``before`` values before the loss doubled: 0.0471 ->
    0.0472 (+0.2%) is flat, no climb's start whose rising half the jump would be."""
    during, at_end = ended(KERAS_DEEPJ[5 - before :])
    assert during == []
    assert [(a.severity, a.step) for a in at_end] == [(Severity.WARNING, before + 3)]


def test_a_log_that_ends_two_values_into_a_shift_of_orders_of_magnitude_is_critical() -> None:
    """MindYOLO's excerpt from one value before: 8.85, 8,713, 15,806, then the end. The log
    ending is no evidence that it stays; two values 1,000x up are."""
    during, at_end = ended([8.85, 8712.6, 15806.4])
    assert during == []
    assert [(a.severity, a.onset_step) for a in at_end] == [(Severity.CRITICAL, 2)]


@pytest.mark.parametrize(("before", "severity"), [(1, Severity.WARNING), (3, CRIT), (5, CRIT)])
def test_an_early_shift_an_order_of_magnitude_up_that_stays_is_critical(
    before: int, severity: Severity
) -> None:
    """A real Keras 0.x run (tests/corpus/failed/keras0-diverges-at-epoch-10) from
    ``before`` epochs before it died: 0.74 -> 13.4 -> 26.6, and stayed: 10x and more the
    median before it. After one value, a warning: that value may be a noisy run's low
    batch (a watcher attached mid-run). A shift x3 from as few values stays a warning."""
    keras = [0.8484, 0.8145, 0.7909, 0.7627, 0.7407][5 - before :]
    alerts = feed([*keras, 13.3614, 26.6396, 26.6453, 26.6462])
    assert [(a.severity, a.onset_step) for a in alerts] == [(severity, before + 1)]
    alerts = feed([*keras, 2.22, 2.24, 2.23, 2.25])
    assert [a.severity for a in alerts] == [Severity.WARNING]


def test_a_noisy_runs_low_batch_is_no_yardstick_for_orders_of_magnitude() -> None:
    """A real MindSpore LeNet's per-batch losses at its epochs' ends (healthy): 0.021,
    0.0056, 0.029, 0.00046, 0.024, 0.00058, then 0.026, 0.108, 0.0195, 0.106. 181x the
    least of the last 3, but 5x their median: no critical from a watcher attached there."""
    lenet = [0.021227, 0.005586, 0.029126, 0.000459, 0.023556, 0.000581, 0.025741]
    alerts = feed([*lenet, 0.108464, 0.019506, 0.105631, 0.09])
    assert all(alert.severity != CRIT for alert in alerts)


def test_a_critical_shift_cut_short_by_the_end_of_the_log_is_a_warning() -> None:
    """Settled at 2.0 for 40 values, then x1.6 for 6: a shift that would be critical after
    10 values, cut short; the end of a log is no evidence that it stays."""
    during, at_end = ended(noisy(2.0, 40) + noisy(3.2, 6, seed=8))
    assert during == []
    assert [(a.severity, a.onset_step, a.details["early"]) for a in at_end] == [
        (Severity.WARNING, 41, False)
    ]
    assert "10 confirm a shift" in at_end[0].message


def test_a_shift_that_went_non_finite_before_the_log_ended_is_nan_infs_story() -> None:
    detector = DivergenceDetector(DivergenceConfig())
    for step, value in enumerate([*KERAS_DEEPJ, math.nan], start=1):
        assert detector.observe(Sample("loss", value, step), "log", NOW) == []
    assert detector.log_ended(NOW, []) == []


def test_a_jump_at_a_runs_second_value_is_dated_at_it() -> None:
    """Caffe's GoogLeNet, 11.23 at iteration 0 and 87.3 from iteration 100 on: the second
    value was learned with one value known, and the shift opened at the third; its onset
    is the second's, so a rollback goes back before it."""
    alerts = feed([11.23, 87.3, 87.3, 87.3, 87.3])
    assert [(a.severity, a.step, a.onset_step) for a in alerts] == [(Severity.WARNING, 4, 2)]
    assert alerts[0].details["values"] == [11.23, 87.3, 87.3, 87.3]


def test_a_jump_at_a_runs_third_value_keeps_its_own_onset() -> None:
    """An MLX LoRA run, 1.593 and 1.406, then 3.316 and up: nothing before it was up."""
    alerts = feed([1.593, 1.406, 3.316, 6.437, 5.478, 4.857])
    assert [(a.step, a.onset_step) for a in alerts] == [(5, 3)]


def test_a_loss_near_0_after_a_long_fall_is_judged_against_where_the_run_began() -> None:
    """A P-Tuning run (its trainer_state.json): 4.26 down to about 0.008, then a wobble to a
    median of 0.012 (+0.004) that came back by itself; a critical before the floor of scale.
    A shift of the same run by 1% of where it began and more is still one."""
    rng = random.Random(3)
    fall = [4.26 * (0.008 / 4.26) ** (i / 59) for i in range(60)]
    settled = [0.008 * rng.uniform(0.85, 1.15) for _ in range(30)]
    wobble_ = [0.012 * rng.uniform(0.85, 1.15) for _ in range(15)]
    assert feed([*fall, *settled, *wobble_]) == []
    shifted = [0.06 * rng.uniform(0.9, 1.1) for _ in range(15)]
    assert [a.severity for a in feed([*fall, *settled, *shifted])] == [CRIT]


def test_one_transient_at_the_start_does_not_raise_the_floor() -> None:
    """Where the run began is the median of its first values: a first-step spike to 1000
    (a bad first batch) leaves the floor at 1% of 4, and a shift of 2 -> 6 is one."""
    start = [4.0, 1000.0, 3.9, 3.5, 3.0, 2.6, 2.3, 2.1]
    values = start + noisy(2.0, 40) + noisy(6.0, 15, seed=8)
    assert CRIT in [a.severity for a in feed(values)]
