"""gpu_memory_creep's settings (``[rules.gpu_memory_creep]``) and what it reads in a
series' window: a creep and its trend, one value at a time, and for a replay block in bulk
(which logged memory it appends, the proof none of it judges a creep or a capacity).

Pure functions of a window, the rule's settings and the series' capacity; the rule
(``gpu_memory_creep.py``) keeps the windows and the episode.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import accumulate, compress, islice, repeat
from operator import and_, gt, lt, sub, truediv
from typing import Any

from pydantic import Field

from sentinel.model.records import Block
from sentinel.rules.base import MetricNames, MetricRuleConfig
from sentinel.rules.series import Warmup, judged_mask

#: GPU memory metrics as common loggers name them (lower-cased, ``train/`` stripped):
#: hand-written loops, MosaicML Composer's MemoryMonitor, torchtitan, Megatron-LM,
#: axolotl; sentinel's own NVML readings use ``gpu_memory_used``.
MEMORY_METRICS: tuple[str, ...] = (
    "gpu_memory",
    "gpu_memory_used",
    "gpu_memory_gb",
    "gpu_memory_mb",
    "gpu_mem",
    "gpu_mem_used",
    "gpu_mem_gb",
    "gpu_mem_mb",
    "cuda_mem",
    "cuda_memory_allocated",
    "cuda_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_allocated",
    "mem_reserved",
    "memory/allocated",
    "memory/reserved",
    "memory/memory_allocated",
    "memory/max_memory_allocated",
    "memory/current_allocated_mem",
    "memory/current_reserved_mem",
    "memory/peak_allocated_mem",
    "memory/peak_reserved_mem",
    "memory/max_active(gib)",
    "memory/max_reserved(gib)",
    "memory/max_active(%)",
    "memory/max_reserved(%)",
    "mem-allocated-bytes",
    "mem-max-allocated-bytes",
)

#: Logged totals (same unit as the watched metrics) that give the capacity.
CAPACITY_METRICS: tuple[str, ...] = (
    "gpu_memory_total",
    "gpu_mem_total",
    "memory_total",
    "total_memory",
)

#: Name endings of metrics logged as a percentage of the device: their capacity is 100.
PERCENT_SUFFIXES: tuple[str, ...] = ("(%)", "_pct", "_percent")


class GpuMemoryCreepConfig(MetricRuleConfig):
    """``[rules.gpu_memory_creep]``.

    DESIGN gives no numbers; these follow the other windowed rules: 20 logged values
    is long enough that the allocator's noise averages out, and 10% growth in that
    window is no fragmentation wobble. 95% of capacity leaves the caching allocator
    no room for the next long batch.
    """

    #: Memory metrics to watch (names as logged, lower-cased); each is its own series.
    metrics: MetricNames = Field(default_factory=lambda: list(MEMORY_METRICS))
    #: Values of a series judged together for a creep.
    window: int = Field(default=20, ge=3)
    #: Share of the window's step-to-step changes that must be increases.
    rising_fraction: float = Field(default=0.8, gt=0, le=1)
    #: Growth over the window (0.1: 10%) that makes a creep; the window's low point must
    #: also have risen by half of it, so an allocate/free sawtooth is no creep.
    min_growth: float = Field(default=0.1, gt=0)
    #: Device capacity in the metrics' own unit; else a logged total (``capacity_metrics``).
    #: Metrics named as a percentage (``(%)``, ``_pct``, ``_percent``) have capacity 100.
    capacity: float | None = Field(default=None, gt=0)
    #: Logged metrics carrying the device's total memory, in the watched metrics' unit.
    capacity_metrics: MetricNames = Field(default_factory=lambda: list(CAPACITY_METRICS))
    #: Usage at or above this fraction of capacity is "OOM ahead".
    capacity_fraction: float = Field(default=0.95, gt=0, le=1)
    #: Steps never judged. PyTorch allocates the optimizer's state at the first
    #: ``optimizer.step()`` and the caching allocator finds its working set over the first
    #: iterations; 10 steps covers both (and a resumed job is past them).
    warmup_steps: int = Field(default=10, ge=0)
    #: Judge the NVML readings of the job's GPUs too (``gpu_mem_used_bytes``).
    nvml: bool = True


#: A series: (metric, GPU source) for NVML readings, (metric, "") for a logged metric.
Key = tuple[str, str]
#: A series' last values, with their steps.
Window = deque[tuple[int | None, float]]
#: Per logged memory metric, the values (and their steps) a block appends to its window.
Plan = dict[str, tuple[list[float], list[int]]]


def capacity_bar(capacity: float, settings: GpuMemoryCreepConfig) -> float:
    """The level at which memory is near capacity: ``capacity_fraction`` of it."""
    return settings.capacity_fraction * capacity


def near_full(value: float, capacity: float | None, settings: GpuMemoryCreepConfig) -> bool:
    """Whether ``value`` is near a known capacity: at or above its bar."""
    return capacity is not None and value >= capacity_bar(capacity, settings)


def grew_enough(grown: float, settings: GpuMemoryCreepConfig) -> bool:
    """Whether a window's relative growth makes a creep: at least ``min_growth``."""
    return grown >= settings.min_growth


def rises_enough(rises: int, size: int, settings: GpuMemoryCreepConfig) -> bool:
    """Whether ``rises`` increases among a window of ``size`` values' changes make a creep:
    at least ``rising_fraction`` of them."""
    return rises >= settings.rising_fraction * (size - 1)


def growth(window: Window) -> float:
    """Relative growth from the window's first value to its last."""
    first, last = window[0][1], window[-1][1]
    if first > 0:
        return (last - first) / first
    return math.inf if last > first else 0.0


def creep_evidence(
    window: Window, settings: GpuMemoryCreepConfig, capacity: float | None
) -> dict[str, Any] | None:
    """The evidence of a creep over the full window, or None."""
    if len(window) < settings.window:
        return None
    values = [value for _, value in window]
    rises = [i for i in range(1, len(values)) if values[i] > values[i - 1]]
    if not rises_enough(len(rises), len(values), settings):
        return None
    grown = growth(window)
    if not grew_enough(grown, settings):
        return None
    half = len(values) // 2
    low_before, low_after = min(values[:half]), min(values[half:])
    floor_growth = (low_after - low_before) / low_before if low_before > 0 else grown
    if floor_growth < settings.min_growth / 2:
        return None
    onset_step = window[rises[0]][0]
    details = trend(window, capacity)
    details.update(
        onset_step=onset_step,
        growth=grown,
        rising_share=len(rises) / (len(values) - 1),
        values=values,
    )
    return details


def trend(window: Window, capacity: float | None) -> dict[str, Any]:
    """Growth per step over the window and, with a capacity, the steps left until it."""
    (first_step, first), (last_step, last) = window[0], window[-1]
    span = (last_step - first_step) if first_step is not None and last_step is not None else 0
    per_step = (last - first) / (span if span > 0 else max(len(window) - 1, 1))
    projected = None
    if capacity is not None and per_step > 0:
        projected = max(0, math.ceil((capacity - last) / per_step))
    return {"growth_per_step": per_step, "capacity": capacity, "projected_steps": projected}


def near_capacity(window: Window, capacity: float | None) -> dict[str, Any]:
    """The evidence of a value near capacity: the trend, from the newest value."""
    details = trend(window, capacity)
    details.update(onset_step=window[-1][0], values=[value for _, value in window])
    return details


def logged_memory(
    block: Block,
    memory: frozenset[str],
    totals: frozenset[str],
    capacity: float | None,
    warmup: Warmup,
    episode_open: bool,
) -> Plan | None:
    """Per logged memory metric of the block, the values (and steps) its window takes line by
    line; None when the block cannot be told in bulk (a new capacity before the memory it
    bounds, an open episode, the warmup ending, a step repeated or going back).

    ``capacity`` is the logged capacity now; ``calm`` must still clear each metric's values.
    """
    names = block.names
    metrics = [name for name in names if name in memory and name not in totals]
    for name in names:
        if name not in totals:
            continue
        column = block.columns[name]
        if metrics and (min(column) != capacity or max(column) != capacity):
            return None  # a new capacity before the memory it bounds: line by line
        if not metrics and not (min(column) > 0 and math.isfinite(sum(column))):
            return None
    if not metrics:
        return {}
    if episode_open or ("lr" in names and warmup.lr_rising is not False):
        return None
    if warmup.lr_rising:
        return {}
    steps = block.steps
    if not all(map(lt, steps, islice(steps, 1, None))):
        return None  # a step again or back: line by line skips the repeats
    plan: Plan = {}
    for name in metrics:
        values, kept = block.columns[name], steps
        keep = judged_mask(values, kept, warmup.warmup_steps)
        if keep is not None:
            values, kept = list(compress(values, keep)), list(compress(kept, keep))
        if values:
            plan[name] = (values, kept)
    return plan


def calm(
    window: Window | None,
    values: list[float],
    steps: list[int],
    capacity: float | None,
    settings: GpuMemoryCreepConfig,
) -> bool:
    """Whether appending ``values`` (at rising ``steps``) to ``window`` judges no creep and
    no capacity at any of them."""
    if near_full(max(values), capacity, settings):
        return False
    last_step = window[-1][0] if window else None
    if last_step is not None and steps[0] <= last_step:
        return False
    size = settings.window
    series = [value for _, value in window or ()] + values
    if len(series) < size:
        return True
    # Windows end at each new value once full; the first starts at the first index
    # whose window ends on a new value.
    first_start = max(0, len(series) - len(values) - size + 1)
    low = min(islice(series, first_start, None))
    if low <= 0:
        return False  # a growth from zero is infinite (see growth)
    if not grew_enough((max(series) - low) / low, settings):
        return True  # no window's last value is min_growth above its first
    firsts = series[first_start : len(series) - size + 1]
    lasts = series[first_start + size - 1 :]
    growths = map(truediv, map(sub, lasts, firsts), firsts)
    rose = list(accumulate(map(gt, islice(series, 1, None), series), initial=0))
    # The window starting at i has its rises among changes i+1 .. i+size-1.
    rises = map(sub, islice(rose, first_start + size - 1, None), islice(rose, first_start, None))
    grown = map(grew_enough, growths, repeat(settings))
    rising = map(rises_enough, rises, repeat(size), repeat(settings))
    return not any(map(and_, grown, rising))
