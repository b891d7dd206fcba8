"""One reading of the GPUs through NVML: no thread, no pacing, a reading per call.

Errors are per metric: a metric the GPU does not support is dropped for that GPU,
any other NVML error skips it for one reading (logged once, then at most every
``REPEAT_LOG_S``). A GPU NVML calls lost is reported once as XID 79 and not read
again. Each reading ends with which GPUs are the job's (``gpu_job``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sentinel.gpu.nvml import (
    ClockEventsCall,
    GpuProbe,
    LimitedLog,
    attribute,
    is_wanted,
    parse_visible,
    shutdown,
)
from sentinel.model.machine import (
    GPU_CLOCK_EVENTS,
    GPU_ECC_CORRECTED,
    GPU_ECC_UNCORRECTED,
    GPU_JOB,
    GPU_MEM_TOTAL,
    GPU_MEM_USED,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_SM_CLOCK,
    GPU_TEMP,
    GPU_UTIL,
    GPU_XID,
    gpu_source,
)
from sentinel.model.records import Sample

log = logging.getLogger(__name__)

#: A failing metric is logged again, with the count of readings it failed, after this long.
REPEAT_LOG_S = 600.0
#: The XID the driver reports for a GPU that has fallen off the bus; sent once for a lost GPU.
XID_FALLEN_OFF_BUS = 79
#: The enforced power limit is read again only after this long; every reading in between
#: repeats the last value. An admin may change it (``nvidia-smi -pl``), rarely: an NVML call
#: per GPU per poll is not worth seeing that sooner.
POWER_LIMIT_REREAD_S = 60.0

Attribution = Literal["auto", "job", "all"]


class _GpuLost(Exception):
    """NVML said the GPU is lost: stop reading it."""


#: A metric read each poll: (sample, NVML function, its arguments after the handle,
#: divisor to the sample's unit).
_Scalar = tuple[str, Callable[..., Any], tuple[int, ...], float]


@dataclass
class WatchedGpu:
    """One GPU NVML opened for watching, and what reading it has learnt."""

    index: int
    handle: Any
    source: str
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    #: The last enforced power limit read (watts), and when (epoch seconds).
    power_limit_w: float | None = None
    power_limit_read_at: float = 0.0
    #: NVML's UUID of the GPU, read the first time a job names GPUs by UUID ("" unread,
    #: "unknown" when NVML could not tell it).
    uuid: str = ""


def open_gpus(probe: GpuProbe, visible_devices: str | None) -> list[WatchedGpu] | None:
    """Initialise NVML and open the GPUs to watch; None, NVML shut again, without NVML.

    ``visible_devices``: a ``CUDA_VISIBLE_DEVICES`` value (indexes or ``GPU-`` UUIDs);
    only those GPUs are watched. None: every GPU.
    """
    missing = (
        probe.NVMLError_LibraryNotFound,
        probe.NVMLError_DriverNotLoaded,
        probe.NVMLError_NoPermission,
    )
    try:
        probe.nvmlInit()
    except missing as exc:
        log.info("no NVML (%s): GPU rules are off", exc)
        return None
    try:
        count = probe.nvmlDeviceGetCount()
    except probe.NVMLError as exc:
        log.warning("NVML cannot count the GPUs (%s): GPU rules are off", exc)
        shutdown(probe)
        return None
    wanted = parse_visible(visible_devices)
    gpus: list[WatchedGpu] = []
    for index in range(count):
        try:
            handle = probe.nvmlDeviceGetHandleByIndex(index)
            if wanted is not None and not is_wanted(probe, handle, index, wanted):
                continue
        except probe.NVMLError as exc:
            log.warning("gpu:%d is not read: NVML cannot open it (%s)", index, exc)
            continue
        gpus.append(WatchedGpu(index, handle, gpu_source(index)))
    log.info(
        "NVML: watching %d of %d GPUs (%s)",
        len(gpus),
        count,
        ", ".join(gpu.source for gpu in gpus) or "none",
    )
    return gpus


class GpuReader:
    """Reads every watched GPU, and which of them are the job's, one reading per ``read``.

    Not thread-safe: one thread reads at a time (``GpuMonitor`` holds a lock).
    """

    def __init__(
        self,
        probe: GpuProbe,
        gpus: list[WatchedGpu],
        *,
        attribution: Attribution,
        job_pids: Callable[[], frozenset[int]],
        job_devices: Callable[[], frozenset[str] | None] = lambda: None,
    ) -> None:
        """``job_devices``: the GPU UUIDs the job's environment names (``NVIDIA_VISIBLE_DEVICES``,
        what a container runtime gave it), None when it names none. When it names some,
        only those are read (as ``CUDA_VISIBLE_DEVICES`` narrows the GPUs opened): a sidecar
        the runtime shows every GPU of the node never judges another job's."""
        self.gpus = gpus
        self._probe = probe
        self._attribution: Attribution = attribution
        self._job_pids = job_pids
        self._job_devices = job_devices
        self._named: frozenset[int] | None = None
        self._scalars = _scalar_calls(probe, ClockEventsCall(probe))
        self._log_limited = LimitedLog(log, REPEAT_LOG_S)
        self._job_gpus: frozenset[int] | None = None

    def read(self, now: float) -> dict[str, list[Sample]]:
        """One reading of every GPU: source -> samples; ``now`` paces the repeated logs."""
        readings: dict[str, list[Sample]] = {}
        pids: dict[int, frozenset[int] | None] = {}
        named = self._named_gpus()
        for gpu in self.gpus:
            if gpu.lost or (named is not None and gpu.index not in named):
                continue
            try:
                readings[gpu.source], pids[gpu.index] = self._read_gpu(gpu, now)
            except _GpuLost as exc:
                gpu.lost = True
                log.error("%s is lost (%s): reported as XID 79, no longer read", gpu.source, exc)
                readings[gpu.source] = [Sample(GPU_XID, float(XID_FALLEN_OFF_BUS))]
        for index, is_job in self._attribute(pids).items():
            readings[gpu_source(index)].append(Sample(GPU_JOB, 1.0 if is_job else 0.0))
        return readings

    def _read_gpu(self, gpu: WatchedGpu, now: float) -> tuple[list[Sample], frozenset[int] | None]:
        probe = self._probe
        samples: list[Sample] = []
        util = self._read(gpu, now, GPU_UTIL, probe.nvmlDeviceGetUtilizationRates)
        if util is not None:
            samples.append(Sample(GPU_UTIL, float(util.gpu)))
        memory = self._read(gpu, now, "gpu_mem", probe.nvmlDeviceGetMemoryInfo)
        if memory is not None:
            samples.append(Sample(GPU_MEM_USED, float(memory.used)))
            samples.append(Sample(GPU_MEM_TOTAL, float(memory.total)))
        for name, function, args, divisor in self._scalars:
            value = self._read(gpu, now, name, function, *args)
            if value is not None:
                samples.append(Sample(name, float(value) / divisor))
        limit_w = self._power_limit_w(gpu, now)
        if limit_w is not None:
            samples.append(Sample(GPU_POWER_LIMIT, limit_w))
        processes = self._read(gpu, now, "processes", probe.nvmlDeviceGetComputeRunningProcesses)
        pids = None if processes is None else frozenset(int(p.pid) for p in processes)
        return samples, pids

    def _power_limit_w(self, gpu: WatchedGpu, now: float) -> float | None:
        """The enforced power limit: read at most every ``POWER_LIMIT_REREAD_S``."""
        age_s = now - gpu.power_limit_read_at
        if gpu.power_limit_w is None or not 0 <= age_s < POWER_LIMIT_REREAD_S:
            # (A clock set back shows as a negative age: read again.)
            limit_mw = self._read(
                gpu, now, GPU_POWER_LIMIT, self._probe.nvmlDeviceGetEnforcedPowerLimit
            )
            if limit_mw is None:
                # Failed this time (asked again next poll: the last value meanwhile), or
                # not supported (None from then on).
                return gpu.power_limit_w
            gpu.power_limit_w, gpu.power_limit_read_at = float(limit_mw) / 1000, now
        return gpu.power_limit_w

    def _read(
        self,
        gpu: WatchedGpu,
        now: float,
        metric: str,
        function: Callable[..., Any],
        *args: int,
    ) -> Any:
        """``function(handle, *args)``, or None when the metric is skipped (see the module)."""
        if metric in gpu.unsupported:
            return None
        probe = self._probe
        key = (gpu.source, metric)
        try:
            return function(gpu.handle, *args)
        except (probe.NVMLError_NotSupported, probe.NVMLError_FunctionNotFound):
            # FunctionNotFound: a driver older than the call; it will not grow one.
            gpu.unsupported.add(metric)
            log.info("%s does not support %s: not read from now on", gpu.source, metric)
        except probe.NVMLError_GpuIsLost as exc:
            raise _GpuLost(str(exc)) from exc
        except probe.NVMLError as exc:
            message = "%s: reading %s failed (%s); skipped"
            self._log_limited((*key, type(exc)), now, logging.WARNING, message, *key, exc)
        except Exception as exc:
            # Not NVML's: a bug, or a binding that changed. Keep reading the rest.
            message = "%s: reading %s raised %r; skipped"
            self._log_limited(
                (*key, type(exc)), now, logging.ERROR, message, *key, exc, exc_info=True
            )
        return None

    def _attribute(self, pids: dict[int, frozenset[int] | None]) -> dict[int, bool]:
        """Which GPUs are the job's, from the pids on each (None: unknown)."""
        job = frozenset[int]() if self._attribution == "all" else self._job_pids()
        owned = attribute(self._attribution, pids, job)
        job_gpus = frozenset(index for index, is_job in owned.items() if is_job)
        if job_gpus != self._job_gpus:
            self._job_gpus = job_gpus
            log.info(
                "GPUs attributed to the job (%s): %s",
                self._attribution,
                ", ".join(gpu_source(i) for i in sorted(job_gpus)) or "none",
            )
        return owned

    def judged(self, source: str) -> bool:
        """Whether ``source``'s XIDs are the job's to judge: every GPU opened, or those the
        job's environment names (see ``__init__``)."""
        named = self._named_gpus()
        return named is None or any(g.source == source and g.index in named for g in self.gpus)

    def _named_gpus(self) -> frozenset[int] | None:
        """The watched GPUs whose UUID the job's environment names; None when it names none."""
        uuids = self._job_devices()
        if uuids is None:
            return None
        named: set[int] = set()
        for gpu in self.gpus:
            if not gpu.uuid:
                try:
                    gpu.uuid = str(self._probe.nvmlDeviceGetUUID(gpu.handle))
                except self._probe.NVMLError as exc:
                    # Said once: a GPU whose UUID is unknown is never one the job names.
                    log.warning("%s: NVML cannot tell its UUID (%s): not read", gpu.source, exc)
                    gpu.uuid = "unknown"
                    continue
            if gpu.uuid in uuids:
                named.add(gpu.index)
        if frozenset(named) != self._named:
            self._named = frozenset(named)
            log.info(
                "reading the job's GPUs, those its NVIDIA_VISIBLE_DEVICES names: %s",
                ", ".join(gpu_source(i) for i in sorted(named)) or "none of those seen here",
            )
        return self._named


def _scalar_calls(probe: GpuProbe, clock_events: ClockEventsCall) -> list[_Scalar]:
    """The scalar metrics read every poll (the power limit is read less often)."""
    ecc = probe.nvmlDeviceGetTotalEccErrors
    volatile = probe.NVML_VOLATILE_ECC
    return [
        (GPU_TEMP, probe.nvmlDeviceGetTemperature, (probe.NVML_TEMPERATURE_GPU,), 1),
        (GPU_POWER, probe.nvmlDeviceGetPowerUsage, (), 1000),  # milliwatts
        (GPU_SM_CLOCK, probe.nvmlDeviceGetClockInfo, (probe.NVML_CLOCK_SM,), 1),
        (GPU_CLOCK_EVENTS, clock_events, (), 1),
        (GPU_ECC_UNCORRECTED, ecc, (probe.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, volatile), 1),
        (GPU_ECC_CORRECTED, ecc, (probe.NVML_MEMORY_ERROR_TYPE_CORRECTED, volatile), 1),
    ]
