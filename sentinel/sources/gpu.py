"""The GPUs as a source: NVML read on threads of its own, one sample list per GPU.

A poll thread reads every GPU each ``interval_s``; an XID thread waits for XID critical
errors on an NVML event set. Only these threads call NVML, so a driver call that hangs
(it happens, on a GPU falling off the bus) never holds up the engine: the engine only
receives what ``on_samples`` hands it.

No NVML is not an error: ``start()`` logs one line and returns False, and the GPU rules
see no GPU samples. Errors are per metric: a metric the GPU does not support is dropped
for that GPU, any other NVML error skips it for one reading (logged once, then at most
every ``REPEAT_LOG_S``), and nothing NVML raises ends a thread.

GPUs are named by NVML's index (``gpu:<index>``), which is the physical order, the one
``nvidia-smi`` shows. ``visible_devices`` (the job's ``CUDA_VISIBLE_DEVICES``) narrows the
GPUs watched; it does not renumber them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sentinel.records import Sample
from sentinel.sources import (
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
    OnSamples,
    gpu_source,
)
from sentinel.sources.nvml import (
    ClockEventsCall,
    GpuProbe,
    LimitedLog,
    address,
    attribute,
    is_wanted,
    parse_visible,
    shutdown,
)

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

#: Called from the poll thread with one reading of every GPU (source -> samples), read at
#: epoch seconds: one hand-over a poll, however many GPUs.
OnReading = Callable[[dict[str, list[Sample]], float], None]


def _real_nvml() -> GpuProbe:
    import pynvml

    probe: GpuProbe = pynvml
    return probe


#: Makes the probe of ``GpuMonitor(None, ...)``: the real ``pynvml`` module. A benchmark
#: or a child process may swap in a factory of ``FakeNvml``.
NVML_FACTORY: Callable[[], GpuProbe] = _real_nvml


class _GpuLost(Exception):
    """NVML said the GPU is lost: stop reading it."""


#: A metric read each poll: (sample, NVML function, its arguments after the handle,
#: divisor to the sample's unit).
_Scalar = tuple[str, Callable[..., Any], tuple[int, ...], float]


@dataclass
class _Gpu:
    index: int
    handle: Any
    source: str
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    #: The last enforced power limit read (watts), and when (epoch seconds).
    power_limit_w: float | None = None
    power_limit_read_at: float = 0.0


class GpuMonitor:
    """Reads every GPU NVML shows, and its XID errors, for the engine."""

    def __init__(
        self,
        probe: GpuProbe | None,
        *,
        interval_s: float,
        on_samples: OnSamples,
        job_pids: Callable[[], frozenset[int]],
        on_reading: OnReading | None = None,
        attribution: Attribution = "auto",
        xid_events: bool = True,
        visible_devices: str | None = None,
        xid_wait_ms: int = 1000,
        stop_timeout_s: float = 5.0,
    ) -> None:
        """``visible_devices``: a ``CUDA_VISIBLE_DEVICES`` value (indexes or ``GPU-`` UUIDs);
        only those GPUs are watched. None: every GPU.

        ``on_reading``: where each poll's reading goes as a whole; None: to ``on_samples``,
        a call per GPU. XIDs always go to ``on_samples``.

        ``xid_wait_ms`` bounds how long ``stop()`` waits for the XID thread (NVML's wait
        cannot be interrupted); ``stop_timeout_s`` how long it waits for both threads.
        """
        self._probe = probe
        self._interval_s = interval_s
        self._on_samples = on_samples
        self._on_reading = on_reading
        self._job_pids = job_pids
        self._attribution: Attribution = attribution
        self._xid_events = xid_events
        self._visible_devices = visible_devices
        self._xid_wait_ms = xid_wait_ms
        self._stop_timeout_s = stop_timeout_s
        self._gpus: list[_Gpu] = []
        self._stop = threading.Event()
        self._read_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._opened = False
        self._log_limited = LimitedLog(log, REPEAT_LOG_S)
        self._clock_events: ClockEventsCall | None = None
        self._scalars: list[_Scalar] = []
        self._job_gpus: frozenset[int] | None = None
        self.available = False

    @property
    def device_count(self) -> int:
        """GPUs watched (0 before ``start``/``open`` or without NVML)."""
        return len(self._gpus)

    @property
    def running(self) -> bool:
        """Whether the poll thread is alive (a dead one means nothing watches the GPUs)."""
        return any(t.name == "sentinel-gpu-poll" and t.is_alive() for t in self._threads)

    def open(self) -> bool:
        """Initialise NVML and find the GPUs, starting no thread; False without NVML."""
        if self._opened:
            return True
        try:
            probe = self._probe if self._probe is not None else NVML_FACTORY()
        except ImportError as exc:
            log.info("no NVML (pynvml not importable: %s): GPU rules are off", exc)
            return False
        self._probe = probe
        missing = (
            probe.NVMLError_LibraryNotFound,
            probe.NVMLError_DriverNotLoaded,
            probe.NVMLError_NoPermission,
        )
        try:
            probe.nvmlInit()
        except missing as exc:
            log.info("no NVML (%s): GPU rules are off", exc)
            return False
        try:
            count = probe.nvmlDeviceGetCount()
        except probe.NVMLError as exc:
            log.warning("NVML cannot count the GPUs (%s): GPU rules are off", exc)
            shutdown(probe)
            return False
        self._clock_events = ClockEventsCall(probe)
        self._scalars = self._scalar_calls(probe, self._clock_events)
        wanted = parse_visible(self._visible_devices)
        for index in range(count):
            try:
                handle = probe.nvmlDeviceGetHandleByIndex(index)
                if wanted is not None and not is_wanted(probe, handle, index, wanted):
                    continue
            except probe.NVMLError as exc:
                log.warning("gpu:%d is not read: NVML cannot open it (%s)", index, exc)
                continue
            self._gpus.append(_Gpu(index, handle, gpu_source(index)))
        self._opened = self.available = True
        log.info(
            "NVML: watching %d of %d GPUs (%s)",
            len(self._gpus),
            count,
            ", ".join(gpu.source for gpu in self._gpus) or "none",
        )
        return True

    def start(self) -> bool:
        """Open NVML and start the poll (and XID) threads; False, and nothing started, without.

        A monitor starts once: after ``stop()`` make a new one.
        """
        if self._started:
            return True
        if not self.open():
            return False
        self._started = True
        targets: list[tuple[str, Callable[[], None]]] = [("sentinel-gpu-poll", self._poll_loop)]
        if self._xid_events:
            targets.append(("sentinel-gpu-xid", self._xid_loop))
        for name, target in targets:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return True

    def stop(self) -> None:
        """Stop the threads and shut NVML down; safe to call twice or without ``start``."""
        self._stop.set()
        deadline = time.monotonic() + self._stop_timeout_s
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if not self._opened:
            return
        self._opened = False
        if stuck:
            # Shutting NVML down under a call still inside it is asking for a crash.
            log.warning("NVML call still running in %s: NVML is left initialised", stuck)
            return
        assert self._probe is not None
        shutdown(self._probe)

    # --- readings --------------------------------------------------------------------------

    def read_once(self, now: float) -> dict[str, list[Sample]]:
        """One reading of every GPU: source -> samples; ``now`` paces the repeated logs."""
        with self._read_lock:
            if not self._opened or self._probe is None:
                return {}
            readings: dict[str, list[Sample]] = {}
            pids: dict[int, frozenset[int] | None] = {}
            for gpu in self._gpus:
                if gpu.lost:
                    continue
                try:
                    readings[gpu.source], pids[gpu.index] = self._read_gpu(self._probe, gpu, now)
                except _GpuLost as exc:
                    gpu.lost = True
                    log.error(
                        "%s is lost (%s): reported as XID 79, no longer read", gpu.source, exc
                    )
                    readings[gpu.source] = [Sample(GPU_XID, float(XID_FALLEN_OFF_BUS))]
            for index, is_job in self._attribute(pids).items():
                readings[gpu_source(index)].append(Sample(GPU_JOB, 1.0 if is_job else 0.0))
            return readings

    @staticmethod
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

    def _read_gpu(
        self, probe: GpuProbe, gpu: _Gpu, now: float
    ) -> tuple[list[Sample], frozenset[int] | None]:
        samples: list[Sample] = []
        util = self._read(probe, gpu, now, GPU_UTIL, probe.nvmlDeviceGetUtilizationRates)
        if util is not None:
            samples.append(Sample(GPU_UTIL, float(util.gpu)))
        memory = self._read(probe, gpu, now, "gpu_mem", probe.nvmlDeviceGetMemoryInfo)
        if memory is not None:
            samples.append(Sample(GPU_MEM_USED, float(memory.used)))
            samples.append(Sample(GPU_MEM_TOTAL, float(memory.total)))
        for name, function, args, divisor in self._scalars:
            value = self._read(probe, gpu, now, name, function, *args)
            if value is not None:
                samples.append(Sample(name, float(value) / divisor))
        limit_w = self._power_limit_w(probe, gpu, now)
        if limit_w is not None:
            samples.append(Sample(GPU_POWER_LIMIT, limit_w))
        processes = self._read(
            probe, gpu, now, "processes", probe.nvmlDeviceGetComputeRunningProcesses
        )
        pids = None if processes is None else frozenset(int(p.pid) for p in processes)
        return samples, pids

    def _power_limit_w(self, probe: GpuProbe, gpu: _Gpu, now: float) -> float | None:
        """The enforced power limit: read at most every ``POWER_LIMIT_REREAD_S``."""
        age_s = now - gpu.power_limit_read_at
        if gpu.power_limit_w is None or not 0 <= age_s < POWER_LIMIT_REREAD_S:
            # (A clock set back shows as a negative age: read again.)
            limit_mw = self._read(
                probe, gpu, now, GPU_POWER_LIMIT, probe.nvmlDeviceGetEnforcedPowerLimit
            )
            if limit_mw is None:
                # Failed this time (asked again next poll: the last value meanwhile), or
                # not supported (None from then on).
                return gpu.power_limit_w
            gpu.power_limit_w, gpu.power_limit_read_at = float(limit_mw) / 1000, now
        return gpu.power_limit_w

    def _read(
        self,
        probe: GpuProbe,
        gpu: _Gpu,
        now: float,
        metric: str,
        function: Callable[..., Any],
        *args: int,
    ) -> Any:
        """``function(handle, *args)``, or None when the metric is skipped (see the module)."""
        if metric in gpu.unsupported:
            return None
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

    # --- threads ---------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            try:
                readings = self.read_once(now)
            except Exception:
                log.exception("reading the GPUs failed; trying again in %.1f s", self._interval_s)
                readings = {}
            if self._stop.is_set():
                return  # a reading that outlived stop() is not delivered
            if self._on_reading is None:
                for source, samples in readings.items():
                    self._deliver(source, samples, now)
            elif readings:
                try:
                    self._on_reading(readings, now)
                except Exception:
                    log.exception("the GPU readings' receiver raised; a reading is dropped")
            self._stop.wait(self._interval_s)

    def _deliver(self, source: str, samples: list[Sample], now: float) -> None:
        try:
            self._on_samples(source, samples, now)
        except Exception:
            log.exception("the GPU samples' receiver raised; samples of %s dropped", source)

    def _xid_loop(self) -> None:
        probe = self._probe
        assert probe is not None
        try:
            event_set = probe.nvmlEventSetCreate()
        except Exception as exc:
            log.warning("no XID events (NVML event set: %s)", exc)
            return
        try:
            by_address = self._register_xids(probe, event_set)
            if by_address:
                self._wait_for_xids(probe, event_set, by_address)
            else:
                log.info("no GPU reports XID events: none will be seen")
        finally:
            try:
                probe.nvmlEventSetFree(event_set)
            except Exception as exc:
                log.debug("freeing the NVML event set: %s", exc)

    def _register_xids(self, probe: GpuProbe, event_set: Any) -> dict[int, int]:
        """Register every GPU that reports XIDs: handle address -> GPU index."""
        xid = probe.nvmlEventTypeXidCriticalError
        by_address: dict[int, int] = {}
        for gpu in self._gpus:
            try:
                if not probe.nvmlDeviceGetSupportedEventTypes(gpu.handle) & xid:
                    raise probe.NVMLError_NotSupported()
                probe.nvmlDeviceRegisterEvents(gpu.handle, xid, event_set)
            except probe.NVMLError_NotSupported:
                log.info("%s does not report XID events", gpu.source)
                continue
            except Exception as exc:
                log.warning("%s: XID events not registered (%s)", gpu.source, exc)
                continue
            by_address[address(gpu.handle)] = gpu.index
        return by_address

    def _wait_for_xids(self, probe: GpuProbe, event_set: Any, by_address: dict[int, int]) -> None:
        while not self._stop.is_set():
            now = time.time()
            try:
                event = probe.nvmlEventSetWait_v2(event_set, self._xid_wait_ms)
            except probe.NVMLError_Timeout:
                continue
            except Exception as exc:
                self._log_limited(
                    ("xid", type(exc)), now, logging.WARNING, "waiting for XIDs: %s", exc
                )
                # Not a timeout: the wait returned at once; do not spin on it.
                self._stop.wait(self._xid_wait_ms / 1000)
                continue
            if not event.eventType & probe.nvmlEventTypeXidCriticalError:
                continue
            index = by_address.get(address(event.device))
            if index is None:
                log.warning("XID %d on a GPU not watched", event.eventData)
                continue
            log.warning("%s: XID %d", gpu_source(index), event.eventData)
            self._deliver(gpu_source(index), [Sample(GPU_XID, float(event.eventData))], now)
