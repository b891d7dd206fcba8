"""throughput_drop, eval_loss_rise and gpu_memory_creep raise the same through blocks.

Each case writes a JSON-lines log in which the rule really raises (or, for the warmup
cases, where its state is easy to get wrong), feeds it to one engine taking blocks and
one line by line (``blockcheck.run``), and checks they agree on every alert and on the
end state, that the alert expected is there, and that blocks were taken at all. Each log
puts its event on an edge of what ``can_absorb`` proves: a drop or a creep starting
inside a block, the baseline learned or raised inside one, a run continued across two,
a value exactly at a threshold, the warmup ending inside one.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from sentinel.rules import BaseDetector, RuleConfig
from sentinel.rules.eval_loss_rise import EvalLossRiseDetector
from sentinel.rules.gpu_memory_creep import GpuMemoryCreepDetector
from sentinel.rules.throughput_drop import ThroughputDropDetector
from tests.detectors.blockcheck import T0, Run, run

Metric = Callable[[int], float]
# Fields of blockcheck.alert_key.
RULE, STEP, METRIC, ONSET, RESOLVES, DETAILS = 0, 5, 6, 8, 9, 10


def log(
    first: int, last: int, *, stamped: bool = True, dt_s: Metric | None = None, **metrics: Metric
) -> list[str]:
    """A JSON line per step from ``first`` to ``last``: each metric a function of the step,
    ``time`` 0.5 s a step (or ``dt_s(step)`` after the step before) unless not stamped."""
    lines = []
    time = T0 + (0.5 * first if dt_s is None else sum(map(dt_s, range(1, first))))
    for step in range(first, last + 1):
        record: dict[str, Any] = {"step": step}
        record.update((name, metric(step)) for name, metric in metrics.items())
        if stamped:
            record["time"] = time
        lines.append(json.dumps(record))
        time += 0.5 if dt_s is None else dt_s(step + 1)
    return lines


def noisy(level: float, spread: float = 0.01, seed: int = 0) -> Metric:
    """``level`` with a reproducible relative noise of about ``spread``."""
    noise = random.Random(seed)
    draws: dict[int, float] = {}

    def metric(step: int) -> float:
        if step not in draws:
            draws[step] = noise.gauss(0.0, spread)
        return level * (1 + draws[step])

    return metric


def decaying_lr(step: int) -> float:
    return 5e-4 * (1 - step / 1e6)


def falling_loss(step: int) -> float:
    return 4.0 * 0.9995**step


def both(make: Callable[[], Sequence[BaseDetector]], texts: list[str], **options: Any) -> Run:
    """The run taking blocks, once checked against the run line by line."""
    line_by_line = run(make, texts, blocks=False, **options)
    blocks = run(make, texts, blocks=True, **options)
    assert blocks.alerts == line_by_line.alerts
    assert blocks.state == line_by_line.state
    return blocks


def only(detector_class: type[BaseDetector], **config: Any) -> Callable[[], list[BaseDetector]]:
    model: type[RuleConfig] = detector_class.config_model
    return lambda: [detector_class(model(**config))]


def raised(result: Run) -> list[tuple[Any, ...]]:
    """The alerts that opened or escalated (not the resolutions)."""
    return [alert for alert in result.alerts if not alert[RESOLVES]]


def resolved(result: Run) -> list[tuple[Any, ...]]:
    return [alert for alert in result.alerts if alert[RESOLVES]]


# --- throughput_drop -------------------------------------------------------------------------


def tokens(normal: Metric, slow: Metric, slow_steps: range) -> Metric:
    return lambda step: slow(step) if step in slow_steps else normal(step)


def test_a_throughput_drop_starting_inside_a_block_warns_and_resolves_there() -> None:
    slow = range(1500, 1800)  # long: the blocks inside the episode are taken whole
    texts = log(
        1,
        3000,
        loss=falling_loss,
        lr=decaying_lr,
        tokens_per_sec=tokens(noisy(15000.0), noisy(6000.0, seed=1), slow),
    )
    result = both(only(ThroughputDropDetector), texts)
    # 40% of the baseline: three low values make the drop (five just under the bar).
    assert [(alert[STEP], alert[ONSET]) for alert in raised(result)] == [(slow[0] + 2, slow[0])]
    assert [alert[STEP] for alert in resolved(result)] == [slow[-1] + 5]
    assert result.lines_absorbed > len(texts) * 3 // 4


def test_a_baseline_learned_inside_a_block_judges_the_rest_of_it() -> None:
    texts = log(
        1, 600, loss=falling_loss, tokens_per_sec=tokens(noisy(1000.0), noisy(500.0), range(12, 30))
    )
    config = {"baseline_window": 8, "sustain": 3, "fraction": 0.6}
    result = both(only(ThroughputDropDetector, **config), texts)
    assert [alert[STEP] for alert in raised(result)] == [13]  # half the baseline: two lows
    assert result.lines_absorbed > len(texts) // 2


def levels(*spans: tuple[int, float]) -> Metric:
    """A value per span of steps: ``(100, 1000.0)`` is 1000.0 up to step 100 (the last on)."""

    def metric(step: int) -> float:
        return next((value for last, value in spans if step <= last), spans[-1][1])

    return metric


@pytest.mark.parametrize(
    ("tokens_per_sec", "baseline"),
    [
        (levels((199, 1000.0), (399, 2000.0), (419, 900.0), (1200, 2000.0)), 2000.0),
        # Ten values lift the median of a 20-value window halfway: ten is the rank bound.
        (levels((199, 1000.0), (209, 3000.0), (229, 900.0), (1200, 1000.0)), 2000.0),
    ],
    ids=["baseline-doubled", "ten-values-lift-the-median"],
)
def test_a_drop_only_below_a_baseline_raised_inside_the_block_is_caught(
    tokens_per_sec: Metric, baseline: float
) -> None:
    """900 tokens/s is above half the first baseline (1000) but below half the one the
    block raised it to (2000): which side of the bar it falls on depends on the order.
    The first batch learns the baseline; the second holds the rise and the drop."""
    texts = log(1, 1200, lr=decaying_lr, tokens_per_sec=tokens_per_sec)
    result = both(only(ThroughputDropDetector), texts, batch_sizes=(50, 4096))
    alerts = raised(result)
    assert len(alerts) == 1
    # 45% of the baseline: the fourth low value makes the drop.
    assert texts[alerts[0][STEP] - 4].count("900.0") == 1
    assert texts[alerts[0][STEP] - 5].count("900.0") == 0
    assert float.fromhex(alerts[0][DETAILS]["baseline"]) == baseline  # snapshots keep hex
    assert result.lines_absorbed > len(texts) // 2


def test_a_run_of_lows_continued_across_two_blocks_counts_as_one() -> None:
    """Three low values end one batch and two start the next: the fifth is the alert (48% of
    the baseline, just under the bar: five are needed)."""
    lows = range(998, 1003)
    texts = log(1, 3000, lr=decaying_lr, tokens_per_sec=tokens(noisy(15000.0), noisy(7200.0), lows))
    result = both(only(ThroughputDropDetector), texts, batch_sizes=(1000, 2000))
    assert [alert[STEP] for alert in raised(result)] == [lows[-1]]
    assert result.lines_absorbed > len(texts) * 3 // 4


@pytest.mark.slow
def test_short_dips_below_the_bar_inside_blocks_raise_nothing() -> None:
    """Dips of sustain - 1 values (an evaluation, a checkpoint save) every 300 steps."""
    config = {"sustain": 4}

    def tokens_per_sec(step: int) -> float:  # dips just under the bar: shallow
        return 7400.0 if step % 300 < 3 else 15000.0 + step % 7

    texts = log(1, 4000, lr=decaying_lr, tokens_per_sec=tokens_per_sec)
    result = both(only(ThroughputDropDetector, **config), texts)
    assert result.alerts == []
    # Against the run with one more low per dip: the same log, one value apart, warns.
    config = {"sustain": 3}
    assert raised(both(only(ThroughputDropDetector, **config), texts))
    assert result.lines_absorbed > len(texts) * 3 // 4


def test_a_drop_right_after_the_lr_warmup_ends_inside_a_block_is_caught() -> None:
    def warmup_lr(step: int) -> float:
        return 1e-5 * step if step <= 200 else 2e-3 * (1 - step / 1e5)

    slow = range(260, 300)
    texts = log(1, 3000, lr=warmup_lr, tokens_per_sec=tokens(noisy(15000.0), noisy(5000.0), slow))
    result = both(only(ThroughputDropDetector), texts)
    assert [alert[STEP] for alert in raised(result)] == [slow[0] + 1]  # a third: two lows
    assert result.lines_absorbed > len(texts) // 2


@pytest.mark.slow
@pytest.mark.parametrize("sustain_s", [0.0, 20.0], ids=["by-values", "by-seconds"])
def test_derived_steps_per_sec_dropping_inside_a_block_warns(sustain_s: float) -> None:
    """No throughput logged: steps/sec from the timestamps, 2 steps/s falling to 0.4."""
    slow = range(1200, 1300)
    texts = log(
        1, 3000, dt_s=lambda step: 2.5 if step in slow else 0.5, loss=falling_loss, lr=decaying_lr
    )
    result = both(only(ThroughputDropDetector, sustain_s=sustain_s), texts)
    alerts = raised(result)
    assert len(alerts) == 1
    assert alerts[0][METRIC] == "steps_per_sec"
    assert alerts[0][ONSET] in slow
    assert [alert[METRIC] for alert in resolved(result)] == ["steps_per_sec"]
    assert result.lines_absorbed > len(texts) * 3 // 4


def test_derived_steps_per_sec_live_reads_each_batch_as_one_time_point() -> None:
    """Live, lines without timestamps: a batch read at once is one burst of steps."""
    texts = log(1, 3000, stamped=False, loss=falling_loss, lr=decaying_lr)
    result = both(
        only(ThroughputDropDetector, baseline_window=3),
        texts,
        data_clock=False,
        batch_sizes=(700, 37, 300),
    )
    state = result.state["rules"]["throughput_drop"]
    assert state["_baseline"] is not None
    assert result.lines_absorbed > len(texts) // 2


# --- eval_loss_rise --------------------------------------------------------------------------


def evaluations(steps: Sequence[int], values: Sequence[float]) -> list[str]:
    return [
        json.dumps({"step": step, "eval_loss": value, "time": T0 + 0.5 * step})
        for step, value in zip(steps, values, strict=True)
    ]


def overfit(
    first_evals: Sequence[float], later_evals: Sequence[float], *, later_loss: float = 1.0
) -> tuple[list[str], list[int]]:
    """Training, a block of evaluations, more training (train loss ``later_loss``, from 3.0
    before), another block of evaluations; and the batch sizes that keep each a block."""
    train = log(1, 400, loss=noisy(3.0), lr=decaying_lr)
    evals = evaluations(range(20, 20 * len(first_evals) + 1, 20), first_evals)
    more = log(401, 800, loss=noisy(later_loss, seed=1), lr=decaying_lr)
    start = 800 + 20
    later = evaluations(range(start, start + 20 * len(later_evals), 20), later_evals)
    texts = train + evals + more + later
    return texts, [len(train), len(evals), len(more), len(later)]


def descending(count: int, top: float = 2.0, step: float = 0.01) -> list[float]:
    return [top - step * index for index in range(count)]


def test_eval_loss_rising_three_times_inside_a_block_of_evaluations_warns() -> None:
    first = descending(20)  # the best is the last: 1.81
    later = [1.83, 1.82, 1.84, 1.85, 1.86, *[1.85] * 15]
    texts, sizes = overfit(first, later)
    result = both(only(EvalLossRiseDetector), texts, batch_sizes=sizes)
    alerts = raised(result)
    assert [(alert[STEP], alert[DETAILS]["kind"]) for alert in alerts] == [(820 + 4 * 20, "rises")]
    assert alerts[0][DETAILS]["best_step"] == 400
    assert result.lines_absorbed > len(texts) * 3 // 4


def test_a_rise_run_continued_across_two_blocks_of_evaluations_counts_as_one() -> None:
    """rises = 4: the first block ends with two rises, the second starts with two more."""
    first = [*descending(18), 1.9, 1.95]  # best 1.83 at the 18th; then two rises
    later = [1.96, 1.97, *[1.9] * 18]
    texts, sizes = overfit(first, later)
    result = both(only(EvalLossRiseDetector, rises=4, margin=0.5), texts, batch_sizes=sizes)
    assert [alert[STEP] for alert in raised(result)] == [820 + 20]
    assert result.lines_absorbed > len(texts) // 2


def test_an_evaluation_exactly_at_the_margin_is_absorbed_and_one_above_warns() -> None:
    """margin 0.25 above a best of 1.0 is 1.25 exactly: at it, no alert; a hair above, twice
    in a row, one."""
    first = [*descending(19, top=1.5, step=0.02), 1.0]
    later = [1.25, 1.2, 1.25, 1.1, *[1.25, 1.2] * 8, *[1.2500000000000002] * 2, 1.2, 1.2]
    texts, sizes = overfit(first, later)
    result = both(only(EvalLossRiseDetector, margin=0.25), texts, batch_sizes=sizes)
    alerts = raised(result)
    assert [(alert[STEP], alert[DETAILS]["kind"]) for alert in alerts] == [
        (820 + 21 * 20, "margin")
    ]
    assert result.lines_absorbed > len(texts) // 2


def test_an_overfitting_episode_resolves_at_a_new_best_inside_a_block() -> None:
    """The episode opens in one block of evaluations; the next, open from its start,
    holds the new best (1.8 beats 1.81)."""
    first = descending(20)
    later = [1.9, 1.95, 2.0, 2.05, *[2.0] * 16]
    texts, sizes = overfit(first, later)
    resolving = [*[2.0] * 10, 1.8, *[1.75] * 9]
    texts += evaluations(range(1300, 1300 + 20 * len(resolving), 20), resolving)
    result = both(only(EvalLossRiseDetector), texts, batch_sizes=[*sizes, len(resolving)])
    assert [alert[STEP] for alert in raised(result)] == [820 + 2 * 20]  # 2.0: past the margin
    assert [alert[STEP] for alert in resolved(result)] == [1300 + 10 * 20]


def test_eval_loss_rising_while_train_loss_does_not_fall_raises_nothing() -> None:
    first = descending(20)
    later = [1.9, 1.95, 2.0, 2.05, 2.3, 2.6, *[2.7] * 14]
    texts, sizes = overfit(first, later, later_loss=3.3)
    result = both(only(EvalLossRiseDetector), texts, batch_sizes=sizes)
    assert result.alerts == []
    # The same evaluations with train loss falling: overfitting.
    falling, _ = overfit(first, later, later_loss=1.0)
    assert raised(both(only(EvalLossRiseDetector), falling, batch_sizes=sizes))
    assert result.lines_absorbed > len(texts) * 3 // 4


def test_evaluations_inside_the_configured_warmup_are_skipped_in_a_block() -> None:
    """warmup_steps 300: the first block's evaluations up to step 280 are not the best."""
    first = [1.0, 1.0, *descending(18, top=2.0)]
    later = [1.9, 1.95, 2.0, 2.05, *[2.0] * 16]
    texts, sizes = overfit(first, later)
    result = both(only(EvalLossRiseDetector, warmup_steps=300), texts, batch_sizes=sizes)
    alerts = raised(result)
    assert [alert[DETAILS]["best_step"] for alert in alerts] == [400]
    assert result.lines_absorbed > len(texts) // 2


# --- gpu_memory_creep ------------------------------------------------------------------------


def memory(flat: Metric, creeping: range, per_step: float) -> Metric:
    """``flat`` outside ``creeping``; inside it, growing ``per_step`` a step, then held."""

    def metric(step: int) -> float:
        grown = min(max(step - creeping[0], 0), len(creeping))
        return flat(step) * (1 + per_step) ** grown

    return metric


def test_memory_creeping_inside_a_block_warns_and_resolves_when_it_holds() -> None:
    creeping = range(1500, 1540)
    texts = log(
        1,
        3000,
        loss=falling_loss,
        lr=decaying_lr,
        gpu_memory_mb=memory(noisy(10000.0, 0.002), creeping, 0.01),
    )
    result = both(only(GpuMemoryCreepDetector), texts)
    alerts = raised(result)
    assert [alert[DETAILS]["kind"] for alert in alerts] == ["creep"]
    assert alerts[0][STEP] in creeping
    assert len(resolved(result)) == 1
    assert result.lines_absorbed > len(texts) * 3 // 4


def test_memory_creeping_as_its_window_first_fills_inside_a_block_warns() -> None:
    """The metric appears at step 2000 already climbing: the creep is the window's first."""
    before = log(1, 1999, loss=falling_loss, lr=decaying_lr)
    climbing = log(
        2000,
        3000,
        loss=falling_loss,
        lr=decaying_lr,
        gpu_memory_mb=lambda step: 8000.0 * 1.01 ** min(step - 2000, 30),
    )
    texts = before + climbing
    config = {"window": 8, "min_growth": 0.05, "rising_fraction": 0.6}
    result = both(only(GpuMemoryCreepDetector, **config), texts)
    assert [alert[STEP] for alert in raised(result)] == [2000 + 7]
    assert result.lines_absorbed > len(texts) * 3 // 4


@pytest.mark.parametrize(
    ("peak", "alerts"),
    [(899.9999999999999, 0), (900.0, 1)],
    ids=["a-hair-under-the-bar", "exactly-at-the-bar"],
)
def test_memory_at_exactly_the_capacity_bar_warns_and_a_hair_under_does_not(
    peak: float, alerts: int
) -> None:
    """capacity 1000 and capacity_fraction 0.9: the bar is 900.0 exactly; memory holds
    ``peak`` for steps 1000 to 1099."""
    texts = log(
        1,
        2000,
        lr=decaying_lr,
        gpu_memory_mb=lambda step: peak if 1000 <= step < 1100 else 800.0 + step % 3,
    )
    config = {"capacity": 1000.0, "capacity_fraction": 0.9}
    # The second batch starts where memory is back under the bar: open, it must resolve.
    result = both(only(GpuMemoryCreepDetector, **config), texts, batch_sizes=(1099, 4096))
    assert [(alert[STEP], alert[DETAILS]["kind"]) for alert in raised(result)] == [
        (1000, "capacity")
    ] * alerts
    assert [alert[STEP] for alert in resolved(result)] == [1100] * alerts
    assert result.lines_absorbed > len(texts) * 3 // 4


@pytest.mark.slow
def test_memory_near_a_logged_capacity_that_shrinks_inside_a_block_warns() -> None:
    """The job logs its device's total: 16000, then 12000 (95%: 11400) under 11500 used."""
    texts = log(
        1,
        3000,
        lr=decaying_lr,
        gpu_memory_total=levels((1999, 16000.0), (3000, 12000.0)),
        gpu_memory_mb=lambda step: 11500.0 + step % 5,
    )
    result = both(only(GpuMemoryCreepDetector), texts, batch_sizes=(1000, 4096))
    assert [(alert[STEP], alert[DETAILS]["kind"]) for alert in raised(result)] == [
        (2000, "capacity")
    ]
    assert result.lines_absorbed > len(texts) // 2


def test_memory_creeping_right_after_the_lr_warmup_ends_inside_a_block_warns() -> None:
    def warmup_lr(step: int) -> float:
        return 1e-5 * step if step <= 300 else 3e-3 * (1 - step / 1e5)

    creeping = range(310, 340)
    texts = log(1, 3000, lr=warmup_lr, gpu_memory_mb=memory(noisy(10000.0, 0.002), creeping, 0.01))
    result = both(only(GpuMemoryCreepDetector), texts)
    assert [alert[STEP] in creeping for alert in raised(result)] == [True]
    assert result.lines_absorbed > len(texts) // 2


@pytest.mark.parametrize(
    "peak_step",
    [1, 2, 499, 500, 501, 1200],
    ids=["constant", "second-line", "batch-end-1", "batch-end", "batch-start", "mid-block"],
)
@pytest.mark.slow
def test_a_learning_rate_warmup_without_memory_metrics_is_taken_in_blocks(peak_step: int) -> None:
    """The common case, a log without memory metrics: its warmup state is exactly the
    line by line one wherever the rising learning rate peaks (batches of 500 lines)."""

    def lr(step: int) -> float:
        return 1e-6 * step if step <= peak_step else 1e-6 * peak_step * (1 - step / 1e5)

    texts = log(1, 3000, loss=falling_loss, lr=lr)
    result = both(only(GpuMemoryCreepDetector), texts, batch_sizes=(500,))
    assert result.state["rules"]["gpu_memory_creep"]["_warmup"]["lr_rising"] is False
    assert result.lines_absorbed > len(texts) * 9 // 10
