"""What ``stall`` is configured with, what it knows of the machine while a job makes no
progress, its timeouts, and what a block of log lines does to its progress.

Plain data for ``sentinel.rules.stall``: its ``[rules.stall]`` settings, the
evidence the latest GPU and process readings give (hang, busy or nothing), the timeouts
in force, and ``block_progress``: the step gaps, progress and activity a replay block
leaves, worked out in a few passes over its columns rather than line by line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice
from math import inf
from operator import not_, sub
from typing import Any, Literal

from pydantic import Field, model_validator

from sentinel.model.machine import (
    GPU_JOB,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_UTIL,
    PROC_CPU,
    PROC_D_STATE,
    PROCESS_SOURCE,
    SYSTEM_METRICS,
)
from sentinel.model.records import Block
from sentinel.rules.base import RuleConfig
from sentinel.rules.series import rising_steps

Verdict = Literal["hang", "busy", "none"]


class StallConfig(RuleConfig):
    """``[rules.stall]``.

    The fixed timeouts follow torch.distributed: its NCCL watchdog gives up on a
    hung collective after 10 minutes, so 10 minutes of silence is worth a warning;
    30 minutes outlasts the slowest checkpoint save or evaluation of a typical
    fine-tune. They apply until the run's rhythm is learned, and always with
    ``adaptive = false``.
    """

    soft_timeout_s: float = Field(default=600.0, gt=0)
    hard_timeout_s: float = Field(default=1800.0, gt=0)
    #: Learn the timeouts from the run's own step gaps.
    adaptive: bool = True
    #: Step gaps learned before the timeouts adapt: 10 logged steps is past the slow first
    #: steps (compilation, allocator warmup) of most runs and about a minute of a fast one.
    learn_steps: int = Field(default=10, ge=2)
    #: Floor of the learned soft timeout, and the least room between soft and hard: 5 minutes
    #: covers the first save of a ~7B model's weights and optimizer state to local disk, which
    #: a fast run meets before it has seen any long gap to learn from.
    min_timeout_s: float = Field(default=300.0, gt=0)
    #: Soft timeout in normal step gaps: 20 x a 30 s step is the fixed 10 minutes.
    interval_factor: float = Field(default=20.0, gt=1)
    #: Soft timeout over the longest gap seen: a save or eval may run 50% longer than its
    #: longest earlier one (a busier filesystem, a bigger eval batch) without a warning.
    gap_factor: float = Field(default=1.5, ge=1)
    #: Hard timeout over the learned soft one, as the fixed 30 minutes is 3 x 10.
    hard_factor: float = Field(default=3.0, gt=1)
    #: A job that is visibly busy (GPUs at power, CPU working, printing) goes critical only
    #: at this multiple of the hard timeout: twice the longest wait tolerated for a hang.
    busy_factor: float = Field(default=2.0, ge=1)
    #: GPU power under this fraction of its limit is no real work. A training step draws
    #: well above half the limit; an idle or NCCL-spinning GPU draws 10-25%.
    low_power_fraction: float = Field(default=0.3, gt=0, lt=1)
    #: The process tree's CPU under this percent of one core is idle: a Python loop doing
    #: anything at all keeps one core far above it.
    idle_cpu_percent: float = Field(default=5.0, ge=0)
    #: Readings older than this say nothing about now: 3 readings at the GPU and process
    #: sources' default 5 s interval, with room for a slow NVML call.
    evidence_max_age_s: float = Field(default=15.0, gt=0)

    @model_validator(mode="after")
    def _hard_after_soft(self) -> StallConfig:
        if self.hard_timeout_s <= self.soft_timeout_s:
            raise ValueError("hard_timeout_s must be greater than soft_timeout_s")
        return self


#: The readings ``stall`` keeps (the latest of each, per source).
EVIDENCE_METRICS = frozenset(
    {GPU_JOB, GPU_POWER, GPU_POWER_LIMIT, GPU_UTIL, PROC_CPU, PROC_D_STATE}
)


@dataclass
class Evidence:
    """What the latest fresh readings show while the job makes no progress."""

    #: The job's GPUs: source, utilisation (percent, None if not read), power, power limit.
    gpus: list[tuple[str, float | None, float, float]] = field(default_factory=list)
    cpu_percent: float | None = None
    d_state: int | None = None
    #: Seconds since the job last printed, when it printed during this silence.
    output_age_s: float | None = None
    low_power_fraction: float = 0.3
    idle_cpu_percent: float = 5.0

    @classmethod
    def from_readings(
        cls,
        readings_by_source: dict[str, dict[str, tuple[float, float]]],
        now: float,
        *,
        since: float,
        settings: StallConfig,
    ) -> Evidence:
        """What the latest (value, read at) of each metric, per source, shows at ``now`` of a
        silence that began at ``since``: readings older than it or than
        ``evidence_max_age_s`` say nothing. The rule adds the output's age itself."""
        evidence = cls(
            low_power_fraction=settings.low_power_fraction,
            idle_cpu_percent=settings.idle_cpu_percent,
        )
        oldest = max(since, now - settings.evidence_max_age_s)

        def fresh(readings: dict[str, tuple[float, float]], name: str) -> float | None:
            reading = readings.get(name)
            if reading is None or reading[1] < oldest:
                return None
            return reading[0]

        for source, readings in sorted(readings_by_source.items()):
            if source == PROCESS_SOURCE:
                evidence.cpu_percent = fresh(readings, PROC_CPU)
                d_state = fresh(readings, PROC_D_STATE)
                evidence.d_state = None if d_state is None else int(d_state)
                continue
            attached = fresh(readings, GPU_JOB)
            power = fresh(readings, GPU_POWER)
            limit = fresh(readings, GPU_POWER_LIMIT)
            if attached is None or attached < 0.5 or power is None or not limit:
                continue
            evidence.gpus.append((source, fresh(readings, GPU_UTIL), power, limit))
        return evidence

    @property
    def gpus_low(self) -> bool:
        return bool(self.gpus) and all(
            power < self.low_power_fraction * limit for _, _, power, limit in self.gpus
        )

    @property
    def cpu_idle(self) -> bool:
        return self.cpu_percent is not None and self.cpu_percent < self.idle_cpu_percent

    @property
    def verdict(self) -> Verdict:
        """Hang on any hang evidence, else busy on any sign of work, else none."""
        if self.d_state or self.gpus_low or self.cpu_idle:
            return "hang"
        if self.gpus or self.cpu_percent is not None or self.output_age_s is not None:
            return "busy"
        return "none"

    def describe(self) -> str:
        """The evidence in words: "gpu:0 util 100% at 85 W of 700 W, process tree CPU 2%"."""
        parts = []
        for source, util, power, limit in self.gpus:
            at = f"util {util:.0f}% at" if util is not None else "at"
            parts.append(f"{source} {at} {power:.0f} W of {limit:.0f} W")
        if self.cpu_percent is not None:
            parts.append(f"process tree CPU {self.cpu_percent:.0f}%")
        if self.output_age_s is not None:
            parts.append(f"last output {self.output_age_s:.0f} s ago")
        if self.d_state:
            parts.append(
                f"{self.d_state} process(es) in uninterruptible sleep (D state): SIGTERM will"
                " not stop them until their I/O returns; the node may need draining"
            )
        return ", ".join(parts) if parts else "no GPU or process readings"

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [
                {"source": source, "util_percent": util, "power_w": power, "power_limit_w": limit}
                for source, util, power, limit in self.gpus
            ],
            "cpu_percent": self.cpu_percent,
            "d_state": self.d_state,
            "output_age_s": self.output_age_s,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Timeouts:
    """The timeouts in force; ``learned`` when they come from the run's own step gaps."""

    soft_s: float
    hard_s: float
    busy_s: float
    learned: bool


def learned_gap(gap_s: float) -> bool:
    """Whether the time between two new steps is a gap the rule learns: lines read in
    one burst (no time between them) are one moment, not a gap."""
    return gap_s > 0.0


def uncapped(gap_s: float, uncapped_s: float) -> bool:
    """Whether a learned gap is taken as it is: up to ``uncapped_s`` no hard timeout in
    force can cap it (a longer one needs the timeouts worked out)."""
    return gap_s <= uncapped_s


@dataclass(frozen=True, slots=True)
class BlockProgress:
    """What feeding a block line by line leaves of ``stall``'s progress state.

    ``gaps_s`` are the gaps the rule learns, in order: the positive ones between
    consecutive new steps (the first from the step before the block), when it learns.
    """

    new_steps: bool
    last_step: int | None
    last_step_time: float | None
    last_progress: float | None
    last_activity: float | None
    gaps_s: list[float]


def block_progress(
    block: Block,
    *,
    last_step: int | None,
    last_step_time: float | None,
    last_progress: float | None,
    last_activity: float | None,
    steps_seen: bool,
    learning: bool,
    uncapped_s: float,
    least_soft_s: float,
) -> BlockProgress | None:
    """Progress, step gaps and activity after ``block`` for a rule in the state given, or
    None unless the block is steady: fed line by line, no tick in it would reach
    ``least_soft_s`` of silence (so none works the timeouts out) and, when ``learning``,
    no step gap would pass ``uncapped_s`` (so none is capped by the hard timeout).

    Line ``i``'s samples all carry ``steps[i]`` and the time ``at[i]`` (its own
    timestamp, else its clock): the first sample of a line whose step is past every
    step before it is a new step (progress at ``at[i]``); every other sample, and the
    output line when steps were already seen, is activity.
    """
    names, times = block.names, block.times
    if not names or not SYSTEM_METRICS.isdisjoint(names):
        return None  # no sample, or the machine's state: line by line
    if times is not None and 0.0 in times:
        return None  # epoch 0, which a block's contract reads as no time: line by line
    if learning and last_step_time is None:
        return None  # the attempt's first step learns its startup
    steps, clock = block.steps, block.clock
    count = len(steps)
    stamps = times if times is not None else clock
    # A block's clock never goes back; the stamps are the clock itself, or times the engine
    # took for the clock because they never go back either: the latest is the last.
    rising = stamps is clock
    new = rising_steps(steps, last_step)
    new_lines: Sequence[int] = range(count)
    new_stamps = stamps
    if new is not None:
        new_lines, new_stamps = list(compress(range(count), new)), list(compress(stamps, new))
    gaps_s: list[float] = []
    if learning and new_stamps:
        assert last_step_time is not None
        gaps_s = list(map(sub, new_stamps, [last_step_time, *new_stamps[:-1]]))
        if not learned_gap(min(gaps_s)):
            gaps_s = list(filter(learned_gap, gaps_s))  # lines read in one burst
        if gaps_s and not uncapped(max(gaps_s), uncapped_s):
            return None  # a long save the hard timeout may cap
    progress = last_progress
    if last_progress is not None:
        if block.ticks and _longest_silence(clock, stamps, new, last_progress) >= least_soft_s:
            return None
        if new_stamps:
            progress = max(last_progress, new_stamps[-1] if rising else max(new_stamps))
            if not steps_seen and block.output:
                # Line 0's output is progress too while no step was ever seen.
                progress = max(progress, clock[0])
    # Activity: the output lines (but line 0's while no step was seen), the samples after
    # each line's first, and the first sample of a line that is no new step.
    seen: list[float] = []
    if block.output and (steps_seen or count > 1):
        seen.append(clock[-1])  # the latest of the clock from line 0 or 1: its last
    if len(names) > 1:
        seen.append(stamps[-1] if rising else max(stamps))
    elif new is not None and not all(new):
        seen.append(max(compress(stamps, map(not_, new))))
    activity = last_activity
    if seen and (activity is None or max(seen) > activity):
        activity = max(seen)
    return BlockProgress(
        new_steps=bool(new_lines),
        last_step=steps[new_lines[-1]] if new_lines else last_step,
        last_step_time=new_stamps[-1] if new_stamps else last_step_time,
        last_progress=progress,
        last_activity=activity,
        gaps_s=gaps_s,
    )


def moment_progress(
    block: Block,
    *,
    last_step: int | None,
    last_step_time: float | None,
    last_activity: float | None,
    clock_running: bool,
) -> BlockProgress | None:
    """``block_progress`` for a block with progress bars among its lines (``block.progress``:
    HF Trainer output replayed before any timestamp), or None unless it is steady.

    Every bar and line is read at one moment, ``block.progress_at``, with no tick and no
    output. The first sample of a bar or line whose step passes every step before it is
    a new step; a line's other samples, and the first of one that is no new step, are
    activity. Only before the rule's clock runs (``clock_running``: an attempt started,
    so there is progress to measure silence from and gaps to learn): such a block comes
    before the data's first timestamp, which starts it.
    """
    seen = block.progress
    if seen is None or clock_running or block.times is not None or block.ticks or block.output:
        return None
    if not SYSTEM_METRICS.isdisjoint(block.names):
        return None  # the machine's state: line by line
    at = block.progress_at
    new = rising_steps(seen, last_step) if seen else []
    new_steps = bool(seen) and (new is None or any(new))
    active = len(block.names) > 1 or (new is not None and not all(new))
    activity = last_activity
    if active and (activity is None or at > activity):
        activity = at
    return BlockProgress(
        new_steps=new_steps,
        last_step=max(seen) if new_steps else last_step,
        last_step_time=at if new_steps else last_step_time,
        last_progress=None,
        last_activity=activity,
        gaps_s=[],
    )


def _longest_silence(
    clock: list[float], stamps: list[float], new: list[bool] | None, last_progress: float
) -> float:
    """At least the longest silence a tick within the block measures: the tick at line
    ``i`` measures from the latest progress before it, which is no earlier than the
    stamp of the last new step before line ``i`` (or ``last_progress``)."""
    if new is None:
        # Every line is a new step: line i's tick comes after line i - 1's step.
        later = max(map(sub, islice(clock, 1, None), stamps), default=-inf)
        return max(clock[0] - last_progress, later)
    # Rarely (a resume, a clock going back): the progress before each line, line by line.
    progressed = [stamp if is_new else -inf for stamp, is_new in zip(stamps, new, strict=True)]
    before = accumulate(progressed, max, initial=last_progress)
    longest: float = max(map(sub, clock, before))
    return longest


__all__ = [
    "EVIDENCE_METRICS",
    "BlockProgress",
    "Evidence",
    "StallConfig",
    "Timeouts",
    "Verdict",
    "block_progress",
    "learned_gap",
    "moment_progress",
    "uncapped",
]
