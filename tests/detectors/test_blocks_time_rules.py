"""stall, cost_overrun, job_crash and gpu_health say the same with blocks as line by line.

Each case builds a JSON-lines log (0.5 s a step unless said otherwise) in which the rule
really raises, feeds it to one engine taking blocks and to one fed line by line, and
compares every alert and the end state, float for float (``tests/detectors/blockcheck``).
The logs put the trouble inside what would be one block, and many sit exactly on an
edge of a rule's proof that a block is calm: a silence exactly at a learned timeout, a
checkpoint gap of a length learned before, spend crossing a budget level inside a
block, a crash line pushed just out of the tail.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from sentinel.engine.core import Engine
from sentinel.model.facts import RunFacts
from sentinel.model.machine import GPU_XID
from sentinel.model.records import Alert, Sample
from sentinel.parsing import LineParser
from sentinel.rules import BaseDetector
from sentinel.rules.cost_overrun import CostOverrunConfig, CostOverrunDetector
from sentinel.rules.gpu_health import GpuHealthConfig, GpuHealthDetector
from sentinel.rules.job_crash import JobCrashConfig, JobCrashDetector
from sentinel.rules.stall import StallConfig, StallDetector
from tests.detectors.blockcheck import SOURCE, T0, Run, alert_key, run, snapshot

STEP_S = 0.5
#: 4 GPUs at 2.00 an hour: 8.00 an hour, 1.00 every 450 s.
FACTS = RunFacts(gpus=4, price_per_gpu_hour=2.0)

Make = Callable[[], Sequence[BaseDetector]]


def metrics_log(
    lines: int,
    *,
    gaps_s: dict[int, float] | None = None,
    resume_at: dict[int, int] | None = None,
    misstamped: dict[int, float] | None = None,
    stamped: bool = True,
    start: float = T0,
) -> list[str]:
    """``lines`` JSON lines, ``STEP_S`` apart; ``gaps_s``: line -> seconds since the line
    before (a save, a hang); ``resume_at``: line -> steps the job goes back there;
    ``misstamped``: line -> seconds its timestamp is off (that line's alone); ``start``:
    the time before the first line."""
    gaps_s, resume_at, misstamped = gaps_s or {}, resume_at or {}, misstamped or {}
    out: list[str] = []
    now, step = start, 0
    for index in range(lines):
        now += gaps_s.get(index, STEP_S)
        step += 1 - resume_at.get(index, 0)
        record: dict[str, Any] = {
            "step": step,
            "loss": 2.0 + 1.0 / (1 + index),
            "grad_norm": 1.0 + (index % 7) * 0.01,
        }
        if stamped:
            record["time"] = now + misstamped.get(index, 0.0)
        out.append(json.dumps(record))
    return out


def both(make: Make, texts: list[str], *, facts: RunFacts | None = None) -> tuple[Run, Run]:
    """The log fed line by line, and with blocks."""
    line_by_line = run(make, texts, blocks=False, facts=facts)
    blocks = run(make, texts, blocks=True, facts=facts)
    return line_by_line, blocks


def severities(found: Run) -> list[str]:
    return [alert[1] for alert in found.alerts]


def assert_same(line_by_line: Run, blocks: Run, lines: int) -> None:
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    assert blocks.lines_absorbed > lines // 2  # the block path did the work


# -- stall ----------------------------------------------------------------------------------


def stall(**config: Any) -> Make:
    return lambda: [StallDetector(StallConfig(**config))]


@pytest.mark.parametrize(
    ("config", "gap_s"),
    [
        pytest.param({}, 400.0, id="default-learned-300s"),
        pytest.param({"adaptive": False, "soft_timeout_s": 90.0}, 100.0, id="fixed-90s"),
        # Learned soft timeout 10 s (20 x 0.5 s), and no gap up to 2 x 5 s is capped.
        pytest.param({"min_timeout_s": 5.0, "learn_steps": 3}, 10.0, id="exactly-learned-10s"),
    ],
)
@pytest.mark.slow
def test_a_silence_inside_a_block_warns_then_resolves(config: dict[str, Any], gap_s: float) -> None:
    texts = metrics_log(3000, gaps_s={1700: gap_s})
    line_by_line, blocks = both(stall(**config), texts)
    assert severities(line_by_line) == ["warning", "info"]
    assert_same(line_by_line, blocks, len(texts))


@pytest.mark.parametrize(
    ("second_gap_s", "expected"),
    [
        pytest.param(350.0, [], id="past-least-soft-under-learned"),
        pytest.param(374.5, [], id="just-under-learned-soft"),
        pytest.param(375.0, ["warning", "info"], id="exactly-learned-soft"),
        pytest.param(700.0, ["warning", "info"], id="past-uncapped"),
    ],
)
@pytest.mark.slow
def test_a_checkpoint_gap_as_long_as_one_learned(second_gap_s: float, expected: list[str]) -> None:
    """A first save of 250 s teaches a soft timeout of 1.5 x 250 = 375 s: a second one up
    to that is silent, though past the least soft timeout (300 s) the rule works its
    timeouts out on the tick, which only the line-by-line path does."""
    texts = metrics_log(3000, gaps_s={1000: 250.0, 2200: second_gap_s})
    line_by_line, blocks = both(stall(), texts)
    assert severities(line_by_line) == expected
    assert_same(line_by_line, blocks, len(texts))


def test_a_resume_replaying_old_steps_is_no_progress() -> None:
    """The job goes 700 steps back: 350 s of steps already seen, past the learned 300 s."""
    texts = metrics_log(3000, resume_at={1500: 700})
    line_by_line, blocks = both(stall(), texts)
    assert severities(line_by_line) == ["warning", "info"]
    assert_same(line_by_line, blocks, len(texts))


@pytest.mark.slow
def test_a_hang_goes_critical_with_no_evidence_to_hold_it() -> None:
    """Past the learned hard timeout (max(3 x 300, 300 + 300) = 900 s) with no GPU or
    process source, replay's only verdict is critical."""
    texts = metrics_log(3000, gaps_s={2000: 1000.0})
    line_by_line, blocks = both(stall(), texts)
    assert severities(line_by_line) == ["critical", "info"]
    assert_same(line_by_line, blocks, len(texts))


def test_a_timestamp_far_back_makes_the_next_gap_capped() -> None:
    """One line stamped 1000 s early: the gap after it passes the hard timeout (900 s
    learned) and is learned capped at it, though no tick measures a long silence (the
    job skipped a few steps just before, which only makes the steps irregular)."""
    texts = metrics_log(3000, resume_at={1490: -5}, misstamped={1500: -1000.0})
    line_by_line, blocks = both(stall(), texts)
    assert line_by_line.alerts == []
    assert line_by_line.state["rules"]["stall"]["_longest_gap_s"] == snapshot(900.0)
    assert_same(line_by_line, blocks, len(texts))


def test_a_last_line_stamped_back_leaves_progress_at_the_latest_time() -> None:
    """The block's last line is stamped before the line ahead of it: its clock stays put,
    and the progress made is the latest time, not the last line's."""
    texts = metrics_log(3000, misstamped={2999: -0.7})
    line_by_line, blocks = both(stall(), texts)
    last_progress = line_by_line.state["rules"]["stall"]["_last_progress"]
    assert last_progress == snapshot(T0 + 2999 * STEP_S)  # the line before the last
    assert_same(line_by_line, blocks, len(texts))


# -- cost_overrun ---------------------------------------------------------------------------


def cost(**config: Any) -> Make:
    return lambda: [CostOverrunDetector(CostOverrunConfig(**config))]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # 3000 lines are 1500 s: 3.33 spent.
        pytest.param({"budget": 4.0}, ["warning"], id="warn-at-80pct"),
        pytest.param({"budget": 3.0}, ["warning", "critical"], id="warn-then-critical"),
        pytest.param(
            {"budget": 2.0, "kill_fraction": 1.5},
            ["warning", "critical", "critical"],
            id="kill-at-150pct",
        ),
        pytest.param(
            {"budget": 4.0, "warn_fraction": 0.5, "critical_fraction": 0.75},
            ["warning", "critical"],
            id="other-fractions",
        ),
    ],
)
@pytest.mark.slow
def test_spend_crossing_a_level_inside_a_block(config: dict[str, Any], expected: list[str]) -> None:
    texts = metrics_log(3000)
    line_by_line, blocks = both(cost(**config), texts, facts=FACTS)
    assert severities(line_by_line) == expected
    assert_same(line_by_line, blocks, len(texts))


@pytest.mark.slow
def test_spend_reaching_a_level_exactly_at_a_line() -> None:
    """A 1.00 budget warns at 0.80: 360 s after the first line (the job's start), exactly
    the clock of line 720."""
    texts = metrics_log(3000)
    line_by_line, blocks = both(cost(budget=1.0), texts, facts=FACTS)
    first_line_at = T0 + STEP_S
    assert [alert[3] for alert in line_by_line.alerts[:1]] == [snapshot(first_line_at + 360.0)]
    assert_same(line_by_line, blocks, len(texts))


@pytest.mark.parametrize(
    ("slow_s", "expected"),
    [
        pytest.param(3.0, ["warning", "info"], id="slow-stretch-over-then-back"),
        pytest.param(0.6, [], id="slight-slowdown-within-margin"),
    ],
)
@pytest.mark.slow
def test_a_projected_overrun_opens_and_resolves_inside_blocks(
    slow_s: float, expected: list[str]
) -> None:
    """20,000 steps at 0.5 s cost 22.22 of a 30.00 budget; 400 steps at 3 s apiece project
    far past 36.00 (120%), and the pace back at 0.5 s brings it back under 30.00."""
    gaps_s = {index: slow_s for index in range(1000, 1400)}
    texts = metrics_log(3000, gaps_s=gaps_s)
    facts = RunFacts(gpus=4, price_per_gpu_hour=2.0, max_steps=20_000)
    make = cost(budget=30.0, projection_min_s=60.0, rate_window_s=120.0)
    line_by_line, blocks = both(make, texts, facts=facts)
    assert severities(line_by_line) == expected
    assert_same(line_by_line, blocks, len(texts))


def test_time_held_before_any_gpu_is_known_is_counted_alike() -> None:
    """No GPU count: the seconds since the first line pile up uncharged; nothing is raised."""
    texts = metrics_log(3000)
    line_by_line, blocks = both(
        cost(budget=0.1), texts, facts=RunFacts(price_per_gpu_hour=2.0, max_steps=5000)
    )
    assert line_by_line.alerts == []
    spend = line_by_line.state["rules"]["cost_overrun"]["state"]
    assert spend["unknown_s"] == snapshot(2999 * STEP_S)
    assert_same(line_by_line, blocks, len(texts))


# -- logs with other events between their lines ----------------------------------------------


@dataclass
class Lines:
    """Lines read together at ``at`` (ignored on the data's own clock)."""

    texts: list[str]
    at: float = 0.0


@dataclass
class Exit:
    """The job exits (``Engine.job_exited``), unexpected."""

    code: int
    at: float


@dataclass
class Reading:
    """A GPU source's reading (``Engine.feed_system``)."""

    source: str
    samples: list[Sample]
    at: float


@dataclass
class Start:
    """A live attempt starts (``Engine.job_started``)."""

    at: float


@dataclass
class Tick:
    """The live clock ticks (``Engine.tick``)."""

    at: float


@dataclass
class SetGpus:
    """The owner learns the GPU count (``[cost] gpus`` reloaded)."""

    count: int


Event = Lines | Exit | Reading | Start | Tick | SetGpus


def drive(
    make: Make,
    events: list[Event],
    *,
    blocks: bool,
    data_clock: bool = True,
    facts: RunFacts = FACTS,
) -> Run:
    """``blockcheck.run`` for a log with other events between batches of its lines."""
    engine = Engine(make(), LineParser(), data_clock=data_clock, blocks=blocks)
    engine.facts = copy.deepcopy(facts)
    alerts: list[Alert] = []
    for event in events:
        if isinstance(event, Lines):
            alerts += engine.feed_texts(SOURCE, event.texts, event.at)
        elif isinstance(event, Exit):
            alerts += engine.job_exited(event.code, event.at, expected=False)
        elif isinstance(event, Reading):
            alerts += engine.feed_system(event.source, event.samples, event.at)
        elif isinstance(event, Start):
            engine.job_started(event.at)
        elif isinstance(event, Tick):
            alerts += engine.tick(event.at)
        else:
            engine.facts.gpus = event.count
    state = {detector.rule: snapshot(detector) for detector in engine.detectors}
    return Run([alert_key(alert) for alert in alerts], state, engine.lines_absorbed)


def drive_both(make: Make, events: list[Event], **options: Any) -> tuple[Run, Run]:
    return drive(make, events, blocks=False, **options), drive(make, events, blocks=True, **options)


def test_live_a_hang_between_batches_resolves_on_the_next_batch() -> None:
    """Live, a tick between two batches finds no step for 950 s; the next batch's first
    step resolves it (a block with no tick of its own, but an episode open)."""
    texts = metrics_log(2000)
    events: list[Event] = [
        Start(T0),
        Lines(texts[:100], T0 + 50.0),
        Tick(T0 + 1000.0),
        Lines(texts[100:], T0 + 1000.0),
    ]
    line_by_line, blocks = drive_both(stall(), events, data_clock=False)
    assert severities(line_by_line) == ["critical", "info"]
    assert_same(line_by_line, blocks, len(texts))


def test_live_the_attempts_first_step_in_a_batch_learns_its_startup() -> None:
    """Each attempt's first step comes 40.5 s after its start, in a batch: learned as the
    startup, which lets the second start take 1.5 x as long (60.75 s) before a warning."""
    first, second = metrics_log(1000, start=T0 + 40.0), metrics_log(1000, start=T0 + 640.0)
    events: list[Event] = [
        Start(T0),
        Lines(first, T0 + 600.0),
        Start(T0 + 600.0),
        Tick(T0 + 650.0),
        Lines(second, T0 + 1200.0),
    ]
    make = stall(min_timeout_s=30.0, soft_timeout_s=45.0)
    line_by_line, blocks = drive_both(make, events, data_clock=False)
    assert severities(line_by_line) == []
    assert line_by_line.state["stall"]["_longest_startup_s"] == snapshot(40.5)
    assert_same(line_by_line, blocks, len(first) + len(second))


def test_live_a_batch_read_before_the_last_tick_charges_nothing() -> None:
    """A batch read at a time before the one already charged: the clock does not go back
    (8.00 an hour: 2.22 spent at the tick, which warns on a 2.50 budget)."""
    texts = metrics_log(3000)
    events: list[Event] = [
        Start(T0),
        Tick(T0 + 1000.0),
        Lines(texts[:2000], T0 + 1000.0),
        Lines(texts[2000:], T0 + 900.0),
    ]
    line_by_line, blocks = drive_both(cost(budget=2.5), events, data_clock=False)
    assert severities(line_by_line) == ["warning"]
    assert_same(line_by_line, blocks, len(texts))


@pytest.mark.slow
def test_live_batches_read_back_in_time_leave_the_rate_window_out_of_order() -> None:
    """Steps seen at 1000 s, then at 900 s: the window's points are out of time order, and
    only observe's own pop says which of them a step at 1100 s drops (none). Such blocks
    go line by line: only the first batch is taken as a block."""
    texts = metrics_log(3000)
    events: list[Event] = [
        Start(T0),
        Lines(texts[:100], T0 + 1000.0),
        Lines(texts[100:2100], T0 + 900.0),
        Lines(texts[2100:], T0 + 1100.0),
    ]
    line_by_line, blocks = drive_both(
        cost(budget=3.0, rate_window_s=150.0), events, data_clock=False
    )
    assert severities(line_by_line) == ["warning"]
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    assert blocks.lines_absorbed > 0


def test_gpus_attributed_mid_log_are_charged_from_the_start() -> None:
    """Time held before the GPU source attributed any GPU is charged at the first count
    known, at the first line after it: 2 GPUs from the job's start (4.00 an hour) warn at
    0.80 of 1.00 after 720 s and are critical after 900 s, not 250 s later."""
    texts = metrics_log(3000)
    attached = [Sample("gpu_job", 1.0)]
    events: list[Event] = [
        Lines(texts[:500]),
        Reading("gpu:0", attached, T0 + 250.0),
        Reading("gpu:1", attached, T0 + 250.0),
        Lines(texts[500:]),
    ]
    facts = RunFacts(price_per_gpu_hour=2.0)
    line_by_line, blocks = drive_both(cost(budget=1.0), events, facts=facts)
    first_line_at = T0 + STEP_S
    assert [(alert[1], alert[3]) for alert in line_by_line.alerts] == [
        ("warning", snapshot(first_line_at + 720.0)),
        ("critical", snapshot(first_line_at + 900.0)),
    ]
    assert_same(line_by_line, blocks, len(texts))


def test_a_gpu_count_changed_between_batches_counts_from_the_next_line() -> None:
    texts = metrics_log(3000)
    events: list[Event] = [Lines(texts[:1000]), SetGpus(16), Lines(texts[1000:])]
    line_by_line, blocks = drive_both(cost(budget=5.0), events)
    assert severities(line_by_line) == ["warning", "critical"]
    assert_same(line_by_line, blocks, len(texts))


def crash(tail_lines: int) -> Make:
    return lambda: [JobCrashDetector(JobCrashConfig(tail_lines=tail_lines))]


OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
NCCL = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970"


def traceback(error: str) -> list[str]:
    return ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>', error]


@pytest.mark.parametrize(
    ("tail_lines", "error", "stamped", "crash_class"),
    [
        pytest.param(1, OOM, True, "oom", id="tail-of-one-line"),
        pytest.param(200, OOM, True, "oom", id="default-tail"),
        pytest.param(200, NCCL, True, "distributed", id="nccl"),
        # No timestamp, no clock: replay shows the rules no output at all.
        pytest.param(200, OOM, False, "other", id="unstamped-log"),
    ],
)
@pytest.mark.slow
def test_a_traceback_right_after_a_block_of_metrics(
    tail_lines: int, error: str, stamped: bool, crash_class: str
) -> None:
    texts = metrics_log(3000, stamped=stamped)
    events: list[Event] = [Lines(texts + traceback(error)), Exit(1, T0 + 2000.0)]
    line_by_line, blocks = drive_both(crash(tail_lines), events)
    assert [alert[10]["class"] for alert in line_by_line.alerts] == [crash_class]
    assert_same(line_by_line, blocks, len(texts))


@pytest.mark.parametrize(
    ("tail_lines", "crash_class"),
    [
        pytest.param(500, "oom", id="error-still-in-the-tail"),
        pytest.param(499, "other", id="error-pushed-out-by-the-block"),
    ],
)
@pytest.mark.slow
def test_an_error_line_before_a_block_of_metrics(tail_lines: int, crash_class: str) -> None:
    """An OOM printed, then 499 more metric lines, then the job exits with no message."""
    texts = metrics_log(3500)
    events: list[Event] = [Lines([*texts[:3001], OOM, *texts[3001:]]), Exit(1, T0 + 2000.0)]
    line_by_line, blocks = drive_both(crash(tail_lines), events)
    assert [alert[10]["class"] for alert in line_by_line.alerts] == [crash_class]
    assert_same(line_by_line, blocks, len(texts))


def gpu_health(**config: Any) -> Make:
    return lambda: [GpuHealthDetector(GpuHealthConfig(**config))]


@pytest.mark.parametrize(
    ("config", "quiet_s"),
    [
        pytest.param({}, 300.0, id="default-300s"),
        pytest.param({"xid_quiet_s": 60.0}, 60.0, id="quiet-60s"),
    ],
)
@pytest.mark.slow
def test_an_xid_episode_ends_at_a_tick_inside_a_block(
    config: dict[str, Any], quiet_s: float
) -> None:
    """A warning XID at the clock of line 999 ends on the tick exactly ``quiet_s`` later."""
    texts = metrics_log(3000)
    xid_at = T0 + 1000 * STEP_S
    events: list[Event] = [
        Lines(texts[:1000]),
        Reading("gpu:0", [Sample(GPU_XID, 13.0)], xid_at),
        Lines(texts[1000:]),
    ]
    line_by_line, blocks = drive_both(gpu_health(**config), events)
    assert [(alert[1], alert[3]) for alert in line_by_line.alerts] == [
        ("warning", snapshot(xid_at)),
        ("info", snapshot(xid_at + quiet_s)),
    ]
    assert_same(line_by_line, blocks, len(texts))


def test_a_critical_xid_stays_open_through_blocks() -> None:
    """A hardware XID is held until the next attempt: no tick ends it."""
    texts = metrics_log(3000)
    events: list[Event] = [
        Lines(texts[:1000]),
        Reading("gpu:0", [Sample(GPU_XID, 79.0)], T0 + 1000 * STEP_S),
        Lines(texts[1000:]),
    ]
    line_by_line, blocks = drive_both(gpu_health(), events)
    assert severities(line_by_line) == ["critical"]
    assert_same(line_by_line, blocks, len(texts))
