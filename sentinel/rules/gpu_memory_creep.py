"""gpu_memory_creep: GPU memory climbing step over step (a leak), or near capacity (OOM ahead).

Two kinds of series: memory metrics the job logs (one series per metric name), and
sentinel's own NVML readings (``gpu_mem_used_bytes``, one series per GPU the job
holds, its capacity the same GPU's ``gpu_mem_total_bytes``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Literal

from sentinel.model.machine import GPU_JOB, GPU_MEM_TOTAL, GPU_MEM_USED
from sentinel.model.records import PROGRESS, Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector
from sentinel.rules.gpu_memory_windows import (
    CAPACITY_METRICS,
    MEMORY_METRICS,
    PERCENT_SUFFIXES,
    GpuMemoryCreepConfig,
    Key,
    Plan,
    Window,
    calm,
    creep_evidence,
    grew_enough,
    growth,
    logged_memory,
    near_capacity,
    near_full,
)
from sentinel.rules.series import Warmup

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
