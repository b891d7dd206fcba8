"""The GPU source across NVML versions: clock event reasons before and after the rename.

nvidia-ml-py renamed ``nvmlDeviceGetCurrentClocksThrottleReasons`` to
``nvmlDeviceGetCurrentClocksEventReasons``. An older binding lacks the new name; a newer
binding over an older driver has it, but the driver library lacks the function behind it
(``NVMLError_FunctionNotFound``). Both are driven through FakeNvml.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pynvml
import pytest

from sentinel.gpu.monitor import GpuMonitor
from sentinel.model.machine import GPU_CLOCK_EVENTS, GPU_TEMP
from sentinel.model.records import Sample
from tests.helpers.nvml import FakeNvml

NOW = 1_700_000_000.0
NEW = "nvmlDeviceGetCurrentClocksEventReasons"
OLD = "nvmlDeviceGetCurrentClocksThrottleReasons"
THERMAL = 0x20 | 0x40


def opened(fake: FakeNvml) -> GpuMonitor:
    gpus = GpuMonitor(
        fake, interval_s=3600.0, on_samples=lambda *_: None, job_pids=frozenset, xid_events=False
    )
    assert gpus.open()
    return gpus


def clock_events(readings: dict[str, list[Sample]]) -> list[float]:
    return [s.value for s in readings["gpu:0"] if s.name == GPU_CLOCK_EVENTS]


def driver_without_new_call() -> FakeNvml:
    fake = FakeNvml()
    fake.fail(NEW, pynvml.NVMLError_FunctionNotFound)
    return fake


@pytest.mark.parametrize(
    ("make_fake", "reads"),
    [
        (FakeNvml, NEW),
        (lambda: FakeNvml(lacks=[NEW]), OLD),
        (driver_without_new_call, OLD),
        (lambda: FakeNvml(lacks=[OLD]), NEW),
    ],
    ids=["current", "binding-before-rename", "driver-before-rename", "binding-after-removal"],
)
def test_clock_events_are_read_under_the_name_this_nvml_has(
    make_fake: Callable[[], FakeNvml], reads: str
) -> None:
    fake = make_fake()
    fake.gpus[0].clock_event_reasons = THERMAL
    gpus = opened(fake)
    try:
        first, second = gpus.read_once(NOW), gpus.read_once(NOW + 1)
    finally:
        gpus.stop()
    assert clock_events(first) == clock_events(second) == [float(THERMAL)]
    assert fake.calls[reads] == 2


def test_a_driver_without_the_new_call_is_asked_for_it_once() -> None:
    fake = driver_without_new_call()
    gpus = opened(fake)
    try:
        for second in range(3):
            gpus.read_once(NOW + second)
    finally:
        gpus.stop()
    assert fake.calls[NEW] == 1


def test_without_either_call_clock_events_are_dropped_and_the_rest_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="sentinel.gpu")
    fake = FakeNvml(lacks=[NEW, OLD])
    gpus = opened(fake)
    try:
        readings = gpus.read_once(NOW)
        gpus.read_once(NOW + 1)
    finally:
        gpus.stop()
    assert clock_events(readings) == []
    assert [s.value for s in readings["gpu:0"] if s.name == GPU_TEMP] == [35.0]
    told = [r.getMessage() for r in caplog.records if "clock events" in r.getMessage()]
    assert len(told) == 1


def test_fake_lacks_only_the_versioned_functions() -> None:
    with pytest.raises(ValueError, match="can be lacking"):
        FakeNvml(lacks=["nvmlDeviceGetTemperature"])
