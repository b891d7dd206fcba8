"""The NVML calls sentinel makes (``GpuProbe``), and small helpers around them.

The real ``pynvml`` module satisfies ``GpuProbe``; so does ``tests.helpers.nvml.FakeNvml``,
which is how the tests drive the very code that reads a real GPU.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: The clock event reasons call, and its name before NVML renamed it (throttle reasons;
#: deprecated, to be removed from the bindings with CUDA 14).
CLOCK_EVENTS_CALL = "nvmlDeviceGetCurrentClocksEventReasons"
THROTTLE_REASONS_CALL = "nvmlDeviceGetCurrentClocksThrottleReasons"


class GpuProbe(Protocol):
    """The part of the ``pynvml`` module the GPU source uses; the module itself is one.

    ``tests.helpers.nvml.FakeNvml`` is another. Handles and event sets are opaque.
    """

    NVMLError: type[Exception]
    NVMLError_NotSupported: type[Exception]
    NVMLError_NoPermission: type[Exception]
    NVMLError_DriverNotLoaded: type[Exception]
    NVMLError_LibraryNotFound: type[Exception]
    NVMLError_GpuIsLost: type[Exception]
    NVMLError_Timeout: type[Exception]
    NVMLError_FunctionNotFound: type[Exception]
    NVML_TEMPERATURE_GPU: int
    NVML_CLOCK_SM: int
    NVML_MEMORY_ERROR_TYPE_CORRECTED: int
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int
    NVML_VOLATILE_ECC: int
    nvmlEventTypeXidCriticalError: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any, /) -> str: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any, /) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int, /) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int, /) -> int: ...
    # nvidia-ml-py from before the rename has only nvmlDeviceGetCurrentClocksThrottleReasons:
    # see ``ClockEventsCall``.
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, /) -> int: ...
    def nvmlDeviceGetTotalEccErrors(
        self, handle: Any, error_type: int, counter_type: int, /
    ) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any, /) -> list[Any]: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(
        self, handle: Any, event_types: int, event_set: Any, /
    ) -> None: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any, /) -> int: ...
    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int, /) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any, /) -> None: ...


def attribute(
    mode: str, pids: dict[int, frozenset[int] | None], job: frozenset[int]
) -> dict[int, bool]:
    """Which GPUs are the job's (``[gpu] attribution``), from the pids on each (None: unknown)
    and the job's pids ``job``."""
    if mode == "all":
        return dict.fromkeys(pids, True)
    owned = {index: bool(on_gpu and on_gpu & job) for index, on_gpu in pids.items()}
    if mode == "auto" and not any(owned.values()):
        # A container's own PID namespace hides the job's pids from NVML: the GPUs this
        # sidecar reads are then the job's (those its environment names, when it does).
        return dict.fromkeys(pids, True)
    return owned


def runtime_devices(value: str | None) -> frozenset[str] | None:
    """The GPU UUIDs an ``NVIDIA_VISIBLE_DEVICES`` value names; None for ``all``, ``none``,
    ``void``, indexes (the node's numbering, not NVML's here) or no value."""
    if not value:
        return None
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    if not entries or not all(entry.startswith("GPU-") for entry in entries):
        return None
    return frozenset(entries)


def shutdown(probe: GpuProbe) -> None:
    try:
        probe.nvmlShutdown()
    except Exception as exc:
        log.debug("nvmlShutdown: %s", exc)


def address(handle: Any) -> int:
    """What identifies a device handle: the address it points at (a new object each time)."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def parse_visible(value: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` entries, up to the first that CUDA would reject too."""
    if value is None:
        return None
    entries: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if entry.isdigit():
            entries.append(str(int(entry)))
        elif entry.startswith("GPU-"):
            entries.append(entry)
        elif entry.startswith("MIG-"):
            # MIG instances have no NVML index of their own here: watch every GPU.
            log.info("CUDA_VISIBLE_DEVICES names MIG devices: watching every GPU")
            return None
        else:
            break
    return entries


def is_wanted(probe: GpuProbe, handle: Any, index: int, wanted: list[str]) -> bool:
    if str(index) in wanted:
        return True
    uuids = [entry for entry in wanted if entry.startswith("GPU-")]
    if not uuids:
        return False
    uuid = probe.nvmlDeviceGetUUID(handle)
    return any(uuid.startswith(entry) for entry in uuids)


class ClockEventsCall:
    """Reads a GPU's clock event reasons with whichever name this NVML has.

    Bindings from before the rename lack ``nvmlDeviceGetCurrentClocksEventReasons``;
    newer bindings over a driver from before it raise ``NVMLError_FunctionNotFound``
    from it. Both still have ``nvmlDeviceGetCurrentClocksThrottleReasons``, which
    answers the same bitmask: the call falls back to it, once and for good. With
    neither, it raises ``NVMLError_NotSupported`` like a GPU that cannot tell.
    """

    def __init__(self, probe: GpuProbe) -> None:
        self._probe = probe
        self._older: Callable[[Any], int] | None = getattr(probe, THROTTLE_REASONS_CALL, None)
        self._call: Callable[[Any], int] | None = getattr(probe, CLOCK_EVENTS_CALL, None)
        if self._call is None:
            self._use_older(f"this nvidia-ml-py has no {CLOCK_EVENTS_CALL}")

    def __call__(self, handle: Any) -> int:
        call = self._call
        if call is None:
            raise self._probe.NVMLError_NotSupported()
        try:
            return call(handle)
        except self._probe.NVMLError_FunctionNotFound:
            if call is self._older:
                raise
            self._use_older(f"the NVML driver library has no {CLOCK_EVENTS_CALL}")
            return self(handle)

    def _use_older(self, why: str) -> None:
        self._call = self._older
        if self._older is None:
            log.info("%s, nor %s: clock events are not read", why, THROTTLE_REASONS_CALL)
        else:
            log.info("%s: reading clock events with %s", why, THROTTLE_REASONS_CALL)


class LimitedLog:
    """Logs a message once per key, then at most every ``repeat_s`` with the count missed."""

    def __init__(self, logger: logging.Logger, repeat_s: float) -> None:
        self._logger = logger
        self._repeat_s = repeat_s
        self._last: dict[tuple[object, ...], tuple[float, int]] = {}

    def __call__(
        self,
        key: tuple[object, ...],
        now: float,
        level: int,
        message: str,
        *args: object,
        exc_info: bool = False,
    ) -> None:
        """Log ``message % args`` for ``key`` at ``now`` unless it was logged too recently."""
        last = self._last.get(key)
        if last is not None and now - last[0] < self._repeat_s:
            self._last[key] = (last[0], last[1] + 1)
            return
        if last is not None and last[1]:
            message += " (and %d more times since)"
            args = (*args, last[1])
        self._last[key] = (now, 0)
        self._logger.log(level, message, *args, exc_info=exc_info)
