"""loss_scale: a collapsed fp16 loss scale is critical; calibration is counted, not alarmed."""

from __future__ import annotations

import pytest

from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.loss_scale import LossScaleConfig, LossScaleDetector

NOW = 1_700_000_000.0
#: As DeepSpeed (stage_1_and_2.py), fairseq (trainer.py) and apex print them.
DEEPSPEED = (
    "[2023-05-02 10:11:12,345] [INFO] [stage_1_and_2.py:1794:step] [deepspeed] OVERFLOW!"
    " Rank 0 Skipping step. Attempted loss scale: {before}, reducing to {after}"
)
FAIRSEQ = (
    "2021-03-04 05:06:07 | INFO | fairseq.trainer | NOTE: gradient overflow detected,"
    " ignoring gradient, setting loss scale to: {after}"
)
FAIRSEQ_FATAL = (
    "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably"
    " exploding. Try lowering the learning rate, using gradient clipping or increasing the"
    " batch size."
)
DEEPSPEED_FATAL = (
    "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
)


def megatron(step: int, scale: float, skipped: int) -> str:
    return (
        f" iteration {step:8d}/  500000 | consumed samples: {step * 512:12d} | elapsed time"
        f" per iteration (ms): 1021.3 | learning rate: 6.000E-05 | global batch size:   512 |"
        f" lm loss: 2.4E+00 | loss scale: {scale:.1f} | grad norm: 0.312 |"
        f" number of skipped iterations: {skipped:3d} | number of nan iterations:   0 |"
    )


class Run:
    """Feeds a detector lines of output and samples, as the engine does (output first)."""

    def __init__(self, config: LossScaleConfig | None = None) -> None:
        self.detector = LossScaleDetector(config or LossScaleConfig())
        self.alerts: list[Alert] = []

    def line(self, text: str) -> None:
        self.alerts += self.detector.output_text(text, "train.log", NOW)

    def step(self, step: int, *extra: Sample) -> None:
        samples = [Sample("loss", 2.0, step), *extra]
        found = self.detector.observe_samples(samples, "train.log", NOW)
        self.alerts += [alert for _, alert in found]


def calibrated_deepspeed() -> Run:
    run = Run()
    scale = 65536
    for _ in range(4):  # the scaler calibrating at the start
        run.line(DEEPSPEED.format(before=scale, after=scale // 2))
        scale //= 2
    for step in range(1, 2001):
        run.step(step)
    return run


def test_calibration_at_the_start_is_counted_not_alarmed() -> None:
    run = calibrated_deepspeed()
    assert run.alerts == []
    assert run.detector.overflows == 4


def test_a_lone_overflow_later_is_not_news() -> None:
    run = calibrated_deepspeed()
    run.line(DEEPSPEED.format(before=8192, after=4096))
    run.step(2001)
    assert run.alerts == []
    assert run.detector.overflows == 5


def test_overflows_that_cluster_warn() -> None:
    run = calibrated_deepspeed()
    for step in range(2001, 2011):
        run.line(DEEPSPEED.format(before=8192, after=8192))
        run.step(step)
    (alert,) = run.alerts
    assert alert.severity is Severity.WARNING
    assert alert.rule == "loss_scale"
    assert alert.onset_step == 2000


@pytest.mark.parametrize("text", [FAIRSEQ_FATAL, DEEPSPEED_FATAL], ids=["fairseq", "deepspeed"])
def test_the_frameworks_minimum_scale_error_is_critical(text: str) -> None:
    run = Run()
    for step in range(1, 50):
        run.step(step)
    run.line(FAIRSEQ.format(after=0.5))
    run.step(50)
    run.line(text)
    (alert,) = run.alerts
    assert (alert.severity, alert.step, alert.onset_step) == (Severity.CRITICAL, 50, 49)
    assert "minimum" in alert.message


def test_overflows_that_push_the_scale_to_its_floor_are_critical() -> None:
    """fairseq after a healthy epoch: overflow after overflow, no update between them."""
    run = Run()
    for step in range(10000, 10199, 10):
        run.step(step, Sample("loss_scale", 0.5, step))
    scale = 0.5
    while scale > 1e-4:
        scale /= 2
        run.line(FAIRSEQ.format(after=scale))
    warning, alert = run.alerts  # the cluster warns at the fifth overflow
    assert (warning.severity, alert.severity) == (Severity.WARNING, Severity.CRITICAL)
    assert alert.value is not None and 5e-4 < alert.value <= 1e-3  # the ninth halving
    assert (alert.step, alert.onset_step) == (10190, 10190)


def test_fairseq_calibrating_down_to_four_thousandths_is_healthy() -> None:
    """As fairseq's own healthy runs do at the start: 0.0625 down to 0.0039, steps between."""
    run = Run()
    scale = 0.125
    for step in range(0, 600, 10):
        if step % 100 == 0 and scale > 0.004:
            scale /= 2
            run.line(FAIRSEQ.format(after=scale))
        run.step(step, Sample("loss_scale", scale, step))
    assert run.alerts == []
    assert run.detector.overflows == 5


def test_a_logged_scale_that_falls_to_its_floor_is_critical() -> None:
    run = Run()
    for step, scale in enumerate([128.0, 64.0, 8.0, 0.5, 0.01, 1e-3], start=1):
        run.step(step * 10, Sample("loss_scale", scale, step * 10))
    (alert,) = run.alerts
    assert (alert.severity, alert.step, alert.value) == (Severity.CRITICAL, 60, 1e-3)


def test_megatron_skipping_on_every_interval_long_after_the_start_is_critical() -> None:
    run = Run()
    for step in range(10, 60, 10):  # calibrating
        run.line(megatron(step, 2.0**20 / step, 3))
        run.step(step)
    for step in range(60, 2000, 10):
        run.line(megatron(step, 65536.0, 0))
        run.step(step)
    assert run.alerts == []
    for step in range(2000, 2100, 10):
        run.line(megatron(step, 65536.0, 10))
        run.step(step)
    (alert,) = run.alerts
    assert alert.severity is Severity.CRITICAL
    assert alert.onset_step is not None and 1990 <= alert.onset_step <= 2000
    assert "skipped" in alert.message


def test_megatron_counter_from_samples_when_the_line_is_not_seen() -> None:
    run = Run(LossScaleConfig(skipped_intervals=3))
    for step in range(1, 20):
        run.step(step, Sample("skipped_iterations", 0.0, step))
    for step in range(20, 23):
        run.step(step, Sample("skipped_iterations", 2.0, step))
    (alert,) = run.alerts
    assert (alert.severity, alert.onset_step) == (Severity.CRITICAL, 20)


def test_an_overflow_that_sets_the_scale_below_the_floor_is_critical_from_its_first_line() -> None:
    """A log that begins amid the cascade (an excerpt, a watcher attached late): apex's
    lines as a real maskrcnn-benchmark run printed them, their scale already 2e-25, read as
    samples (replay shows no output line to the rules before a timestamp). The overflow is
    critical on its first line, as it is live: it waited for the second before (a YOLACT
    run's three lines late). A logged level set that low and kept there says nothing."""
    from sentinel.parsing import LineParser

    apex = "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {}"
    parser = LineParser()
    run = Run()
    for scale in (2.0679515313825692e-25, 1.0339757656912846e-25):
        samples = parser.parse(apex.format(scale))
        assert [(s.name, s.value) for s in samples] == [
            ("loss_scale", scale),
            ("loss_scale_overflow", scale),
        ]
        run.alerts += [a for _, a in run.detector.observe_samples(samples, "train.log", NOW)]
    (alert,) = run.alerts
    assert alert.severity is Severity.CRITICAL
    assert "an fp16 overflow set the loss scale to 2.06795e-25" in alert.message

    live = Run()  # the same line shown as output first, then its samples: one alert
    line = apex.format(2.0679515313825692e-25)
    live.alerts += live.detector.output_text(line, "train.log", NOW)
    live.alerts += [
        a for _, a in live.detector.observe_samples(parser.parse(line), "train.log", NOW)
    ]
    assert [a.severity for a in live.alerts] == [Severity.CRITICAL]

    kept = Run()
    for step in range(1, 20):
        kept.step(step, Sample("loss_scale", 1e-4, step))
    assert kept.alerts == []


def test_a_run_that_keeps_its_scale_at_one_is_not_collapsing() -> None:
    run = Run()
    for step in range(1, 20):
        run.step(step, Sample("loss_scale", 1.0, step))
    assert run.alerts == []


def test_overflows_that_cannot_lower_a_scale_at_its_floor_are_critical() -> None:
    """DeepSpeed at its floor (1): ``Attempted loss scale: 1, reducing to 1`` at every step.
    Each step is skipped, nothing trains (a real T5-11B fp16 run), whatever ``min_loss_scale``
    says; three in a row are critical, from the first. A step that passes between them
    trained: the count starts again."""
    from sentinel.parsing.deepspeed import parse_deepspeed

    def overflow(run: Run, step: int) -> None:
        samples = parse_deepspeed(DEEPSPEED.format(before=1, after=1)) or []
        run.step(step, *(Sample(s.name, s.value, step) for s in samples))

    run = Run()
    for step in range(1, 101):
        run.step(step)
    overflow(run, 101)
    overflow(run, 102)
    run.step(103)  # trained
    overflow(run, 104)
    overflow(run, 105)
    assert run.alerts == []
    overflow(run, 106)
    (alert,) = run.alerts
    assert (alert.severity, alert.step, alert.onset_step) == (Severity.CRITICAL, 106, 104)
    assert "at its floor (1)" in alert.message
    halving = Run()  # a scale the overflow still lowers is calibration, not the floor
    for step, before in enumerate((8, 4, 2), start=1):
        samples = parse_deepspeed(DEEPSPEED.format(before=before, after=before // 2)) or []
        halving.step(step, *(Sample(s.name, s.value, step) for s in samples))
    assert halving.alerts == []


def test_job_started_forgets_the_attempt() -> None:
    run = calibrated_deepspeed()
    run.line(DEEPSPEED_FATAL)
    assert len(run.alerts) == 1
    run.detector.job_started(NOW)
    run.line(DEEPSPEED_FATAL)
    assert len(run.alerts) == 2
    assert run.detector.overflows == 0
