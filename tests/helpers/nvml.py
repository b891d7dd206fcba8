"""A fake ``pynvml`` module: scriptable GPUs for tests and benchmarks on machines without one.

An instance of ``FakeNvml`` answers every call the GPU source makes (``sentinel.gpu.monitor``)
with pynvml's own names, signatures, return types and units, and raises pynvml's REAL error
classes where the real library raises them, so the code under test takes its real paths::

    fake = FakeNvml(gpus=2)
    fake.gpus[0].util_percent = 97           # the next reading shows it
    fake.gpus[1].processes[os.getpid()] = 2 << 30
    fake.fail("nvmlDeviceGetTotalEccErrors", pynvml.NVMLError_NotSupported)  # a consumer GPU
    fake.inject_xid(0, 79)                   # wakes a thread in nvmlEventSetWait_v2
    monitor = GpuMonitor(fake, ...)

What it mimics, and how:

- ``nvmlInit``/``nvmlShutdown`` are reference counted like NVML's; any other call while not
  initialised raises ``pynvml.NVMLError_Uninitialized``, ``nvmlShutdown`` too.
- Device handles are real ``pynvml.c_nvmlDevice_t`` pointers, each to its own address, and
  ``nvmlEventSetWait_v2`` returns a real ``pynvml.c_nvmlEventData_t`` whose ``device`` is a
  new pointer object to the same address, as the real library's is: a handle is recognised
  by its address, never by ``==`` or ``is``. A handle this fake did not make raises
  ``NVMLError_InvalidArgument``.
- Memory and utilisation come back as ``pynvml.c_nvmlMemory_t`` and ``c_nvmlUtilization_t``,
  processes as ``pynvml.nvmlFriendlyObject`` with ``pid``, ``usedGpuMemory``,
  ``gpuInstanceId``, ``computeInstanceId``; power in milliwatts, clocks in MHz, names and
  UUIDs as ``str`` (pynvml decodes them).
- ``nvmlEventSetWait_v2`` really waits, on a condition variable, for up to its timeout, and
  raises ``pynvml.NVMLError_Timeout`` when no event came (a timeout of 0 too): a thread in it
  blocks as on a GPU. Event sets are real ``pynvml.c_nvmlEventSet_t`` pointers too.
- Every clock type answers (graphics, SM, memory, video), and a GPU supports every event
  type ``pynvml.nvmlEventTypeAll`` names, as a real H200 did (bench/RESULTS.md, "On a real
  GPU"; ``bench/gpu_probe.py`` prints where the fake and the real library part).

Scripting: change a ``FakeGpu``'s fields at any time (each call reads them afresh);
``fail`` makes a function raise an error class (on one GPU or all, a number of times or
until ``recover``); ``block`` makes a function hang (until ``release`` or its seconds are
up) to prove a slow driver call stalls nobody else; ``lose_gpu`` makes every call on a GPU
raise ``NVMLError_GpuIsLost``; ``library_missing=True`` makes ``nvmlInit`` raise
``NVMLError_LibraryNotFound`` as on a machine without the driver. ``lacks`` names functions
that this binding does not have, as in an older or newer nvidia-ml-py (reading one raises
``AttributeError``, as on the module); a driver that lacks a function the binding has is
``fail(name, pynvml.NVMLError_FunctionNotFound)``. ``calls`` counts the calls made by name.
Every method is thread-safe.
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import pynvml
import pytest

#: The event types a fake GPU supports unless told otherwise: all of them (0xff9f), what
#: ``nvmlDeviceGetSupportedEventTypes`` answered on an H200 (driver 580.159.04).
DEFAULT_EVENT_TYPES = pynvml.nvmlEventTypeAll

#: Functions ``fail`` and ``block`` accept: every NVML call this fake answers.
FUNCTIONS = frozenset(
    {
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlEventSetCreate",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlEventSetWait_v2",
        "nvmlEventSetFree",
    }
)


#: Functions that only some nvidia-ml-py versions have: what ``FakeNvml(lacks=...)`` accepts.
#: The clock event reasons call is the throttle reasons call renamed; newer bindings keep
#: the old name as a deprecated alias, to be removed with CUDA 14.
VERSIONED_FUNCTIONS = frozenset(
    {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"}
)


class _Versioned:
    """A device method some bindings lack: on a ``FakeNvml`` that ``lacks`` it, AttributeError."""

    def __init__(self, function: Callable[[FakeNvml, Any], int]) -> None:
        self._function = function
        self._name = function.__name__

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> _Versioned: ...
    @overload
    def __get__(self, instance: FakeNvml, owner: type | None = None) -> Callable[[Any], int]: ...
    def __get__(self, instance: FakeNvml | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        if self._name in instance.lacks:
            raise AttributeError(f"module 'pynvml' has no attribute '{self._name}'")
        return self._function.__get__(instance, owner)


@dataclass
class FakeGpu:
    """One fake GPU's state, in NVML's units; change any field between readings."""

    name: str = "NVIDIA H100 80GB HBM3"
    #: Filled in by ``FakeNvml`` when left empty (``GPU-00000000-...-<index>``).
    uuid: str = ""
    util_percent: int = 0
    mem_util_percent: int = 0
    mem_total_bytes: int = 80 * 2**30
    #: Memory in use as ``nvmlDeviceGetMemoryInfo`` (v1) counts it: the driver's reserve
    #: included, so a real GPU never reads 0 (an idle H200 read 615 MiB with no process).
    mem_used_bytes: int = 0
    #: The driver's share of ``mem_used_bytes``, which the v2 call reports apart.
    mem_reserved_bytes: int = 0
    temp_c: int = 35
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    #: The SM clock; the graphics and video clocks read the same, as an H200's did.
    sm_clock_mhz: int = 1980
    #: The memory clock (an H100's HBM3 runs at 2619 MHz; an H200's read 3201).
    mem_clock_mhz: int = 2619
    #: ``nvmlClocksEventReason*`` bits: why the clocks are held down now. A real GPU with no
    #: CUDA context on it reads 0x1 (GpuIdle) and drops its clocks (345-780 MHz on an H200);
    #: with a context, busy or not, 0 at full clocks.
    clock_event_reasons: int = 0
    #: Volatile ECC counts (since the driver loaded); aggregate counts read the same.
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    #: Compute processes on the GPU: pid -> GPU memory it uses, bytes.
    processes: dict[int, int] = field(default_factory=dict)
    supported_event_types: int = DEFAULT_EVENT_TYPES


class FakeEventSet:
    """An event set's state; ``nvmlEventSetCreate`` returns a ``c_nvmlEventSet_t`` to it."""

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}  # GPU index -> event types
        self.pending: deque[tuple[int, int, int]] = deque()  # (index, event type, data)
        self.freed = False
        # One byte: what the pointer handed out points at (its address names the set).
        self.memory = ctypes.create_string_buffer(1)
        self.pointer = ctypes.cast(self.memory, pynvml.c_nvmlEventSet_t)


@dataclass
class _Failure:
    function: str
    error: type[Exception]
    gpu: int | None
    remaining: int | None


@dataclass
class _Block:
    function: str
    seconds: float
    gpu: int | None


class FakeNvml:
    """A stand-in for the ``pynvml`` module with scriptable GPUs (see the module's docstring)."""

    # The real error classes and constants, so code that takes them from its probe works.
    NVMLError: type[Exception] = pynvml.NVMLError
    NVMLError_Uninitialized: type[Exception] = pynvml.NVMLError_Uninitialized
    NVMLError_NotSupported: type[Exception] = pynvml.NVMLError_NotSupported
    NVMLError_NoPermission: type[Exception] = pynvml.NVMLError_NoPermission
    NVMLError_DriverNotLoaded: type[Exception] = pynvml.NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound: type[Exception] = pynvml.NVMLError_LibraryNotFound
    NVMLError_GpuIsLost: type[Exception] = pynvml.NVMLError_GpuIsLost
    NVMLError_Timeout: type[Exception] = pynvml.NVMLError_Timeout
    NVMLError_FunctionNotFound: type[Exception] = pynvml.NVMLError_FunctionNotFound
    NVMLError_Unknown: type[Exception] = pynvml.NVMLError_Unknown
    NVMLError_InvalidArgument: type[Exception] = pynvml.NVMLError_InvalidArgument
    NVML_TEMPERATURE_GPU: int = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM: int = pynvml.NVML_CLOCK_SM
    NVML_MEMORY_ERROR_TYPE_CORRECTED: int = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC: int = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC: int = pynvml.NVML_AGGREGATE_ECC
    nvmlEventTypeXidCriticalError: int = pynvml.nvmlEventTypeXidCriticalError

    def __init__(
        self,
        gpus: int | Sequence[FakeGpu] = 1,
        *,
        library_missing: bool = False,
        lacks: Iterable[str] = (),
    ):
        """``gpus``: how many default GPUs, or the GPUs themselves (index = position).

        ``lacks``: functions of ``VERSIONED_FUNCTIONS`` this binding does not have.
        """
        self.lacks = frozenset(lacks)
        unknown = self.lacks - VERSIONED_FUNCTIONS
        if unknown:
            raise ValueError(f"only {sorted(VERSIONED_FUNCTIONS)} can be lacking: {unknown}")
        self.gpus: list[FakeGpu] = (
            [FakeGpu() for _ in range(gpus)] if isinstance(gpus, int) else list(gpus)
        )
        for index, gpu in enumerate(self.gpus):
            if not gpu.uuid:
                gpu.uuid = f"GPU-00000000-0000-0000-0000-{index:012d}"
        self.library_missing = library_missing
        #: Calls made so far, by function name (failed and blocked ones included).
        self.calls: Counter[str] = Counter()
        #: Set when a call starts hanging in a ``block``; cleared by ``release``.
        self.blocking = threading.Event()
        self._lock = threading.Lock()
        self._events = threading.Condition(self._lock)
        self._init_count = 0
        self._failures: list[_Failure] = []
        self._blocks: list[_Block] = []
        self._released = threading.Event()
        self._lost: set[int] = set()
        self._event_sets: list[FakeEventSet] = []
        # One byte each: what matters is that every handle points at an address of its own.
        self._handle_memory = [ctypes.create_string_buffer(1) for _ in self.gpus]
        self._index_by_address = {
            ctypes.addressof(memory): index for index, memory in enumerate(self._handle_memory)
        }

    # --- scripting -------------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        """Whether NVML is initialised (``nvmlInit`` calls outnumber ``nvmlShutdown`` ones)."""
        with self._lock:
            return self._init_count > 0

    def fail(
        self,
        function_name: str,
        error_class: type[Exception],
        gpu: int | None = None,
        times: int | None = None,
    ) -> None:
        """Make ``function_name`` raise ``error_class()`` on GPU ``gpu`` (None: any call).

        ``times``: for that many calls, then behave again; None: until ``recover``. The
        first matching rule set applies; a failing call is still counted in ``calls``.
        """
        _check_function(function_name)
        with self._lock:
            self._failures.append(_Failure(function_name, error_class, gpu, times))

    def recover(self, function_name: str | None = None) -> None:
        """Drop the failures set on ``function_name`` (None: every failure)."""
        with self._lock:
            self._failures = [f for f in self._failures if function_name not in (None, f.function)]

    def block(self, function_name: str, seconds: float, gpu: int | None = None) -> None:
        """Make each call of ``function_name`` (on ``gpu``, None: any) hang ``seconds``.

        A hanging call holds no lock of the fake: other threads' calls go on. ``release``
        ends every hang at once and removes the blocks.
        """
        _check_function(function_name)
        with self._lock:
            self._released.clear()
            self._blocks.append(_Block(function_name, seconds, gpu))

    def release(self) -> None:
        """End every hanging call now and remove every block."""
        with self._lock:
            self._blocks.clear()
            self.blocking.clear()
            self._released.set()

    def lose_gpu(self, index: int) -> None:
        """From now on every call on GPU ``index`` raises ``NVMLError_GpuIsLost`` (XID 79)."""
        with self._lock:
            self._lost.add(index)

    def inject_xid(self, index: int, xid: int) -> int:
        """An XID critical error on GPU ``index``: one event to every set registered for it.

        Returns how many event sets got it (0 when none was registered for XIDs on it).
        """
        return self._post_event(index, pynvml.nvmlEventTypeXidCriticalError, xid)

    def registered_event_types(self, index: int) -> int:
        """The event types some live event set waits for on GPU ``index`` (0: none)."""
        with self._lock:
            types = 0
            for event_set in self._event_sets:
                if not event_set.freed:
                    types |= event_set.registered.get(index, 0)
            return types

    def _post_event(self, index: int, event_type: int, data: int) -> int:
        with self._events:
            delivered = 0
            for event_set in self._event_sets:
                if not event_set.freed and event_set.registered.get(index, 0) & event_type:
                    event_set.pending.append((index, event_type, data))
                    delivered += 1
            self._events.notify_all()
            return delivered

    # --- pynvml's API ----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", needs_init=False)
        if self.library_missing:
            raise pynvml.NVMLError_LibraryNotFound()
        with self._lock:
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        with self._lock:
            self._init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        self._check_device("nvmlDeviceGetHandleByIndex", index)
        return ctypes.cast(self._handle_memory[index], pynvml.c_nvmlDevice_t)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_percent, memory=gpu.mem_util_percent)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        """v1 (no ``version``): ``used`` counts the driver's reserve; v2 reports it apart."""
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        used = gpu.mem_used_bytes
        free = max(gpu.mem_total_bytes - used, 0)
        if not version:
            return pynvml.c_nvmlMemory_t(total=gpu.mem_total_bytes, free=free, used=used)
        reserved = min(gpu.mem_reserved_bytes, used)
        return pynvml.c_nvmlMemory_v2_t(
            version=version,
            total=gpu.mem_total_bytes,
            reserved=reserved,
            free=free,
            used=used - reserved,
        )

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.temp_c

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        clocks = {
            pynvml.NVML_CLOCK_GRAPHICS: gpu.sm_clock_mhz,
            pynvml.NVML_CLOCK_SM: gpu.sm_clock_mhz,
            pynvml.NVML_CLOCK_MEM: gpu.mem_clock_mhz,
            pynvml.NVML_CLOCK_VIDEO: gpu.sm_clock_mhz,
        }
        if type not in clocks:
            raise pynvml.NVMLError_InvalidArgument()
        return clocks[type]

    @_Versioned
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_event_reasons

    @_Versioned
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        """The same bitmask under the name it had before the rename."""
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        if counterType not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            raise pynvml.NVMLError_InvalidArgument()
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return gpu.ecc_uncorrected
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return gpu.ecc_corrected
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for pid, used in list(gpu.processes.items())
        ]

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        event_set = FakeEventSet()
        with self._lock:
            self._event_sets.append(event_set)
        return event_set.pointer

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        event_set = self._event_set(eventSet)
        if eventTypes & ~gpu.supported_event_types:
            raise pynvml.NVMLError_NotSupported()
        index = self.gpus.index(gpu)
        with self._lock:
            event_set.registered[index] = event_set.registered.get(index, 0) | eventTypes

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetSupportedEventTypes", handle).supported_event_types

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        event_set = self._event_set(eventSet)
        with self._events:
            self._events.wait_for(
                lambda: bool(event_set.pending) or event_set.freed, timeout=timeoutms / 1000
            )
            if event_set.freed:
                raise pynvml.NVMLError_InvalidArgument()
            if not event_set.pending:
                raise pynvml.NVMLError_Timeout()
            index, event_type, data = event_set.pending.popleft()
        event = pynvml.c_nvmlEventData_t()
        event.device = ctypes.cast(self._handle_memory[index], pynvml.c_nvmlDevice_t)
        event.eventType = event_type
        event.eventData = data
        event.gpuInstanceId = 0xFFFFFFFF
        event.computeInstanceId = 0xFFFFFFFF
        return event

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        event_set = self._event_set(eventSet)
        with self._events:
            event_set.freed = True
            self._event_sets.remove(event_set)
            self._events.notify_all()

    # --- plumbing --------------------------------------------------------------------------

    def _gpu(self, function: str, handle: Any) -> FakeGpu:
        """Enter a device call: the GPU ``handle`` points at, after failures and blocks."""
        self._enter(function)
        index = self._index_of(handle)
        self._check_device(function, index)
        return self.gpus[index]

    def _enter(self, function: str, *, needs_init: bool = True) -> None:
        """Count the call, hang where blocked, raise where failing for any GPU."""
        with self._lock:
            self.calls[function] += 1
            if needs_init and self._init_count <= 0:
                raise pynvml.NVMLError_Uninitialized()
        self._apply_script(function, None)

    def _check_device(self, function: str, index: int) -> None:
        self._apply_script(function, index)
        with self._lock:
            if index in self._lost:
                raise pynvml.NVMLError_GpuIsLost()

    def _apply_script(self, function: str, index: int | None) -> None:
        with self._lock:
            block = next(
                (b for b in self._blocks if b.function == function and b.gpu == index), None
            )
        if block is not None:
            self.blocking.set()
            # Outside the lock: a hanging call must not hang the other threads' calls.
            self._released.wait(block.seconds)
        with self._lock:
            for failure in self._failures:
                if failure.function == function and failure.gpu == index:
                    if failure.remaining is not None:
                        failure.remaining -= 1
                        if failure.remaining <= 0:
                            self._failures.remove(failure)
                    raise failure.error()

    def _event_set(self, pointer: Any) -> FakeEventSet:
        """The live set a ``c_nvmlEventSet_t`` points at; a freed or foreign one is invalid.

        (Real NVML's answer to a freed set is undefined; it is never asked.)
        """
        if isinstance(pointer, pynvml.c_nvmlEventSet_t):
            address = ctypes.cast(pointer, ctypes.c_void_p).value
            with self._lock:
                for event_set in self._event_sets:
                    if ctypes.addressof(event_set.memory) == address:
                        return event_set
        raise pynvml.NVMLError_InvalidArgument()

    def _index_of(self, handle: Any) -> int:
        if not isinstance(handle, pynvml.c_nvmlDevice_t):
            raise pynvml.NVMLError_InvalidArgument()
        address = ctypes.cast(handle, ctypes.c_void_p).value
        index = self._index_by_address.get(address or 0)
        if index is None:
            raise pynvml.NVMLError_InvalidArgument()
        return index


def _check_function(function_name: str) -> None:
    if function_name not in FUNCTIONS:
        raise ValueError(f"FakeNvml does not answer {function_name!r}; one of {sorted(FUNCTIONS)}")


if TYPE_CHECKING:
    from sentinel.gpu.nvml import GpuProbe

    _satisfies_probe: GpuProbe = FakeNvml()


def real_nvml_or_skip() -> None:
    """Skip the calling test, naming why, unless the real NVML answers (a GPU and its driver)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"needs an NVIDIA GPU with NVML (none found: {exc})")
    pynvml.nvmlShutdown()
