"""The engine: lines to samples (steps filled in), every event to every detector, alerts out."""

from __future__ import annotations

import json
import math

import pytest

from sentinel.engine.core import HISTORY_LEN, Engine
from sentinel.model.records import Alert, Line, Sample, Severity
from sentinel.parsing import LineParser
from sentinel.rules import BaseDetector, RuleConfig
from sentinel.rules.job_crash import JobCrashConfig, JobCrashDetector
from sentinel.rules.nan_inf import NanInfConfig, NanInfDetector
from sentinel.rules.stall import StallConfig, StallDetector

T0 = 1_700_000_000.0
TQDM_10 = "  5%|▌   | 10/200 [00:01<00:19,  9.81it/s]"
HF_NAN_GRAD = "{'loss': 2.3, 'grad_norm': nan, 'learning_rate': 5e-05, 'epoch': 0.01}"


class Exploding(BaseDetector):
    """A rule with a bug: raises on whatever hook it is told to."""

    rule = "exploding"

    def __init__(self, on: str) -> None:
        super().__init__(RuleConfig())
        self.on = on
        self.calls = 0

    def _maybe_raise(self, hook: str) -> None:
        self.calls += 1
        if hook == self.on:
            raise ZeroDivisionError("boom")

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        self._maybe_raise("observe")
        return []

    def output(self, line: Line) -> list[Alert]:
        self._maybe_raise("output")
        return []

    def tick(self, now: float) -> list[Alert]:
        self._maybe_raise("tick")
        return []


def engine(*detectors: BaseDetector) -> Engine:
    # Without loss scaling a lone NaN grad-norm is a failure (with it, a skipped fp16 step).
    nan_inf = NanInfDetector(NanInfConfig(loss_scaling="none"))
    return Engine(list(detectors) or [nan_inf], LineParser())


def feed(eng: Engine, *texts: str, source: str = "stdout", at: float = T0) -> list[Alert]:
    alerts: list[Alert] = []
    for text in texts:
        alerts += eng.feed_line(Line(source, text, at))
    return alerts


def test_hf_dict_line_gets_the_step_of_the_last_progress_bar() -> None:
    eng = engine()
    alerts = feed(eng, TQDM_10, HF_NAN_GRAD)
    (alert,) = alerts
    assert alert.rule == "nan_inf"
    assert alert.metric == "grad_norm"
    assert alert.step == 10
    assert alert.onset_step == 10
    assert alert.source == "stdout"


def test_progress_bar_alone_raises_nothing_but_sets_the_step() -> None:
    eng = engine()
    assert feed(eng, TQDM_10) == []
    assert eng.current_step == 10
    assert eng.samples_seen == 0


def test_hf_dict_line_before_any_progress_has_no_step() -> None:
    eng = engine()
    (alert,) = feed(eng, HF_NAN_GRAD)
    assert alert.step is None


def test_json_lines_carry_their_own_steps() -> None:
    eng = engine()
    lines = [json.dumps({"step": s, "loss": 2.0 - s / 10}) for s in range(1, 7)]
    lines.append('{"step": 7, "loss": NaN}')
    alerts = feed(eng, *lines)
    assert [(a.rule, a.step, a.metric) for a in alerts] == [("nan_inf", 7, "loss")]
    assert eng.current_step == 7
    assert eng.samples_seen == 7


def test_json_line_time_becomes_the_data_clock() -> None:
    eng = engine()
    feed(eng, json.dumps({"step": 1, "loss": 1.0, "time": T0 + 42}))
    assert eng.data_time == T0 + 42


def test_garbled_line_is_counted_and_does_not_raise() -> None:
    eng = engine()
    alerts = feed(eng, '{"step": 3, "loss": 2.', '{"step": 4, "loss": NaN}')
    assert eng.parser.stats.garbled == 1
    assert [a.step for a in alerts] == [4]


def test_plain_text_is_not_garbled() -> None:
    eng = engine()
    assert feed(eng, "Loading checkpoint shards...", "saving model") == []
    assert eng.parser.stats.garbled == 0
    assert eng.parser.stats.lines == 2


@pytest.mark.parametrize("hook", ["observe", "output", "tick"])
def test_raising_detector_is_disabled_and_reported(hook: str) -> None:
    bad = Exploding(on=hook)
    good = NanInfDetector(NanInfConfig())
    eng = engine(bad, good)
    alerts = feed(eng, '{"step": 5, "loss": NaN}') + eng.tick(T0 + 1)
    internal = [a for a in alerts if a.rule == "sentinel_internal"]
    assert len(internal) == 1
    assert internal[0].severity is Severity.WARNING
    assert "exploding" in internal[0].message
    assert "ZeroDivisionError" in internal[0].message
    assert bad not in eng.detectors
    assert [a.step for a in alerts if a.rule == "nan_inf"] == [5]


def test_disabled_detector_is_never_called_again() -> None:
    bad = Exploding(on="observe")
    eng = engine(bad, NanInfDetector(NanInfConfig()))
    feed(eng, '{"step": 1, "loss": 1.0}')
    calls = bad.calls
    alerts = feed(eng, '{"step": 2, "loss": 1.0}', '{"step": 3, "loss": Infinity}')
    assert bad.calls == calls
    assert [a.rule for a in alerts] == ["nan_inf"]


def test_internal_alert_time_is_the_callers_now() -> None:
    eng = engine(Exploding(on="tick"))
    (alert,) = eng.tick(T0 + 30)
    # An alert stamped 1970 (time 0.0) is wrong in the journal and in every webhook.
    assert alert.time == T0 + 30


def test_feed_samples_fills_missing_steps() -> None:
    eng = engine()
    eng.feed_samples([Sample("step", 20.0, 20)], "trainer_state.json", T0)
    (alert,) = eng.feed_samples([Sample("loss", math.inf)], "trainer_state.json", T0)
    assert alert.step == 20


def test_recent_returns_last_samples_up_to_onset() -> None:
    eng = engine()
    lines = [json.dumps({"step": s, "loss": 1.0 + s, "grad_norm": 0.5}) for s in range(1, 21)]
    feed(eng, *lines)
    recent = eng.recent(before_step=12, per_metric=4)
    assert [s.step for s in recent["loss"]] == [9, 10, 11, 12]
    assert [s.value for s in recent["loss"]] == [10.0, 11.0, 12.0, 13.0]
    assert [s.step for s in recent["grad_norm"]] == [9, 10, 11, 12]


def test_recent_without_onset_returns_newest() -> None:
    eng = engine()
    feed(eng, *[json.dumps({"step": s, "loss": float(s)}) for s in range(1, 11)])
    assert [s.step for s in eng.recent(None, per_metric=3)["loss"]] == [8, 9, 10]


def test_recent_leaves_out_metrics_only_seen_after_onset() -> None:
    eng = engine()
    feed(eng, json.dumps({"step": 1, "loss": 1.0}), json.dumps({"step": 5, "eval_loss": 2.0}))
    assert set(eng.recent(before_step=3)) == {"loss"}


def test_job_started_resets_step_history_and_detectors() -> None:
    eng = engine()
    feed(eng, '{"step": 50, "loss": NaN}')
    eng.job_started(T0 + 100)
    assert eng.current_step is None
    assert eng.recent(None) == {}
    (alert,) = feed(eng, '{"step": 40, "loss": NaN}')
    assert alert.step == 40


def test_tick_drives_time_based_rules() -> None:
    eng = engine(StallDetector(StallConfig(soft_timeout_s=60, hard_timeout_s=120)))
    eng.job_started(T0)
    assert eng.tick(T0 + 59) == []
    assert [a.severity for a in eng.tick(T0 + 60)] == [Severity.WARNING]


def test_job_exited_reaches_detectors_with_output() -> None:
    eng = engine(JobCrashDetector(JobCrashConfig()))
    eng.job_started(T0)
    feed(eng, TQDM_10, "RuntimeError: CUDA error: device-side assert triggered", source="stderr")
    (alert,) = eng.job_exited(1, T0 + 5, expected=False)
    assert alert.details["class"] == "device_assert"
    assert eng.job_exited(1, T0 + 6, expected=True) == []


class Recorder(BaseDetector):
    """A rule that records the lines and samples it is shown."""

    rule = "recorder"

    def __init__(self) -> None:
        super().__init__(RuleConfig())
        self.lines: list[Line] = []
        self.samples: list[Sample] = []

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        self.samples.append(sample)
        return []

    def output(self, line: Line) -> list[Alert]:
        self.lines.append(line)
        return []


def test_output_rules_see_each_line_with_its_source_and_time() -> None:
    recorder = Recorder()
    eng = engine(recorder)
    eng.feed_line(Line("stderr", "Traceback (most recent call last):", T0))
    eng.feed_text("train.log", '{"step": 1, "loss": 2.0}', T0 + 1)
    assert recorder.lines == [
        Line("stderr", "Traceback (most recent call last):", T0),
        Line("train.log", '{"step": 1, "loss": 2.0}', T0 + 1),
    ]


def test_with_the_data_clock_output_rules_see_the_datas_time() -> None:
    recorder = Recorder()
    eng = Engine([recorder], LineParser(), data_clock=True)
    eng.feed_text("log", "before any timestamp", 0.0)
    eng.feed_text("log", json.dumps({"step": 1, "loss": 2.0, "time": T0 + 5}), 0.0)
    eng.feed_text("log", "no timestamp of its own", 0.0)
    # No clock before the first timestamp: that line is not shown to output rules.
    assert [(line.text[:6], line.time) for line in recorder.lines] == [
        ('{"step', T0 + 5),
        ("no tim", T0 + 5),
    ]


def test_rules_without_their_own_hooks_still_get_samples() -> None:
    class OnlyObserves(BaseDetector):
        rule = "only_observes"
        watches = frozenset({"loss"})

        def __init__(self) -> None:
            super().__init__(RuleConfig())
            self.seen: list[float] = []

        def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
            self.seen.append(sample.value)
            return []

    rule = OnlyObserves()
    eng = Engine([rule], LineParser(), data_clock=True)
    alerts = feed(eng, *[json.dumps({"step": s, "loss": s / 2, "time": T0 + s}) for s in (1, 2)])
    assert alerts == []
    assert rule.seen == [0.5, 1.0]


HF_TRAIN = "{'loss': '2.5', 'grad_norm': '1.0', 'learning_rate': '0.0005', 'epoch': '0.1'}"
HF_EVAL = "{'eval_loss': '2.7', 'eval_runtime': '1.5', 'epoch': '0.1'}"


def test_logging_steps_count_the_steps_of_printed_dicts() -> None:
    recorder = Recorder()
    eng = Engine([recorder], LineParser(), logging_steps=10)
    eng.job_started(T0, start_step=100)
    feed(eng, HF_TRAIN, TQDM_10, HF_TRAIN, HF_EVAL, '{"step": 7, "loss": 1.0}', HF_TRAIN)
    steps = [(sample.name, sample.step) for sample in recorder.samples]
    assert steps == [
        *[(name, 110) for name in ("loss", "grad_norm", "lr", "epoch")],
        *[(name, 120) for name in ("loss", "grad_norm", "lr", "epoch")],
        # An eval line belongs to the step last logged; a line with a step keeps it.
        *[(name, 120) for name in ("eval_loss", "eval_runtime", "epoch")],
        ("loss", 7),
        *[(name, 130) for name in ("loss", "grad_norm", "lr", "epoch")],
    ]


def test_history_per_metric_is_bounded() -> None:
    eng = engine()
    feed(eng, *[json.dumps({"step": s, "loss": 1.0}) for s in range(1, 1001)])
    assert len(eng.history["loss"]) == HISTORY_LEN
    assert eng.history["loss"][-1].step == 1000


@pytest.mark.parametrize(
    ("advancing", "expected"),
    [(True, []), (False, [Severity.WARNING])],
    ids=["bar-advances", "bar-stuck"],
)
def test_progress_bar_steps_are_progress_for_stall(
    advancing: bool, expected: list[Severity]
) -> None:
    """HF logs metrics every logging_steps; its progress bar moves every step in between."""
    eng = engine(StallDetector(StallConfig(soft_timeout_s=60, hard_timeout_s=120)))
    eng.job_started(T0)
    feed(eng, '{"step": 1, "loss": 2.0}', at=T0)
    alerts: list[Alert] = []
    for second in range(1, 100):
        step = 1 + second if advancing else 1
        feed(eng, f"  1%|▏   | {step}/200 [00:01<00:19,  1.00it/s]", at=T0 + second)
        alerts += eng.tick(T0 + second)
    assert [a.severity for a in alerts] == expected


@pytest.mark.parametrize("lines_per_read", [1, 40])  # 40: the block path
def test_the_engine_says_since_when_each_step_may_have_been_logged(lines_per_read: int) -> None:
    """What a rollback placing checkpoints by time reads of the last healthy value: a time
    before which its line was not there yet: the start of the window of the read that found
    it (0.27 s before it is handed on), or the read of its source before that one where
    later. Not when it was read: a save written after it and read with it (with the first
    bad value after the save) would sit before the onset. Nor the source's read before,
    which for a log line every minute is a minute early."""
    from sentinel.config import Settings
    from sentinel.engine.core import READ_WINDOW_S, Engine, build_detectors
    from sentinel.parsing import LineParser

    engine = Engine(build_detectors(Settings()), LineParser())
    step = 0
    reads = (100.0, 160.0, 160.1, 220.0)
    for at in reads:
        lines = []
        for _ in range(lines_per_read):
            step += 10
            lines.append(f'{{"step": {step}, "loss": 1.0}}')
        engine.feed_texts("train.log", lines, at)
        engine.feed_texts("other.log", ['{"acc": 0.5}'], at + 0.05)  # another source's reads
    last_of = [lines_per_read * 10 * n for n in (1, 2, 3, 4)]
    first_of = [s - (lines_per_read - 1) * 10 for s in last_of]
    # 160.1 comes within the window of 160.0: nothing it holds was there at 160.0.
    expected = [100.0 - READ_WINDOW_S, 160.0 - READ_WINDOW_S, 160.0, 220.0 - READ_WINDOW_S]
    assert [engine.written_after(s) for s in first_of] == pytest.approx(expected)
    assert [engine.written_after(s) for s in last_of] == pytest.approx(expected)
    assert engine.written_after(last_of[-1] + 10) is None


@pytest.mark.parametrize("lines_per_look", [1, 40])  # 40: the block path
def test_lines_handed_on_with_marks_are_placed_by_the_look_that_found_them(
    lines_per_look: int,
) -> None:
    """A reader gathers a window of lines and hands them on at once; each look that found
    some noted when they were written at the earliest (``Marks``). Each step is placed by
    its look's bound, not by the window's start (a second early, for a save made within
    it to sit after the last healthy value); looks closer than ``PART_S`` to the one before
    share its bound (one part, one block for the rules); lines before the first mark are
    placed by the window."""
    from sentinel.config import Settings
    from sentinel.engine.core import READ_WINDOW_S, Engine, build_detectors
    from sentinel.parsing import LineParser
    from sentinel.parsing.lines import PART_S, UNKNOWN

    engine = Engine(build_detectors(Settings()), LineParser())
    engine.feed_texts("train.log", ['{"step": 1, "loss": 1.0}'], 99.0)
    looks = (99.2, 99.5, 99.5 + PART_S / 2, 99.9)  # the bound of each look's lines
    lines, marks = [], []
    step = 1
    for since in looks:
        marks.append((len(lines) + 1, since))
        for _ in range(lines_per_look):
            step += 1
            lines.append(f'{{"step": {step}, "loss": 1.0}}')
    engine.feed_texts("train.log", ['{"step": 0, "acc": 1}', *lines], 100.0, tuple(marks))
    firsts = [2 + look * lines_per_look for look in range(len(looks))]
    placed = [engine.written_after(s) for s in firsts]
    assert placed == pytest.approx([99.2, 99.5, 99.5, 99.9])
    assert engine.written_after(step) == pytest.approx(looks[-1])
    # The mark says it, not the source's read before (100.0): a reader that gathers hands
    # on at its window's end, and what it reads after may have been written before it.
    engine.feed_texts("train.log", ['{"step": 900, "loss": 1.0}'], 100.5, ((0, 99.95),))
    assert engine.written_after(900) == pytest.approx(99.95)
    # Lines of unknown age (a file's bytes from before its first read) by the read before.
    engine.feed_texts("train.log", ['{"step": 902, "loss": 1.0}'], 100.7, ((0, UNKNOWN),))
    assert engine.written_after(902) == pytest.approx(100.5)
    # Without marks, the window's start, or the read before where later.
    engine.feed_texts("train.log", ['{"step": 903, "loss": 1.0}'], 200.0)
    assert engine.written_after(903) == pytest.approx(200.0 - READ_WINDOW_S)
