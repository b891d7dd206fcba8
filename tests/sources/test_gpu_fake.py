"""FakeNvml answers as the real library did on a real GPU (an H200, driver 580.159.04).

The fast tests pin what bench/gpu_probe.py saw the real library do where the fake used to
part from it (bench/RESULTS.md, "On a real GPU"); the ``gpu`` test makes the same calls on
the real library and on the fake and compares what each returned or raised, so the next
driver that differs shows up where a GPU is lent.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from tests.helpers.nvml import FakeNvml, real_nvml_or_skip

CLOCKS = (
    pynvml.NVML_CLOCK_GRAPHICS,
    pynvml.NVML_CLOCK_SM,
    pynvml.NVML_CLOCK_MEM,
    pynvml.NVML_CLOCK_VIDEO,
)


def test_every_clock_type_answers_and_an_unknown_one_is_an_invalid_argument() -> None:
    fake = FakeNvml()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.gpus[0].sm_clock_mhz, fake.gpus[0].mem_clock_mhz = 780, 3201

    clocks = [fake.nvmlDeviceGetClockInfo(handle, clock) for clock in CLOCKS]

    assert clocks == [780, 780, 3201, 780]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_COUNT)


def test_memory_v1_counts_the_drivers_reserve_as_used_and_v2_reports_it_apart() -> None:
    # What an H200 read with one process holding 900 MiB (bench/results/gpu-2026-11-26).
    fake = FakeNvml()
    fake.gpus[0].mem_used_bytes, fake.gpus[0].mem_reserved_bytes = 1_597_898_752, 644_939_776
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)

    v1 = fake.nvmlDeviceGetMemoryInfo(handle)
    v2 = fake.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)

    assert isinstance(v1, pynvml.c_nvmlMemory_t)
    assert isinstance(v2, pynvml.c_nvmlMemory_v2_t)
    assert (v1.used, v2.used, v2.reserved) == (1_597_898_752, 952_958_976, 644_939_776)
    assert v1.free == v2.free == v1.total - v1.used


def test_an_event_set_is_a_pointer_that_waits_registers_and_frees_by_address() -> None:
    fake = FakeNvml()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    event_set = fake.nvmlEventSetCreate()
    assert isinstance(event_set, pynvml.c_nvmlEventSet_t)
    assert fake.nvmlDeviceGetSupportedEventTypes(handle) == pynvml.nvmlEventTypeAll

    xid = pynvml.nvmlEventTypeXidCriticalError
    # A new pointer object to the same address is the same set, as with the real library.
    fake.nvmlDeviceRegisterEvents(handle, xid, ctypes.cast(event_set, pynvml.c_nvmlEventSet_t))
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(event_set, 0)
    assert fake.inject_xid(0, 48) == 1
    assert fake.nvmlEventSetWait_v2(event_set, 0).eventData == 48

    fake.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlEventSetWait_v2(event_set, 0)
    stranger = ctypes.cast(ctypes.create_string_buffer(1), pynvml.c_nvmlEventSet_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceRegisterEvents(handle, xid, stranger)


def _answer(call: Callable[[], Any]) -> str:
    """What a call did, as a type or an error class: values differ between GPUs."""
    try:
        value = call()
    except pynvml.NVMLError as exc:
        return f"raised {type(exc).__name__}"
    if isinstance(value, list):
        return f"list of {sorted({type(item).__name__ for item in value})}"
    return type(value).__name__


def _answers(nv: Any) -> dict[str, str]:
    out = {"before init": _answer(nv.nvmlDeviceGetCount)}
    nv.nvmlInit()
    try:
        out["bad index"] = _answer(lambda: nv.nvmlDeviceGetHandleByIndex(1 << 20))
        h = nv.nvmlDeviceGetHandleByIndex(0)
        calls: dict[str, Callable[[], Any]] = {
            "handle": lambda: h,
            "uuid": lambda: nv.nvmlDeviceGetUUID(h),
            "util": lambda: nv.nvmlDeviceGetUtilizationRates(h),
            "memory": lambda: nv.nvmlDeviceGetMemoryInfo(h),
            "memory v2": lambda: nv.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2),
            "temperature": lambda: nv.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
            "power limit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
            "clock events": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
            "ecc": lambda: nv.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            ),
            "processes": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
            "event types": lambda: nv.nvmlDeviceGetSupportedEventTypes(h),
        }
        out |= {name: _answer(call) for name, call in calls.items()}
        for clock in CLOCKS:
            out[f"clock {clock}"] = _answer(lambda: nv.nvmlDeviceGetClockInfo(h, clock))  # noqa: B023
        event_set = nv.nvmlEventSetCreate()
        out["event set"] = type(event_set).__name__
        xid = pynvml.nvmlEventTypeXidCriticalError
        out["register xid"] = _answer(lambda: nv.nvmlDeviceRegisterEvents(h, xid, event_set))
        out["wait 0 ms"] = _answer(lambda: nv.nvmlEventSetWait_v2(event_set, 0))
        out["free"] = _answer(lambda: nv.nvmlEventSetFree(event_set))
    finally:
        nv.nvmlShutdown()
    out["after shutdown"] = _answer(nv.nvmlDeviceGetCount)
    return out


@pytest.mark.gpu
def test_the_fake_answers_each_call_as_the_real_library_does() -> None:
    real_nvml_or_skip()

    real, fake = _answers(pynvml), _answers(FakeNvml())

    assert {k: v for k, v in real.items() if fake[k] != v} == {}, fake
