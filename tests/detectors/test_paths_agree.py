"""Each rule's three ways in give the same alerts and state on random series (hypothesis).

A rule is fed one JSON-lines log three times through the engine: sample by sample
(``observe``, the rule's own ``observe_samples`` hidden), a line at a time (its
``observe_samples``) and in blocks (``can_absorb``/``absorb``, replay's fast path).
The logs are drawn at random: a noisy level with spikes, level shifts, zeros, NaN
and Inf, steps that repeat or jump, a learning rate that rises through a warmup,
lines with and without timestamps. Every run must say the same alerts, in order,
and leave the rule in the same state.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.model.facts import RunFacts
from sentinel.rules.base import BaseDetector, RuleConfig
from sentinel.rules.cost_overrun import CostOverrunConfig, CostOverrunDetector
from sentinel.rules.divergence import DivergenceConfig, DivergenceDetector
from sentinel.rules.eval_loss_rise import EvalLossRiseConfig, EvalLossRiseDetector
from sentinel.rules.gpu_memory_creep import GpuMemoryCreepConfig, GpuMemoryCreepDetector
from sentinel.rules.grad_norm_run import GradNormRunConfig, GradNormRunDetector
from sentinel.rules.loss_plateau import LossPlateauConfig, LossPlateauDetector
from sentinel.rules.loss_spike import LossSpikeConfig, LossSpikeDetector
from sentinel.rules.lr_jump import LrJumpConfig, LrJumpDetector
from sentinel.rules.stall import StallConfig, StallDetector
from sentinel.rules.throughput_drop import ThroughputDropConfig, ThroughputDropDetector
from tests.detectors.blockcheck import T0, run

#: Deterministic in CI: the same examples every run, none saved between runs.
AGREE = settings(
    max_examples=50,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def agreement_test(test: Callable[[st.DataObject], None]) -> Callable[..., None]:
    """A rule's property test: slow, ``AGREE``'s settings, drawing from ``data``. Hypothesis
    seeds a derandomized test from its body, name and signature, not its decorators, so
    each test draws the same examples as with the three decorators written out."""
    wrapped: Callable[..., None] = pytest.mark.slow(AGREE(given(data=st.data())(test)))
    return wrapped


@st.composite
def logs(
    draw: st.DrawFn,
    bar: float,
    *,
    evals: bool = False,
    lr_jumps: bool = False,
    climbs: bool = False,
) -> tuple[list[str], bool]:
    """A JSON-lines log with trouble in it, and whether to feed it as replay (data clock).

    Its bursts multiply the values by about ``bar`` (the rule's factor: just under,
    just over) or far more. Evaluation lines (another schema) come between the training
    lines now and then, or often with ``evals``. With ``lr_jumps`` the learning rate is
    multiplied now and then, for good, by a factor under or over ``bar``. With ``climbs``
    the level may also rise a little every line, from a line on (a slow climb).
    """
    lines = draw(st.integers(min_value=40, max_value=200))
    noise = draw(st.sampled_from([0.002, 0.02, 0.1]))
    jumps = [bar * 0.97, bar * 1.03, bar * 1.2, bar * 1.6, 6.0, 20.0]
    rng = random.Random(draw(st.integers(min_value=0, max_value=2**32 - 1)))
    # Trouble comes in bursts, a few lines long, with calm stretches between them.
    burst_rate = draw(st.sampled_from([0.0, 0.01, 0.03, 0.1]))
    odd_rate = draw(st.sampled_from([0.0, 0.01, 0.05]))  # NaN, Inf, zeros
    gaps = draw(st.sampled_from([(1,), (1, 1, 1, 2, 7), (1, 0, 1, 1)]))
    warmup_lines = draw(st.integers(min_value=0, max_value=30))
    stamped = draw(st.booleans())
    replay = draw(st.booleans()) or not stamped
    level = draw(st.sampled_from([4.0, 1.0, 0.01]))
    decay = draw(st.sampled_from([1.0, 0.999, 0.99]))  # flat, slowly or quickly falling
    # A climb of a few per cent a line from a line on (1.0: none).
    climb, climb_from = 1.0, lines
    if climbs:
        climb = draw(st.sampled_from([1.0, 1.01, 1.03, 1.1]))
        climb_from = draw(st.integers(min_value=0, max_value=lines))
    throughput = draw(st.booleans())  # tokens_per_sec logged, else only the steps' times
    silence_rate = draw(st.sampled_from([0.0, 0.01, 0.03]))  # a save, an eval, a hang
    # Lines between evaluations (0: none); a block is at least 16 lines of one schema.
    eval_every = draw(st.sampled_from([1, 5, 20] if evals else [0, 0, 20, 40]))
    eval_trend = draw(st.sampled_from([0.97, 1.0, 1.03]))  # evaluations falling or rising
    eval_loss = 2.0
    creep = draw(st.sampled_from([0.0, 1.0, 1.003, 1.03]))  # memory growth a line (0: none)
    memory = 1000.0
    step, now, out = draw(st.integers(min_value=0, max_value=50)), T0, []
    burst, jump = 0, 1.0
    lr_rate = draw(st.sampled_from([0.01, 0.03, 0.1])) if lr_jumps else 0.0
    lr_scale = 1.0
    for index in range(lines):
        if not burst and rng.random() < burst_rate:
            # One multiplier through the burst, on most of its lines: a sustained episode.
            burst, jump = rng.randint(1, 12), rng.choice(jumps)
        hit = jump if burst and rng.random() < 0.85 else 1.0
        burst = max(0, burst - 1)
        step += rng.choice(gaps)
        now += rng.choice([0.5, 0.5, 0.6]) * hit  # a slow step
        if rng.random() < silence_rate:
            now += rng.choice([8.0, 40.0, 700.0])
        level *= decay if index < climb_from else climb
        if rng.random() < 0.02:
            level *= rng.choice([0.3, 3.0])  # a level shift
        loss = level * (1 + noise * rng.gauss(0, 1)) * hit
        grad = (1 + noise * rng.gauss(0, 1)) * hit
        if rng.random() < odd_rate:
            odd = rng.choice([math.nan, math.inf, -math.inf, 0.0, -0.0])
            if rng.random() < 0.5:
                loss = odd
            else:
                grad = odd
        lr = 1e-5 * (index + 1) if index < warmup_lines else 1e-3 / (1 + 0.01 * index)
        if lr_rate and rng.random() < lr_rate:
            lr_scale *= rng.choice([0.1, bar * 0.9, bar * 1.1, bar * 5, 300.0])
        lr *= lr_scale
        record: dict[str, Any] = {"step": step, "loss": loss, "grad_norm": grad, "lr": lr}
        if creep:
            memory *= creep
            record["gpu_memory_mb"] = memory * (1 + 0.1 * noise * rng.gauss(0, 1)) * hit
        if throughput:
            record["tokens_per_sec"] = 15000.0 * (1 + noise * rng.gauss(0, 1)) / hit
        if stamped:
            record["time"] = now
        out.append(json.dumps(record))
        if eval_every and index % eval_every == eval_every - 1:
            eval_loss *= eval_trend * (1 + noise * rng.gauss(0, 1)) * (hit if hit < 2 else 1)
            evaluation: dict[str, Any] = {"step": step, "eval_loss": eval_loss}
            if stamped:
                evaluation["time"] = now
            out.append(json.dumps(evaluation))
    return out, replay


def sample_by_sample(rule: type[BaseDetector]) -> type[BaseDetector]:
    """The rule with its own ``observe_samples`` hidden: the engine calls ``observe`` on
    each sample (the class keeps its name, so the two states compare equal)."""
    return type(rule.__name__, (rule,), {"observe_samples": BaseDetector.observe_samples})


def assert_paths_agree(
    rule: type[BaseDetector],
    config: RuleConfig,
    texts: list[str],
    replay: bool,
    facts: RunFacts | None = None,
) -> None:
    """Sample by sample, line by line and by blocks give the same alerts and end state."""
    plain = sample_by_sample(rule)
    feed: dict[str, Any] = {"data_clock": replay, "batch_sizes": (64, 17, 200), "facts": facts}
    by_sample = run(lambda: [plain(config)], texts, blocks=False, **feed)
    by_line = run(lambda: [rule(config)], texts, blocks=False, **feed)
    by_block = run(lambda: [rule(config)], texts, blocks=True, **feed)
    assert by_line.alerts == by_sample.alerts
    assert by_block.alerts == by_line.alerts
    assert by_line.state == by_sample.state
    assert by_block.state == by_line.state


@st.composite
def loss_spike_configs(draw: st.DrawFn) -> LossSpikeConfig:
    window = draw(st.integers(min_value=3, max_value=12))
    return LossSpikeConfig(
        window=window,
        factor=draw(st.sampled_from([1.5, 2.0, 3.0])),
        sustain=draw(st.integers(min_value=1, max_value=window - 1)),
        resolve_after=draw(st.integers(min_value=1, max_value=4)),
        warmup_steps=draw(st.sampled_from([0, 0, 10, 40])),
        metrics=draw(st.sampled_from([["loss"], ["loss", "grad_norm"]])),
    )


@st.composite
def grad_norm_run_configs(draw: st.DrawFn) -> GradNormRunConfig:
    window = draw(st.integers(min_value=1, max_value=30))
    return GradNormRunConfig(
        threshold=draw(st.sampled_from([3.0, 10.0])),
        sustain=draw(st.integers(min_value=1, max_value=4)),
        factor=draw(st.sampled_from([1.5, 2.0, 5.0])),
        window=window,
        min_history=draw(st.integers(min_value=1, max_value=window)),
        max_grad_norm=draw(st.sampled_from([None, None, None, 1.3, 2.5])),
        clip_fraction=draw(st.sampled_from([0.3, 0.6, 1.0])),
        clip_window=draw(st.integers(min_value=1, max_value=12)),
        resolve_after=draw(st.integers(min_value=1, max_value=4)),
        warmup_steps=draw(st.sampled_from([0, 0, 10, 40])),
    )


@agreement_test
def test_loss_spike_paths_agree(data: st.DataObject) -> None:
    config = data.draw(loss_spike_configs())
    texts, replay = data.draw(logs(config.factor))
    assert_paths_agree(LossSpikeDetector, config, texts, replay)


@agreement_test
def test_grad_norm_run_paths_agree(data: st.DataObject) -> None:
    config = data.draw(grad_norm_run_configs())
    texts, replay = data.draw(logs(config.factor))
    assert_paths_agree(GradNormRunDetector, config, texts, replay)


@agreement_test
def test_divergence_paths_agree(data: st.DataObject) -> None:
    config = DivergenceConfig(
        window=data.draw(st.sampled_from([10, 20, 50])),
        level_window=data.draw(st.sampled_from([3, 5])),
        min_history=data.draw(st.sampled_from([5, 10])),
        patience=data.draw(st.sampled_from([2, 4, 8])),
        early_patience=2,
        early_history=data.draw(st.sampled_from([2, 3, 5])),
        warmup_steps=data.draw(st.sampled_from([0, 0, 10, 40])),
    )
    # With evaluations too: an evaluation may confirm a shift judged from few values.
    texts, replay = data.draw(logs(config.rise, evals=data.draw(st.booleans()), climbs=True))
    assert_paths_agree(DivergenceDetector, config, texts, replay)


@agreement_test
def test_lr_jump_paths_agree(data: st.DataObject) -> None:
    config = LrJumpConfig(
        factor=data.draw(st.sampled_from([3.0, 10.0])),
        above_seen=data.draw(st.sampled_from([1.0, 2.0])),
        min_values=data.draw(st.sampled_from([1, 2, 5])),
        confirm=data.draw(st.sampled_from([1, 2, 3])),
        loss_window=data.draw(st.sampled_from([3, 10])),
    )
    texts, replay = data.draw(logs(config.factor, lr_jumps=True))
    assert_paths_agree(LrJumpDetector, config, texts, replay)


@st.composite
def loss_plateau_configs(draw: st.DrawFn) -> LossPlateauConfig:
    window = draw(st.integers(min_value=4, max_value=60))
    return LossPlateauConfig(
        window=window,
        edge_values=draw(st.integers(min_value=1, max_value=window // 2)),
        min_improvement=draw(st.sampled_from([0.0, 0.01, 0.05, 0.3])),
        high_fraction=draw(st.sampled_from([0.3, 0.9, 1.0])),
        warmup_steps=draw(st.sampled_from([0, 0, 10, 40])),
    )


@agreement_test
def test_loss_plateau_paths_agree(data: st.DataObject) -> None:
    config = data.draw(loss_plateau_configs())
    texts, replay = data.draw(logs(1 / config.high_fraction))
    assert_paths_agree(LossPlateauDetector, config, texts, replay)


@st.composite
def throughput_drop_configs(draw: st.DrawFn) -> ThroughputDropConfig:
    return ThroughputDropConfig(
        fraction=draw(st.sampled_from([0.3, 0.5, 0.8])),
        baseline_window=draw(st.integers(min_value=3, max_value=25)),
        sustain=draw(st.integers(min_value=1, max_value=6)),
        sustain_s=draw(st.sampled_from([0.0, 0.0, 3.0])),
        resolve_after=draw(st.integers(min_value=1, max_value=6)),
        warmup_steps=draw(st.sampled_from([0, 0, 10, 40])),
    )


@agreement_test
def test_throughput_drop_paths_agree(data: st.DataObject) -> None:
    config = data.draw(throughput_drop_configs())
    texts, replay = data.draw(logs(1 / config.fraction))
    assert_paths_agree(ThroughputDropDetector, config, texts, replay)


@st.composite
def stall_configs(draw: st.DrawFn) -> StallConfig:
    soft_s = draw(st.sampled_from([2.0, 5.0, 20.0]))
    return StallConfig(
        soft_timeout_s=soft_s,
        hard_timeout_s=soft_s * draw(st.sampled_from([1.5, 3.0])),
        adaptive=draw(st.booleans()),
        learn_steps=draw(st.integers(min_value=2, max_value=12)),
        min_timeout_s=draw(st.sampled_from([0.5, 2.0, 300.0])),
        interval_factor=draw(st.sampled_from([2.0, 20.0])),
        gap_factor=draw(st.sampled_from([1.0, 1.5])),
        hard_factor=draw(st.sampled_from([1.5, 3.0])),
    )


@agreement_test
def test_stall_paths_agree(data: st.DataObject) -> None:
    config = data.draw(stall_configs())
    # Slow steps of about the soft timeout (a step is 0.5 s), just under and just over it.
    texts, replay = data.draw(logs(2 * config.soft_timeout_s))
    assert_paths_agree(StallDetector, config, texts, replay)


@st.composite
def eval_loss_rise_configs(draw: st.DrawFn) -> EvalLossRiseConfig:
    return EvalLossRiseConfig(
        rises=draw(st.integers(min_value=1, max_value=4)),
        margin=draw(st.sampled_from([0.01, 0.05, 0.1])),
        train_window=draw(st.integers(min_value=1, max_value=12)),
        train_metric=draw(st.sampled_from(["loss", "loss", "grad_norm"])),
        warmup_steps=draw(st.sampled_from([0, 0, 10, 40])),
    )


@agreement_test
def test_eval_loss_rise_paths_agree(data: st.DataObject) -> None:
    config = data.draw(eval_loss_rise_configs())
    texts, replay = data.draw(logs(1 + config.margin, evals=True))
    if data.draw(st.booleans()):
        texts = [text for text in texts if '"eval_loss"' in text]  # an evaluations file
    assert_paths_agree(EvalLossRiseDetector, config, texts, replay)


@st.composite
def gpu_memory_creep_configs(draw: st.DrawFn) -> GpuMemoryCreepConfig:
    return GpuMemoryCreepConfig(
        window=draw(st.integers(min_value=3, max_value=20)),
        rising_fraction=draw(st.sampled_from([0.5, 0.8, 1.0])),
        min_growth=draw(st.sampled_from([0.005, 0.02, 0.1])),
        capacity=draw(st.sampled_from([None, 1300.0, 3000.0])),
        capacity_fraction=draw(st.sampled_from([0.9, 0.95])),
        warmup_steps=draw(st.sampled_from([0, 10, 40])),
    )


@agreement_test
def test_gpu_memory_creep_paths_agree(data: st.DataObject) -> None:
    config = data.draw(gpu_memory_creep_configs())
    texts, replay = data.draw(logs(1 + config.min_growth))
    assert_paths_agree(GpuMemoryCreepDetector, config, texts, replay)


@st.composite
def cost_overrun_configs(draw: st.DrawFn) -> CostOverrunConfig:
    return CostOverrunConfig(
        budget=draw(st.sampled_from([None, 0.05, 0.3, 1.0])),
        kill_fraction=draw(st.sampled_from([None, 1.5])),
        projected_margin=draw(st.sampled_from([0.0, 0.2])),
        rate_window_s=draw(st.sampled_from([10.0, 100.0])),
        projection_min_s=draw(st.sampled_from([0.0, 30.0])),
        projection_min_steps=draw(st.sampled_from([1, 10])),
    )


@agreement_test
def test_cost_overrun_paths_agree(data: st.DataObject) -> None:
    config = data.draw(cost_overrun_configs())
    # 4 GPUs at 2.0 an hour: a log of a few hundred seconds spends about 0.2 to 2.
    facts = RunFacts(
        gpus=4,
        price_per_gpu_hour=2.0,
        max_steps=data.draw(st.sampled_from([None, 300, 5000])),
    )
    texts, replay = data.draw(logs(2.0))
    assert_paths_agree(CostOverrunDetector, config, texts, replay, facts)
