"""loss_spike: a value over ``factor`` x the median of recent non-spike values opens an episode."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import pydantic
import pytest

from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.loss_spike import LossSpikeConfig, LossSpikeDetector

NAN = math.nan
NOW = 1_700_000_000.0
WARN, CRIT, INFO = Severity.WARNING, Severity.CRITICAL, Severity.INFO
#: Ten values at 2.0: a full default window, steps 1-10.
BASE = [2.0] * 10


def feed(detector: LossSpikeDetector, samples: Sequence[Sample]) -> list[Alert]:
    alerts: list[Alert] = []
    for sample in samples:
        alerts += detector.observe(sample, "train.log", NOW)
    return alerts


def losses(values: Sequence[float], first_step: int = 1, name: str = "loss") -> list[Sample]:
    return [Sample(name, value, first_step + i) for i, value in enumerate(values)]


def summary(alerts: Sequence[Alert]) -> list[tuple[Severity, int | None, bool]]:
    return [(alert.severity, alert.step, alert.resolves) for alert in alerts]


def run(values: Sequence[float], **config: Any) -> list[Alert]:
    return feed(LossSpikeDetector(LossSpikeConfig(**config)), losses(values))


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([*BASE, 9.0, 2.0, 2.0, 2.0], [(WARN, 11, False), (INFO, 14, True)]),
        (
            [*BASE, 9.0, 2.0, 2.0, 2.0, 9.0, 2.0, 2.0, 2.0],
            [(WARN, 11, False), (INFO, 14, True), (WARN, 15, False), (INFO, 18, True)],
        ),
        ([*BASE, 9.0, 2.0, 9.0, 2.0, 2.0, 2.0], [(WARN, 11, False), (INFO, 16, True)]),
        (BASE + [9.0] * 6 + [2.0] * 3, [(WARN, 11, False), (CRIT, 14, False), (INFO, 19, True)]),
        (
            [*BASE, 9.0, 9.0, 9.0, 2.0, 9.0, 9.0, 9.0, 2.0, 2.0, 2.0],
            [(WARN, 11, False), (INFO, 20, True)],
        ),
        ([*BASE, 4.0, 4.0001], [(WARN, 12, False)]),
        ([2.0] * 9 + [9.0], []),
        ([-1.0] * 10 + [5.0, 50.0], []),
        ([0.0] * 10 + [5.0], []),
    ],
    ids=[
        "spike-recovers-one-warning-then-resolve",
        "two-separate-spikes-two-episodes",
        "spikes-closer-than-resolve-after-one-episode",
        "persistent-spike-escalates-to-critical-once",
        "runs-of-3-below-sustain-never-escalate",
        "exactly-factor-times-is-not-a-spike",
        "window-not-full-judges-nothing",
        "negative-baseline-skips-the-relative-test",
        "zero-baseline-skips-the-relative-test",
    ],
)
def test_episodes(values: list[float], expected: list[tuple[Severity, int, bool]]) -> None:
    assert summary(run(values)) == expected


def test_opening_alert_says_the_numbers() -> None:
    (opened, _) = run([*BASE, 9.0, 2.0, 2.0, 2.0])
    assert opened.rule == "loss_spike"
    assert opened.message == "loss 9 at step 11 is 4.5x its recent median 2"
    assert opened.metric == "loss"
    assert opened.value == 9.0
    assert opened.onset_step == 11
    assert opened.source == "train.log"
    assert opened.time == NOW
    assert opened.details["kind"] == "spike"
    assert opened.details["baseline"] == 2.0
    assert opened.details["threshold"] == 4.0
    assert opened.details["values"] == [*BASE, 9.0]
    assert opened.details["steps"] == list(range(1, 12))


def test_every_alert_of_an_episode_carries_its_onset() -> None:
    alerts = run(BASE + [9.0] * 5 + [2.0] * 3)
    assert [alert.onset_step for alert in alerts] == [11, 11, 11]
    assert [alert.details["kind"] for alert in alerts] == ["spike", "persistent", "recovered"]


def test_escalation_message_and_evidence() -> None:
    _, escalated = run([*BASE, 9.0, 9.5, 9.2, 9.8])
    assert escalated.message == (
        "loss above 4 (2x its recent median 2) for 4 consecutive values since step 11"
        " (now 9.8 at step 14), far beyond anything the run has shown (2)"
    )
    assert escalated.details["evidence"].startswith("far beyond")
    assert escalated.details["run_length"] == 4
    assert escalated.details["values"] == [*BASE, 9.0, 9.5, 9.2, 9.8]


def test_second_spike_is_not_masked_by_the_first() -> None:
    # A mean of the last 10 with the first spike in it is 3.8, and 5.0 < 2 x 3.8.
    alerts = run([*BASE, 20.0, 2.0, 2.0, 2.0, 5.0])
    assert summary(alerts) == [(WARN, 11, False), (INFO, 14, True), (WARN, 15, False)]
    assert alerts[2].details["baseline"] == 2.0


def test_spikes_are_not_learned_into_the_baseline() -> None:
    # With the six spikes learned, the median of steps 10-19 would be 5.5 and 20.0 a spike
    # of 3.6x it; against the true baseline 2.0 it is 10x. (20.0 is further above the
    # baseline than the six 9.0s were: no tail of the run.)
    alerts = run([*BASE, *[9.0] * 6, 2.0, 2.0, 2.0, 20.0])
    assert summary(alerts) == [
        (WARN, 11, False),
        (CRIT, 14, False),
        (INFO, 19, True),
        (WARN, 20, False),
    ]
    assert alerts[3].details["baseline"] == 2.0


def test_level_shift_resolves_and_rebaselines() -> None:
    detector = LossSpikeDetector(LossSpikeConfig())
    alerts = feed(detector, losses(BASE + [5.0] * 10))
    # 2.5x, not far beyond anything the run has shown, nothing agrees: it stays a warning
    # (an unrecovered shift is the divergence rule's critical).
    assert summary(alerts) == [(WARN, 11, False), (INFO, 20, True)]
    shift = alerts[-1]
    assert shift.details["kind"] == "level_shift"
    assert shift.details["new_baseline"] == 5.0
    assert "level shift" in shift.message
    assert "baseline re-learned at 5" in shift.message
    assert feed(detector, losses([5.0] * 5, first_step=21)) == []
    (spike,) = feed(detector, losses([11.0], first_step=26))
    assert (spike.severity, spike.onset_step, spike.details["baseline"]) == (WARN, 26, 5.0)


def test_sustain_severity_equal_to_severity_does_not_escalate() -> None:
    alerts = run(BASE + [9.0] * 6, severity="critical", sustain_severity="critical")
    assert summary(alerts) == [(CRIT, 11, False)]


@pytest.mark.parametrize(
    ("config", "lr_values"),
    [({}, [0.1 * i for i in range(1, 16)] + [1.5] * 10), ({"warmup_steps": 15}, [])],
    ids=["lr-still-rising", "warmup-steps"],
)
def test_warmup_only_learns(config: dict[str, Any], lr_values: list[float]) -> None:
    detector = LossSpikeDetector(LossSpikeConfig(**config))
    samples: list[Sample] = []
    loss = [2.0] * 11 + [9.0] + [2.0] * 8 + [9.0]  # spikes at steps 12 and 21
    for step in range(1, 26):
        if step <= len(lr_values):
            samples.append(Sample("lr", lr_values[step - 1], step))
        if step <= len(loss):
            samples.append(Sample("loss", loss[step - 1], step))
    alerts = feed(detector, samples)
    assert summary(alerts) == [(WARN, 21, False)]


def test_watches_the_metrics_and_lr() -> None:
    detector = LossSpikeDetector(LossSpikeConfig(metrics=["loss", "eval_loss"]))
    assert detector.watches == frozenset({"loss", "eval_loss", "grad_norm", "lr"})


def test_non_finite_values_are_skipped() -> None:
    # Ten finite values at odd steps 1-19 fill the window; the spike is at step 22.
    values = [2.0, NAN] * 10 + [math.inf, 9.0, NAN, 2.0, -math.inf, 2.0, 2.0]
    alerts = run(values)
    assert summary(alerts) == [(WARN, 22, False), (INFO, 27, True)]
    assert alerts[0].details["baseline"] == 2.0


def test_nan_does_not_fill_the_window() -> None:
    assert run([2.0] * 9 + [NAN, 9.0]) == []


def test_metrics_share_one_episode() -> None:
    detector = LossSpikeDetector(LossSpikeConfig(metrics=["loss", "eval_loss"]))
    feed(detector, losses(BASE) + losses(BASE, name="eval_loss"))
    alerts = feed(detector, losses([9.0], 11) + losses([9.0], 11, "eval_loss"))
    assert summary(alerts) == [(WARN, 11, False)]
    assert feed(detector, losses([2.0] * 3, 12)) == []  # eval_loss still above its bar
    (resolved,) = feed(detector, losses([2.0] * 3, 12, "eval_loss"))
    assert (resolved.resolves, resolved.metric, resolved.step) == (True, "eval_loss", 14)


def test_job_started_resets_window_and_episode() -> None:
    detector = LossSpikeDetector(LossSpikeConfig())
    assert len(feed(detector, losses([*BASE, 9.0]))) == 1
    detector.job_started(NOW)
    assert feed(detector, losses([9.0], first_step=5)) == []  # the window is empty again
    alerts = feed(detector, losses([*BASE, 9.0], first_step=6))
    assert summary(alerts) == [(WARN, 16, False)]
    assert alerts[0].onset_step == 16


def test_alert_time_is_the_sample_time() -> None:
    detector = LossSpikeDetector(LossSpikeConfig())
    feed(detector, losses(BASE))
    (alert,) = detector.observe(Sample("loss", 9.0, 11, time=123.5), "m.jsonl", NOW)
    assert (alert.time, alert.source) == (123.5, "m.jsonl")


@pytest.mark.parametrize(
    "config",
    [
        {"factor": 1.0},
        {"factor": 0.5},
        {"window": 2},
        {"sustain": 0},
        {"sustain": 10},
        {"resolve_after": 0},
        {"metrics": []},
        {"warmup_steps": -1},
        {"sustain_severity": "info"},
        {"typo": 1},
    ],
    ids=[
        "factor-1",
        "factor-below-1",
        "window-2",
        "sustain-0",
        "sustain-not-below-window",
        "resolve-0",
        "no-metrics",
        "negative-warmup",
        "sustain-severity-below-severity",
        "unknown-key",
    ],
)
def test_config_rejects_bad_values(config: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        LossSpikeConfig(**config)


def test_a_change_smaller_than_the_runs_wobble_is_no_spike_whatever_its_ratio() -> None:
    # A tiny loss that wobbles between 0.0001 and 0.0009: 0.0008 is 2.7x the median.
    wobble = [0.0001, 0.0005, 0.0002, 0.0009, 0.0003, 0.0001, 0.0004, 0.0002, 0.0006, 0.0003]
    assert run([*wobble * 5, 0.0008]) == []
    # The same ratio against a steady level is a spike.
    assert summary(run([*[0.0003] * 50, 0.0009])) == [(WARN, 51, False)]


def test_the_noise_has_a_floor_so_a_flat_series_still_needs_the_ratio() -> None:
    assert run([*BASE, 3.9]) == []  # 0 MAD, but under 2x
    assert summary(run([*BASE, 4.1])) == [(WARN, 11, False)]


def test_a_rhythm_the_noise_window_holds_is_the_runs_normal() -> None:
    epoch = [0.5, 0.5, 0.6, 0.8, 1.2, 1.6, 1.7, 1.5, 1.2, 0.8, 0.6, 0.5]
    quiet = run(epoch * 10)
    assert [alert for alert in quiet if alert.step is not None and alert.step > 24] == []
    assert all(alert.severity != CRIT for alert in quiet)
    # A real spike on that run is still caught.
    caught = run([*epoch * 10, 0.5, 0.5, 6.0])
    assert (caught[-1].severity, caught[-1].step) == (WARN, 123)


#: The first epoch of a run with a per-epoch rhythm (tests/fixtures/divergence/rhythm): the
#: loss climbs to its epoch's peak at the eleventh value, 2.2x the median before it.
FIRST_EPOCH = [0.518, 0.547, 0.505, 0.811, 0.666, 0.831, 0.854, 0.821, 1.635, 1.585, 1.8205]


def test_before_the_noise_window_is_full_a_spike_must_be_far_beyond_the_noise() -> None:
    """The first epoch has no earlier one to compare with: its peak is no spike until the
    noise window has seen the rhythm, unless it is far beyond the noise seen so far."""
    assert run(FIRST_EPOCH) == []
    assert summary(run(FIRST_EPOCH, noise_window=10)) == [(WARN, 11, False)]
    assert summary(run([*FIRST_EPOCH[:-1], 6.0])) == [(WARN, 11, False)]


def test_one_noisy_signal_persisting_warns_and_a_second_signal_makes_it_critical() -> None:
    detector = LossSpikeDetector(LossSpikeConfig())
    alone = feed(detector, losses([*BASE, 5.0, 5.0, 5.0, 5.0, 5.0]))
    assert summary(alone) == [(WARN, 11, False)]
    detector = LossSpikeDetector(LossSpikeConfig())
    both: list[Alert] = []
    for step, value in enumerate([*BASE, 5.0, 5.0, 5.0, 5.0, 5.0], start=1):
        both += detector.observe(Sample("loss", value, step), "log", NOW)
        grad = 40.0 if step == 11 else 1.0
        both += detector.observe(Sample("grad_norm", grad, step), "log", NOW)
    assert summary(both) == [(WARN, 11, False), (CRIT, 14, False)]
    assert both[1].details["evidence"] == "and grad_norm spiked with it"


def test_growth_by_orders_of_magnitude_in_warmup_warns_once() -> None:
    detector = LossSpikeDetector(LossSpikeConfig())
    alerts: list[Alert] = []
    loss = [3.2, 3.1, 15.0, 400.0, 9e4, 5e11]
    for step, value in enumerate(loss, start=1):
        alerts += detector.observe(Sample("lr", 1e-4 * step, step), "log", NOW)
        alerts += detector.observe(Sample("loss", value, step), "log", NOW)
    assert summary(alerts) == [(WARN, 4, False)]
    assert alerts[0].details["kind"] == "warmup_growth"
    assert alerts[0].onset_step == 4
    assert "129x the lowest it has been (3.1)" in alerts[0].message


def test_warmup_growth_needs_a_positive_least() -> None:
    alerts = run([0.0, -0.01, 0.02, 0.5, 3.0])
    assert alerts == []


def _blow_up_feed(records: list[dict[str, float]]) -> list[Alert]:
    detector = LossSpikeDetector(LossSpikeConfig())
    alerts: list[Alert] = []
    for step, record in enumerate(records, start=1):
        samples = [Sample(name, value, step) for name, value in record.items()]
        alerts += [alert for _, alert in detector.observe_samples(samples, "log", NOW)]
    return alerts


@pytest.mark.parametrize("grad_first", [False, True], ids=["loss-then-grad", "grad-then-loss"])
@pytest.mark.parametrize("before", [1, 3, 30])
def test_a_corroborated_blow_up_is_critical_on_its_first_value(
    grad_first: bool, before: int
) -> None:
    """The fp16 blow-up of issue 29: the loss 5,000x its level, the grad-norm 45,000x its
    own on the same record, after however few values."""
    calm = [{"loss": 2.0 - 0.01 * i, "grad_norm": 1.0 + 0.01 * (i % 3)} for i in range(before)]
    blown = {"loss": 9000.0, "grad_norm": 45000.0}
    if grad_first:
        blown = {"grad_norm": 45000.0, "loss": 9000.0}
    alerts = _blow_up_feed([*calm, blown])
    critical = [alert for alert in alerts if alert.severity == Severity.CRITICAL]
    assert [(a.details["kind"], a.step, a.onset_step) for a in critical] == [
        ("blow_up", before + 1, before + 1)
    ]
    assert "grad_norm" in critical[0].message


def test_a_blow_up_its_record_does_not_corroborate_is_no_critical() -> None:
    calm = [{"loss": 2.0, "grad_norm": 1.0}] * 12
    alerts = _blow_up_feed([*calm, {"loss": 9000.0, "grad_norm": 1.1}, *calm[:3]])
    assert alerts and all(alert.severity != Severity.CRITICAL for alert in alerts)


def _fell(losses: list[float]) -> list[dict[str, float]]:
    return [{"loss": loss, "grad_norm": 2.0 * loss} for loss in losses]


def test_a_hard_batch_under_the_floor_of_scale_is_no_blow_up() -> None:
    """A real BERT-tiny classifier: the loss fell from 0.69 to 0.0008; a batch at 0.14 is
    179x that, with its grad-norm 24x, and a fifth of where the run began."""
    fell = _fell([0.69, 0.48, 0.19, 0.05, 0.01, 0.004, 0.002, 0.001, 0.0009, 0.0008])
    alerts = _blow_up_feed([*fell, {"loss": 0.14, "grad_norm": 0.05}])
    assert all(alert.severity != Severity.CRITICAL for alert in alerts)


def test_a_blow_up_past_the_floor_of_scale_and_all_the_run_showed_is_critical() -> None:
    """A loss that fell from 19.2 to 0.0036, then 25 with its grad-norm 20,000x: 100x and
    more its level floored at 1% of where the run began (14.4), above all it showed. At
    17.9, under its first value, it is a spike: a watcher that attached after the fall
    cannot tell it from a hard batch, and it waits for its second signal."""
    fell = _fell([19.2, 14.4, 5.46, 0.41, 0.12, 0.04, 0.02, 0.01, 0.005, 0.0036])
    alerts = _blow_up_feed([*fell, {"loss": 25.0, "grad_norm": 400.0}])
    critical = [alert for alert in alerts if alert.severity == Severity.CRITICAL]
    assert [(a.details["kind"], a.step) for a in critical] == [("blow_up", 11)]
    alerts = _blow_up_feed([*fell, {"loss": 17.9, "grad_norm": 400.0}])
    assert all(alert.severity != Severity.CRITICAL for alert in alerts)


def test_a_bad_batch_under_100x_that_recovers_is_no_critical_even_with_its_grad_norm() -> None:
    calm = [{"loss": 2.0 + 0.01 * (i % 4), "grad_norm": 1.0} for i in range(20)]
    alerts = _blow_up_feed([*calm, {"loss": 120.0, "grad_norm": 40.0}, *calm[:5]])
    assert [a.severity for a in alerts if not a.resolves] == [Severity.WARNING]


def test_a_spike_the_run_has_shown_many_of_is_its_tail_and_warns_no_more() -> None:
    """A run that logs every step: among its batches some are 1.8-2.3x its median, often.
    The first spike past 2x warns; once the run has shown three as far out, no more."""
    rng = random.Random(5)
    values = [2.0 * (1 + 0.08 * rng.gauss(0, 1)) for _ in range(60)]
    for index in range(60, 600):
        hard = index % 37 == 0
        values.append(2.0 * (rng.uniform(2.05, 2.3) if hard else 1 + 0.08 * rng.gauss(0, 1)))
    opened = [a for a in run(values) if not a.resolves]
    assert len(opened) <= 3, [a.step for a in opened]
    assert opened[0].step == 75, "the first hard batch warns"


def test_an_isolated_spike_in_a_run_that_never_strays_warns_every_time() -> None:
    calm = [2.0 + 0.01 * (i % 5) for i in range(60)]
    values = [*calm, 8.0, *calm, 8.0, *calm, 8.0]
    opened = [a for a in run(values) if not a.resolves]
    assert [a.step for a in opened] == [61, 122, 183]


def test_far_beyond_is_beyond_what_the_run_showed_not_its_last_50_values() -> None:
    """A real curriculum step (``fixtures/make_curriculum.py``): the loss falls from 2.84 to
    0.3 over 400 steps, jumps back to 2.17 when the data gets harder, and is under 1 again
    within 4 steps. That is a spike the run's own range holds (it began higher), so a
    warning: the second signal "far beyond anything the run has shown (0.4244)" had read
    only the last 50 values, and stopped a healthy job."""
    import json
    from pathlib import Path

    run = Path(__file__).resolve().parents[1] / "fixtures" / "curriculum" / "metrics.jsonl"
    detector = LossSpikeDetector(LossSpikeConfig())
    alerts: list[Alert] = []
    for line in run.read_text().splitlines():
        record = json.loads(line)
        sample = Sample("loss", record["loss"], record["step"], record["time"])
        alerts += detector.observe(sample, "metrics.jsonl", record["time"])
    opened = [(a.severity, a.step) for a in alerts if not a.resolves]
    assert opened[0] == (Severity.WARNING, 401), opened
    assert Severity.CRITICAL not in {severity for severity, _ in opened}
