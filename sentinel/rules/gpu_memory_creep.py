"""gpu_memory_creep: GPU memory climbing step over step (a leak), or near capacity (OOM ahead).

Two kinds of series: memory metrics the job logs (one series per metric name), and
sentinel's own NVML readings (``gpu_mem_used_bytes``, one series per GPU the job
holds, its capacity the same GPU's ``gpu_mem_total_bytes``).
"""

from __future__ import annotations

import math
from collections import deque
from itertools import accumulate, compress, islice, repeat
from operator import and_, gt, lt, sub, truediv
from typing import Any, Literal

from pydantic import Field

from sentinel.model.machine import GPU_JOB, GPU_MEM_TOTAL, GPU_MEM_USED
from sentinel.model.records import PROGRESS, Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricNames, MetricRuleConfig, Reading, Recent
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

    The runbooks give no numbers; these follow the other windowed rules: 20 logged values
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


Kind = Literal["creep", "capacity"]


class GpuMemoryCreepDetector(BaseDetector):
    """Warns once per episode on a creeping memory series or one near capacity.

    A creep: over the last ``window`` values, at least ``rising_fraction`` of the
    changes are increases, the last value is ``min_growth`` above the first, and the
    lowest value of the window's second half is half that above the lowest of its
    first half. One episode covers every series and both kinds; it ends when every
    offending series is clear: a creep when its window grew less than ``min_growth``,
    a capacity when the value is back under the bar.

    NVML readings come every few seconds, several a step, and NVML's "used" includes
    the caching allocator's reserve, which grows in steps and then holds flat. So a
    GPU's series records a reading only when the value changed: the holds are no
    evidence either way, a reserve that settles fills no window, and only memory that
    keeps taking new, higher levels creeps. A creep also ends once the GPU held one
    level for ``window`` readings. Only GPUs attributed to the job (``gpu_job`` 1) are
    judged, and only once the job logs steps (before its first step it is loading).
    """

    rule = "gpu_memory_creep"
    config_model = GpuMemoryCreepConfig

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        if alert.details.get("kind") == "capacity":
            return (
                "GPU memory near capacity: an OOM is ahead",
                "lower the batch size, enable gradient checkpointing, or shard more",
                alert.metric,
            )
        return (
            "GPU memory climbs step over step: a leak",
            "look for tensors kept across steps (a loss appended without .item(), growing"
            " caches or lists of outputs)",
            alert.metric,
        )

    def __init__(self, config: GpuMemoryCreepConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._memory = frozenset(config.metrics)
        self._totals = frozenset(config.capacity_metrics)
        self._nvml = frozenset({GPU_MEM_USED, GPU_MEM_TOTAL, GPU_JOB}) if config.nvml else None
        self._watched = self._memory | self._totals | {"lr"} | (self._nvml or frozenset())
        self.watches = self._watched
        #: Whether a learning rate only feeds the warmup (it is no memory metric here).
        self._lr_warmup_only = "lr" not in self._memory | self._totals | (self._nvml or set())
        self._warmup = Warmup(config.warmup_steps)
        self._reset()

    def _reset(self) -> None:
        self._warmup.reset()
        self._series: dict[Key, Window] = {}
        self._logged_capacity: float | None = None
        #: (series, kind) pairs that are offending in the open episode.
        self._offending: set[tuple[Key, Kind]] = set()
        #: Per GPU source: attributed to the job, its total memory, readings on one level.
        self._attached: dict[str, bool] = {}
        self._gpu_capacity: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def job_started(self, now: float) -> None:
        self._reset()

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        name, value = sample.name, sample.value
        if name == "lr":
            self._warmup.observe(sample)
        if not math.isfinite(value):
            return []
        if self._nvml is not None and name in self._nvml:
            return self._observe_gpu(sample, source, now)
        if name in self._totals:
            if value > 0:
                self._logged_capacity = value
            return []
        if name not in self._memory or self._warmup.active(sample.step):
            return []
        window = self._series.get((name, ""))
        if window is None:
            window = self._series[(name, "")] = deque(maxlen=self.settings.window)
        last_step = window[-1][0] if window else None
        if sample.step is not None and last_step is not None and sample.step <= last_step:
            return []  # the same step again
        window.append((sample.step, value))
        time = sample.time if sample.time is not None else now
        return self._judge((name, ""), window, sample, source, time)

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """``observe`` per sample it watches; a learning rate only feeds the warmup."""
        lr_warmup_only = self._lr_warmup_only
        watches = self._watched
        found: list[tuple[int, Alert]] = []
        for index, sample in enumerate(samples):
            name = sample[0]
            if name == "lr" and lr_warmup_only:
                if self._warmup.lr_rising is not False:
                    self._warmup.observe(sample)
                continue
            if name not in watches or name == PROGRESS:
                continue
            for alert in self.observe(sample, source, now):
                found.append((index, alert))
        return found

    def can_absorb(self, block: Block) -> bool:
        """Whether the block's logged memory provably raises nothing: lines without memory
        metrics always (their learning rates only feed the warmup); with them, outside an
        episode, at new steps, no value at the capacity bar and no window of the block both
        ``rising_fraction`` rising and ``min_growth`` grown, the warmup settled."""
        return self._memory_plan(block) is not None

    def absorb(self, block: Block) -> None:
        """The state the block's lines leave, one by one."""
        plan = self._memory_plan(block)
        assert plan is not None
        names = block.names
        if "lr" in names:
            self._warmup.extend(block.columns["lr"])
        totals = [name for name in names if name in self._totals]
        if totals:
            self._logged_capacity = block.columns[totals[-1]][-1]
        size = self.settings.window
        for name, (values, steps) in plan.items():
            window = self._series.get((name, ""))
            if window is None:
                window = self._series[(name, "")] = deque(maxlen=size)
            window.extend(zip(steps[-size:], values[-size:], strict=True))

    def _memory_plan(self, block: Block) -> Plan | None:
        """Per logged memory metric of the block, the values (and steps) its window takes,
        when none raises an alert; None when that is not certain."""
        names = block.names
        if self._nvml is not None and not self._nvml.isdisjoint(names):
            return None  # NVML readings come from the GPU source, not from a log
        if "lr" in names and not self._lr_warmup_only:
            return None
        capacity, windows = self._logged_capacity, self._series
        plan = logged_memory(
            block, self._memory, self._totals, capacity, self._warmup, bool(self._offending)
        )
        if plan is None:
            return None
        for name, (values, steps) in plan.items():
            key = (name, "")
            if not calm(windows.get(key), values, steps, self._capacity_of(key), self.settings):
                return None
        return plan

    def _observe_gpu(self, sample: Sample, source: str, now: float) -> list[Alert]:
        """An NVML reading of GPU ``source``."""
        name, value = sample.name, sample.value
        if name == GPU_JOB:
            self._attached[source] = value >= 0.5
            return [] if value >= 0.5 else self._forget(source, sample, now)
        if name == GPU_MEM_TOTAL:
            if value > 0:
                self._gpu_capacity[source] = value
            return []
        step = sample.step
        # The engine's facts know the attribution before this reading's own gpu_job comes.
        attached = self._attached.get(source) or source in self.facts.job_gpus
        if not attached or step is None or self._warmup.active(step):
            return []
        key = (name, source)
        window = self._series.get(key)
        if window is None:
            window = self._series[key] = deque(maxlen=self.settings.window)
        if window and window[-1][1] == value:
            held = self._held[source] = self._held.get(source, 0) + 1
            if held >= self.settings.window and (key, "creep") in self._offending:
                return self._clear(key, "creep", sample, source, now)
            capacity = self._capacity_of(key)
            if (key, "capacity") in self._offending or not near_full(
                value, capacity, self.settings
            ):
                return []
            # Full from the first reading, before this GPU's total was read.
            return self._judge(key, window, sample, source, now)
        self._held[source] = 0
        window.append((step, value))
        return self._judge(key, window, sample, source, now)

    def _forget(self, source: str, sample: Sample, now: float) -> list[Alert]:
        """GPU ``source`` left the job: its series is dropped, its episode part ends."""
        key = (GPU_MEM_USED, source)
        self._series.pop(key, None)
        self._held.pop(source, None)
        alerts = self._clear(key, "creep", sample, source, now)
        return alerts + self._clear(key, "capacity", sample, source, now)

    def _clear(self, key: Key, kind: Kind, sample: Sample, source: str, now: float) -> list[Alert]:
        """One series is clear of one kind; the resolve when it was the last offence."""
        if (key, kind) not in self._offending:
            return []
        self._offending.discard((key, kind))
        return [] if self._offending else [self._resolve(key, sample, source, now)]

    def _judge(
        self, key: Key, window: Window, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        """Judge series ``key`` after its newest value was appended to ``window``."""
        value = sample.value
        was_open = bool(self._offending)
        found: list[tuple[Kind, dict[str, Any]]] = []
        capacity = self._capacity_of(key)
        creep = creep_evidence(window, self.settings, capacity)
        if creep is not None:
            found.append(("creep", creep))
        elif (key, "creep") in self._offending and not grew_enough(growth(window), self.settings):
            self._offending.discard((key, "creep"))
        if near_full(value, capacity, self.settings):
            found.append(("capacity", near_capacity(window, capacity)))
        else:
            self._offending.discard((key, "capacity"))
        for kind, _ in found:
            self._offending.add((key, kind))
        if not was_open and found:
            kind, details = found[0]
            return [
                self._episode_alert(
                    key, sample, source=source, time=time, kind=kind, details=details
                )
            ]
        if was_open and not self._offending:
            return [self._resolve(key, sample, source, time)]
        return []

    def _capacity_of(self, key: Key) -> float | None:
        name, gpu = key
        if gpu:
            return self._gpu_capacity.get(gpu)
        if name.endswith(PERCENT_SUFFIXES):
            return 100.0
        if self.settings.capacity is not None:
            return self.settings.capacity
        return self._logged_capacity

    @staticmethod
    def _amount(key: Key, value: float) -> str:
        """A value as the message shows it: NVML's bytes in GiB, logged values as logged."""
        return f"{value / 2**30:.2f} GiB" if key[1] else f"{value:.4g}"

    def _episode_alert(
        self,
        key: Key,
        sample: Sample,
        *,
        source: str,
        time: float,
        kind: Kind,
        details: dict[str, Any],
    ) -> Alert:
        """The episode's warning about series ``key``: a creep or a capacity."""
        name, value = sample.name, sample.value
        label = f"{name} on {key[1]}" if key[1] else name
        projected = details["projected_steps"]
        capacity = details["capacity"]
        per_step = self._amount(key, details["growth_per_step"])
        if kind == "creep":
            first = self._amount(key, details["values"][0])
            message = (
                f"{label} climbed {details['growth']:.0%} over {len(details['values'])} values"
                f" since step {details['onset_step']} ({first} to {self._amount(key, value)},"
                f" +{per_step} per step): a leak"
            )
            if projected is not None:
                message += (
                    f"; capacity {self._amount(key, capacity)} reached in about {projected} steps"
                )
        else:
            message = (
                f"{label} at {self._amount(key, value)} is {value / capacity:.0%} of capacity"
                f" {self._amount(key, capacity)}: OOM ahead"
            )
            if projected is not None:
                message += f"; rising {per_step} per step, full in about {projected} steps"
        return Alert(
            rule=self.rule,
            severity=self.settings.severity,
            message=message,
            time=time,
            source=source,
            step=sample.step,
            metric=name,
            value=value,
            onset_step=details.pop("onset_step"),
            details={"kind": kind, **details},
        )

    def _resolve(self, key: Key, sample: Sample, source: str, time: float) -> Alert:
        name = key[0]
        label = f"{name} on {key[1]}" if key[1] else name
        if sample.name == GPU_JOB:
            why = f"{key[1]} left the job"
        else:
            why = f"{label} at {self._amount(key, sample.value)} at step {sample.step}"
        return Alert(
            rule=self.rule,
            severity=Severity.INFO,
            message=f"GPU memory steady again ({why})",
            time=time,
            source=source,
            step=sample.step,
            metric=sample.name,
            value=sample.value,
            resolves=True,
        )


__all__ = [
    "CAPACITY_METRICS",
    "MEMORY_METRICS",
    "PERCENT_SUFFIXES",
    "GpuMemoryCreepConfig",
    "GpuMemoryCreepDetector",
]
