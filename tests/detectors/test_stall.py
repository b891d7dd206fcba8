"""stall: timeouts from the run's own rhythm; critical only on hang evidence or none at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pydantic
import pytest

from sentinel.model.machine import (
    GPU_JOB,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_UTIL,
    PROC_CPU,
    PROC_D_STATE,
    PROCESS_SOURCE,
    SYSTEM_METRICS,
    gpu_source,
)
from sentinel.model.records import Alert, Line, Sample, Severity
from sentinel.rules.stall import StallConfig, StallDetector, starts_a_run

T0 = 1_700_000_000.0
SOFT = 600.0
HARD = 1800.0
#: Learned-timeout settings: 10 gaps of 1 s learn soft = max(60, 20 x 1, 1.5 x 1) = 60 s.
MIN = 60.0

#: What one reading feeds: (source, samples).
Reading = list[tuple[str, list[Sample]]]


def started(at: float = T0, **config: Any) -> StallDetector:
    settings = {"soft_timeout_s": SOFT, "hard_timeout_s": HARD, **config}
    detector = StallDetector(StallConfig(**settings))
    detector.job_started(at)
    return detector


def step(detector: StallDetector, number: int, offset: float) -> list[Alert]:
    return detector.observe(Sample("loss", 2.0, number), "stdout", T0 + offset)


def learned(gaps: int = 10, **config: Any) -> StallDetector:
    """A detector that saw steps 0..gaps one second apart (the last at T0 + gaps)."""
    detector = started(min_timeout_s=MIN, **config)
    for number in range(gaps + 1):
        step(detector, number, number)
    return detector


def ticks(detector: StallDetector, offsets: list[float]) -> list[Alert]:
    """The clock ticks at each offset, as live: a second before it as well, so the rule
    watched the silence (one the clock jumps over is replay's: see ``replayed``)."""
    alerts: list[Alert] = []
    for offset in offsets:
        alerts += detector.tick(T0 + offset - 1)
        alerts += detector.tick(T0 + offset)
    return alerts


def gpu(
    power_w: float, *, util: float = 100.0, limit_w: float = 700.0, job: bool = True, index: int = 0
) -> Reading:
    samples = [
        Sample(GPU_UTIL, util),
        Sample(GPU_POWER, power_w),
        Sample(GPU_POWER_LIMIT, limit_w),
        Sample(GPU_JOB, 1.0 if job else 0.0),
    ]
    return [(gpu_source(index), samples)]


def proc(cpu: float, d_state: int = 0) -> Reading:
    return [(PROCESS_SOURCE, [Sample(PROC_CPU, cpu), Sample(PROC_D_STATE, float(d_state))])]


def watched(detector: StallDetector, offsets: list[float], reading: Reading) -> list[Alert]:
    """At each offset: the sources read (``reading``), then the clock ticks."""
    alerts: list[Alert] = []
    for offset in offsets:
        for source, samples in reading:
            for sample in samples:
                alerts += detector.observe(sample, source, T0 + offset)
        alerts += detector.tick(T0 + offset)
    return alerts


def severities(alerts: list[Alert]) -> list[Severity]:
    return [alert.severity for alert in alerts]


# --- the fixed timeouts: not learned, no evidence (replay, no GPU or process source) ---------


@pytest.mark.parametrize(
    "silent_s", [0.0, 1.0, SOFT / 2, SOFT - 0.001], ids=["zero", "1s", "half-soft", "just-below"]
)
def test_silence_below_soft_raises_nothing(silent_s: float) -> None:
    assert ticks(started(), [silent_s]) == []


def test_soft_timeout_warns_once() -> None:
    alerts = ticks(started(), [SOFT, SOFT + 1, SOFT + 100, HARD - 1])
    assert severities(alerts) == [Severity.WARNING]
    assert alerts[0].rule == "stall"
    assert not alerts[0].resolves


def test_hard_timeout_without_evidence_escalates_to_one_critical() -> None:
    alerts = ticks(started(), [SOFT, HARD, HARD + 1, HARD * 3])
    assert severities(alerts) == [Severity.WARNING, Severity.CRITICAL]
    assert alerts[1].details["evidence"]["verdict"] == "none"


def test_jump_straight_past_hard_gives_only_critical() -> None:
    alerts = ticks(started(), [HARD + 5])
    assert severities(alerts) == [Severity.CRITICAL]
    assert alerts[0].value == pytest.approx(HARD + 5)


def test_alert_names_last_step_onset_step_and_onset_time() -> None:
    detector = started()
    step(detector, 41, 10)
    (alert,) = ticks(detector, [10 + SOFT])
    assert alert.step == 41
    assert alert.onset_step == 42
    assert alert.metric == "silence_s"
    assert alert.details["onset_time"] == T0 + 10  # the silence began at the last step


def test_new_step_resets_the_silence() -> None:
    detector = started()
    step(detector, 10, 0)
    step(detector, 11, 100)
    assert ticks(detector, [SOFT + 50]) == []  # 650 s after T0, only 550 s after progress
    assert severities(ticks(detector, [100 + SOFT])) == [Severity.WARNING]


def test_output_is_progress_while_the_job_has_logged_no_step() -> None:
    detector = started()
    detector.output(Line("stdout", "still alive", T0 + 500))
    assert ticks(detector, [SOFT + 100]) == []
    assert severities(ticks(detector, [500 + SOFT])) == [Severity.WARNING]


@pytest.mark.parametrize(
    "activity",
    [
        lambda d: d.output(Line("stdout", "still alive", T0 + 500)),
        lambda d: d.observe(Sample("loss", 2.0, 10), "stdout", T0 + 500),
        lambda d: d.observe(Sample("grad_norm", 1.0, 10), "stdout", T0 + 550),
        lambda d: d.observe(Sample("loss", 2.0, 9), "stdout", T0 + 500),
        lambda d: d.observe(Sample("eval_loss", 2.0, 10, time=T0 + 500), "m.jsonl", T0 + 500),
    ],
    ids=[
        "output-line",
        "same-step",
        "same-step-other-metric",
        "lower-step",
        "timestamped-same-step",
    ],
)
def test_activity_without_a_new_step_is_not_progress(
    activity: Callable[[StallDetector], object],
) -> None:
    detector = started()
    step(detector, 10, 0)
    activity(detector)
    assert severities(ticks(detector, [SOFT])) == [Severity.WARNING]


@pytest.mark.parametrize("name", sorted(SYSTEM_METRICS), ids=sorted(SYSTEM_METRICS))
def test_system_samples_never_count_as_progress(name: str) -> None:
    detector = started()
    step(detector, 10, 0)
    # Even with a higher step (the engine fills in its own), a reading is not progress.
    detector.observe(Sample(name, 1.0, 11), PROCESS_SOURCE, T0 + 500)
    assert severities(ticks(detector, [SOFT])) == [Severity.WARNING]


def test_system_samples_are_not_progress_before_any_step() -> None:
    detector = started()
    detector.observe(Sample(GPU_POWER, 300.0), gpu_source(0), T0 + 500)
    assert severities(ticks(detector, [SOFT])) == [Severity.WARNING]


def test_progress_after_warning_resolves() -> None:
    detector = started()
    step(detector, 10, 0)
    ticks(detector, [SOFT])
    (resolved,) = step(detector, 11, SOFT + 5)
    assert resolved.resolves
    assert resolved.rule == "stall"
    assert resolved.severity is Severity.INFO
    assert resolved.step == 11


def test_output_after_critical_resolves_once_before_any_step() -> None:
    detector = started()
    ticks(detector, [HARD])
    first = detector.output(Line("stdout", "back", T0 + HARD + 1))
    second = detector.output(Line("stdout", "again", T0 + HARD + 2))
    assert [a.resolves for a in first] == [True]
    assert second == []


def test_progress_without_a_stall_resolves_nothing() -> None:
    detector = started()
    assert detector.output(Line("stdout", "hello", T0 + 5)) == []
    assert step(detector, 1, 6) == []


def test_stall_again_after_resolve_warns_again() -> None:
    detector = started()
    ticks(detector, [SOFT])
    detector.output(Line("stdout", "back", T0 + SOFT + 1))
    assert severities(ticks(detector, [2 * SOFT + 1])) == [Severity.WARNING]


def test_nothing_before_job_started_or_first_data() -> None:
    detector = StallDetector(StallConfig())
    assert detector.tick(T0) == []
    assert detector.tick(T0 + HARD * 10) == []


def test_samples_before_job_started_do_not_start_the_clock() -> None:
    # The engine starts the clock (job_started): live at launch, in replay at the first timestamp.
    detector = StallDetector(StallConfig())
    detector.observe(Sample("loss", 2.0, 1, time=T0), "m.jsonl", 0.0)
    assert ticks(detector, [SOFT, HARD * 2]) == []


def test_job_started_resets_level_and_clock() -> None:
    detector = started()
    ticks(detector, [HARD])
    detector.job_started(T0 + HARD + 10)
    assert ticks(detector, [HARD + 10 + SOFT - 1]) == []
    assert severities(ticks(detector, [HARD + 10 + SOFT])) == [Severity.WARNING]


# --- adaptive timeouts --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("silent_s", "expected"),
    [
        (MIN - 1, []),
        (MIN, [Severity.WARNING]),
        (3 * MIN, [Severity.CRITICAL]),  # hard = max(3 x soft, soft + min)
    ],
    ids=["below-learned-soft", "learned-soft", "learned-hard"],
)
def test_learned_timeouts_follow_a_fast_run(silent_s: float, expected: list[Severity]) -> None:
    detector = learned()
    assert severities(ticks(detector, [10 + silent_s])) == expected


@pytest.mark.parametrize(
    ("gaps", "adaptive"), [(9, True), (20, False)], ids=["too-few-gaps", "adaptive-off"]
)
def test_fixed_timeouts_until_learned_or_when_off(gaps: int, adaptive: bool) -> None:
    detector = learned(gaps, adaptive=adaptive)
    assert ticks(detector, [gaps + SOFT - 1]) == []
    assert severities(ticks(detector, [gaps + SOFT])) == [Severity.WARNING]


def test_learned_timeouts_scale_with_a_slow_step() -> None:
    detector = started(min_timeout_s=MIN)
    for number in range(11):
        step(detector, number, 30.0 * number)  # 30 s steps: soft = 20 x 30 s
    assert detector.timeouts().soft_s == pytest.approx(600.0)
    assert detector.timeouts().hard_s == pytest.approx(1800.0)


def test_steps_read_in_one_burst_are_not_gaps() -> None:
    detector = started(min_timeout_s=MIN)
    for number in range(30):
        step(detector, number, 5.0)  # a file read at once: one moment
    assert not detector.timeouts().learned
    assert detector.timeouts().soft_s == SOFT


SAVE = 100.0  # a checkpoint save: warns the first time (learned soft is 60 s)


def run_with_one_save() -> tuple[StallDetector, list[Alert], float]:
    """10 quick steps, a save of SAVE seconds, 10 more quick steps; (detector, alerts, end)."""
    detector = learned()
    alerts = ticks(detector, [10 + MIN])  # the first save warns...
    at = 10 + SAVE
    alerts += step(detector, 11, at)  # ...and resolves when it ends
    for number in range(12, 22):
        at += 1
        alerts += step(detector, number, at)
    return detector, alerts, at


def test_first_save_warns_and_resolves() -> None:
    _, alerts, _ = run_with_one_save()
    assert severities(alerts) == [Severity.WARNING, Severity.INFO]


@pytest.mark.parametrize(
    ("pause_s", "expected"),
    [
        (SAVE, []),
        (1.4 * SAVE, []),
        (1.5 * SAVE, [Severity.WARNING]),  # soft = gap_factor x the longest gap
    ],
    ids=["same-save-again", "save-a-bit-longer", "pause-beyond-gap-factor"],
)
def test_a_save_as_long_as_one_before_raises_nothing(
    pause_s: float, expected: list[Severity]
) -> None:
    detector, _, end = run_with_one_save()
    assert severities(ticks(detector, [end + pause_s / 2, end + pause_s])) == expected


def test_a_gap_past_the_hard_timeout_is_learned_capped_at_it() -> None:
    detector = learned()
    hard_s = detector.timeouts().hard_s
    assert severities(ticks(detector, [10 + 10 * hard_s])) == [Severity.CRITICAL]
    step(detector, 11, 10 + 10 * hard_s)
    assert detector.timeouts().soft_s == pytest.approx(1.5 * hard_s)


def test_learning_survives_a_restart_but_the_clock_starts_again() -> None:
    detector = learned()
    detector.job_started(T0 + 1000)
    assert ticks(detector, [1000 + MIN - 1]) == []
    assert severities(ticks(detector, [1000 + MIN])) == [Severity.WARNING]


def test_a_restart_may_take_as_long_as_the_first_start() -> None:
    detector = started(min_timeout_s=MIN)
    for number in range(11):
        step(detector, number, 200.0 + number)  # 200 s to load before the first step
    detector.job_started(T0 + 1000)
    assert ticks(detector, [1000 + 1.5 * 200 - 1]) == []
    assert severities(ticks(detector, [1000 + 1.5 * 200])) == [Severity.WARNING]


# --- evidence -----------------------------------------------------------------------------


def test_nccl_hang_signature_is_critical_at_the_hard_timeout() -> None:
    detector = started()
    alerts = watched(detector, [SOFT, HARD - 1, HARD], gpu(70.0, util=100.0))
    assert severities(alerts) == [Severity.WARNING, Severity.CRITICAL]
    critical = alerts[1]
    assert "util 100% at 70 W of 700 W" in critical.message
    assert critical.details["evidence"]["verdict"] == "hang"
    assert critical.details["evidence"]["gpus"] == [
        {"source": "gpu:0", "util_percent": 100.0, "power_w": 70.0, "power_limit_w": 700.0}
    ]


@pytest.mark.parametrize(
    "reading",
    [
        gpu(600.0, util=100.0),
        gpu(600.0, util=0.0),  # utilisation is no evidence either way: power is
        proc(cpu=100.0),
        gpu(600.0) + gpu(70.0, index=1),  # not every GPU idle: not a collective hang
        gpu(70.0, job=False) + proc(cpu=100.0),  # another job's idle GPU says nothing
    ],
    ids=["gpu-at-power", "gpu-at-power-util-0", "cpu-busy", "one-gpu-of-two-busy", "foreign-gpu"],
)
def test_busy_job_is_held_at_warning_past_the_hard_timeout(reading: Reading) -> None:
    detector = started()
    alerts = watched(detector, [SOFT, HARD, 2 * HARD - 1], reading)
    assert severities(alerts) == [Severity.WARNING]
    assert alerts[0].details["evidence"]["verdict"] == "busy"


def test_busy_job_goes_critical_at_the_busy_timeout() -> None:
    detector = started()
    alerts = watched(detector, [SOFT, HARD, 2 * HARD], gpu(600.0))
    assert severities(alerts) == [Severity.WARNING, Severity.CRITICAL]
    assert "although the job is busy" in alerts[1].message
    assert "evaluation far longer than any before" in alerts[1].message


def test_output_during_the_silence_is_busy_evidence() -> None:
    detector = started()
    step(detector, 10, 0)
    alerts = ticks(detector, [SOFT])
    detector.output(Line("stderr", "Evaluating: 40%", T0 + HARD - 60))
    alerts += ticks(detector, [HARD])
    assert severities(alerts) == [Severity.WARNING]
    evidence = detector.evidence(T0 + HARD)
    assert (evidence.verdict, evidence.output_age_s) == ("busy", 60.0)
    assert "last output 60 s ago" in evidence.describe()


@pytest.mark.parametrize(
    "reading",
    [proc(cpu=1.0), proc(cpu=100.0) + gpu(70.0)],
    ids=["cpu-idle", "cpu-busy-gpus-low"],
)
def test_hang_evidence_is_critical_at_the_hard_timeout(reading: Reading) -> None:
    detector = started()
    alerts = watched(detector, [SOFT, HARD], reading)
    assert severities(alerts) == [Severity.WARNING, Severity.CRITICAL]
    assert alerts[1].details["evidence"]["verdict"] == "hang"


D_STATE_TEXT = (
    "1 process(es) in uninterruptible sleep (D state): SIGTERM will not stop them until"
    " their I/O returns; the node may need draining"
)


def test_d_state_is_said_in_the_warning_and_the_critical() -> None:
    detector = started()
    alerts = watched(detector, [SOFT, HARD], proc(cpu=100.0, d_state=1) + gpu(600.0))
    assert severities(alerts) == [Severity.WARNING, Severity.CRITICAL]
    assert all(D_STATE_TEXT in alert.message for alert in alerts)
    assert alerts[1].details["evidence"]["d_state"] == 1


@pytest.mark.parametrize(
    "read_at",
    [HARD - 60, -1.0],
    ids=["older-than-max-age", "before-the-silence"],
)
def test_stale_readings_are_no_evidence(read_at: float) -> None:
    detector = started()
    step(detector, 10, 0)
    watched(detector, [read_at], gpu(600.0))
    alerts = ticks(detector, [HARD])
    assert severities(alerts) == [Severity.CRITICAL]
    assert alerts[0].details["evidence"]["verdict"] == "none"


def test_critical_message_reads_as_a_hang_with_its_evidence() -> None:
    detector = started()
    step(detector, 7, 0)
    (alert,) = watched(detector, [HARD], proc(cpu=2.0))
    assert alert.message.startswith("no step after 7 for 1800 s (hard timeout 1800 s)")
    assert "process tree CPU 2%" in alert.message
    assert alert.message.endswith("it looks hung")


# --- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("soft", "hard"), [(600.0, 600.0), (600.0, 300.0)], ids=["hard-equals-soft", "hard-below-soft"]
)
def test_config_rejects_hard_not_after_soft(soft: float, hard: float) -> None:
    with pytest.raises(pydantic.ValidationError, match="hard_timeout_s must be greater"):
        StallConfig(soft_timeout_s=soft, hard_timeout_s=hard)


def test_config_defaults_are_ten_and_thirty_minutes_until_learned() -> None:
    config = StallConfig()
    assert (config.soft_timeout_s, config.hard_timeout_s) == (600.0, 1800.0)
    assert config.adaptive


# --- a silence nobody watched: judged by how it ended -------------------------------------


#: A line as replay feeds it: (offset from T0, output text or None, step or None). A line
#: with neither is a timestamped metric line that names no step.
Logged = tuple[float, str | None, int | None]


def replayed(lines: list[Logged], **config: Any) -> list[Alert]:
    """Replay's way in: the data's own clock starts the attempt at the first line and ticks
    before each line that moves it on; then the line's output, then its sample."""
    detector = StallDetector(StallConfig(**config))
    alerts: list[Alert] = []
    clock: float | None = None
    for offset, text, number in lines:
        now = T0 + offset
        if clock is None:
            detector.job_started(now)
        elif now > clock:
            alerts += detector.tick(now)
        clock = now if clock is None else max(clock, now)
        if text is not None:
            alerts += detector.output(Line("train.log", text, now))
        if number is not None or text is None:
            alerts += detector.observe(Sample("loss", 2.0, number, now), "train.log", now)
    return alerts


def steps_every(first: int, count: int, start_s: float, gap_s: float) -> list[Logged]:
    return [(start_s + gap_s * i, None, first + i) for i in range(count)]


TEN_HOURS = 36_000.0


@pytest.mark.parametrize(
    "second_attempt",
    [
        steps_every(11, 10, TEN_HOURS, 30.0),
        [
            (TEN_HOURS, "Resuming training from checkpoint-20", None),
            *steps_every(21, 10, TEN_HOURS + 30, 30.0),
        ],
        [
            (TEN_HOURS, "2026-05-09 11:39:17 | INFO | [Checkpoint] Loaded <- best.pth", None),
            *steps_every(15, 10, TEN_HOURS + 30, 30.0),
        ],
    ],
    ids=["step-goes-back", "resume-banner", "checkpoint-loaded-then-steps-go-back"],
)
def test_replay_a_run_started_again_after_a_long_gap_is_no_stall(
    second_attempt: list[Logged],
) -> None:
    """An appended log: the job was stopped after step 20 and re-run ten hours later."""
    assert replayed(steps_every(1, 20, 0.0, 30.0) + second_attempt) == []


def test_replay_lines_back_before_the_first_step_of_a_restart_are_no_stall() -> None:
    """The re-run job prints while it loads, then logs from an earlier step: no banner
    sentinel knows, but the step going back tells, within a soft timeout of the gap."""
    loading = [(TEN_HOURS + offset, "Building the model...", None) for offset in (0, 5, 10)]
    lines = [*steps_every(1, 20, 0.0, 30.0), *loading, *steps_every(11, 5, TEN_HOURS + 60, 30.0)]
    assert replayed(lines) == []


def test_replay_lines_back_without_a_step_for_a_soft_timeout_are_judged() -> None:
    """Past a soft timeout of output after the gap, still no step: a hang that prints."""
    printing = [(TEN_HOURS + offset, "NCCL watchdog: still waiting", None) for offset in (0, 60)]
    printing.append((TEN_HOURS + 700, "NCCL watchdog: still waiting", None))
    alerts = replayed([*steps_every(1, 20, 0.0, 30.0), *printing])
    assert [alert.severity for alert in alerts] == [Severity.CRITICAL]


@pytest.mark.parametrize(
    ("text", "starts"),
    [
        ("2026-05-09 11:39:17 | INFO | [Checkpoint] Loaded <- vgg16_best_model.pth", True),
        ("2026-05-09 11:39:17 | INFO | [Training] Starting - 30 epochs max", True),
        ("Restoring states from the checkpoint path at ckpt/last.ckpt", True),
        ("fairseq.checkpoint_utils | loaded checkpoint ckpt/checkpoint_last.pt", True),
        ("Resuming training from checkpoint-500", True),
        ("***** Running training *****", True),
        ("fairseq.checkpoint_utils | saved checkpoint ckpt/checkpoint8.pt (epoch 8)", False),
        ("Saving model checkpoint to out/checkpoint-500", False),
        ("NCCL watchdog: still waiting", False),
    ],
)
def test_a_line_that_starts_a_run(text: str, starts: bool) -> None:
    assert starts_a_run(text) is starts


def test_replay_a_banner_ends_the_silence_of_a_run_that_logs_no_step() -> None:
    first = [(480.0 * i, None, None) for i in range(12)]
    second = [(TEN_HOURS, "[Training] Starting - 30 epochs max", None)]
    second += [(TEN_HOURS + 480.0 * i, None, None) for i in range(1, 4)]
    assert replayed(first + second) == []


def test_replay_a_run_that_logs_no_step_coming_back_without_a_banner_only_warns() -> None:
    """Its lines coming back cannot tell a hang from a restart: never critical."""
    lines = [(30.0 * i, None, None) for i in range(12)] + [(TEN_HOURS, None, None)]
    assert summary(replayed(lines)) == [(Severity.WARNING, False), (Severity.INFO, True)]


def test_replay_a_hang_inside_one_attempt_is_still_critical() -> None:
    """The next step after two hours, where steps came every 30 s: the job was alive and
    made no step; judged as the watched silence would have been."""
    lines = steps_every(1, 20, 0.0, 30.0) + steps_every(21, 5, 7200.0, 30.0)
    assert summary(replayed(lines)) == [(Severity.CRITICAL, False), (Severity.INFO, True)]


@pytest.mark.parametrize(
    ("next_step", "expected"),
    [
        (3009, []),  # 99 updates in 1522 s: 15 s each, the run's own pace
        (2911, [(Severity.WARNING, False), (Severity.INFO, True)]),
    ],
    ids=["a-hundred-steps-done", "one-step-done"],
)
def test_replay_steps_done_through_a_silence_are_the_runs_cadence(
    next_step: int, expected: list[tuple[Severity, bool]]
) -> None:
    """fairseq logs every 100 updates, ~25 minutes apart: the steps say it was working."""
    lines: list[Logged] = [(0.0, None, 2910), (21.0, "valid | epoch 008", None)]
    lines += [(27.0, "saved checkpoint checkpoint8.pt", None), (1522.0, None, next_step)]
    assert summary(replayed(lines)) == expected


@pytest.mark.parametrize(
    ("silent_s", "expected"),
    [(740.0, []), (760.0, [(Severity.WARNING, False), (Severity.INFO, True)])],
    ids=["under-1.5x-the-longest-gap", "past-it"],
)
def test_before_its_rhythm_is_learned_a_run_is_judged_against_its_longest_gap(
    silent_s: float, expected: list[tuple[Severity, bool]]
) -> None:
    """Epoch lines that name no step, ~8 minutes apart (up to 500 s): four gaps, not yet
    learned, already raise the 600 s soft timeout to 1.5 x 500 s."""
    offsets = [0.0, 480.0, 960.0, 1460.0, 1900.0]
    lines: list[Logged] = [(offset, None, None) for offset in offsets]
    lines.append((1900.0 + silent_s, None, None))
    assert summary(replayed(lines)) == expected


def test_live_a_silence_the_clock_jumped_over_is_judged_at_the_next_tick() -> None:
    """Sentinel asleep past the hard timeout: nothing at the tick that wakes it, which
    has not watched the silence; the next tick, a second later, judges it."""
    detector = started()
    step(detector, 7, 0)
    assert detector.tick(T0 + HARD + 5) == []
    assert severities(detector.tick(T0 + HARD + 6)) == [Severity.CRITICAL]


def summary(alerts: list[Alert]) -> list[tuple[Severity, bool]]:
    return [(alert.severity, alert.resolves) for alert in alerts]
