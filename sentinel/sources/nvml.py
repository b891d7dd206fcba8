"""The NVML calls sentinel makes (``GpuProbe``), and small helpers around them.

The real ``pynvml`` module satisfies ``GpuProbe``; so does ``sentinel.testing.nvml.FakeNvml``,
which is how the tests drive the very code that reads a real GPU.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)


class GpuProbe(Protocol):
    """The part of the ``pynvml`` module the GPU source uses; the module itself is one.

    ``sentinel.testing.nvml.FakeNvml`` is another. Handles and event sets are opaque.
    """

    NVMLError: type[Exception]
    NVMLError_NotSupported: type[Exception]
    NVMLError_NoPermission: type[Exception]
    NVMLError_DriverNotLoaded: type[Exception]
    NVMLError_LibraryNotFound: type[Exception]
    NVMLError_GpuIsLost: type[Exception]
    NVMLError_Timeout: type[Exception]
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
