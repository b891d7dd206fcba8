"""GPU source: the enforced power limit is read once per ``POWER_LIMIT_REREAD_S``, and
every reading in between carries the last value read (through FakeNvml)."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from sentinel.gpu.monitor import GpuMonitor
from sentinel.gpu.reading import POWER_LIMIT_REREAD_S
from sentinel.model.machine import GPU_POWER_LIMIT
from tests.helpers.nvml import FakeNvml

NOW = 1_700_000_000.0
CALL = "nvmlDeviceGetEnforcedPowerLimit"
GPUS = 2


@pytest.fixture
def opened() -> Iterator[tuple[FakeNvml, GpuMonitor]]:
    """Two fake GPUs with a 700 W limit, NVML open, no thread."""
    fake = FakeNvml(gpus=GPUS)
    for gpu in fake.gpus:
        gpu.power_limit_mw = 700_000
    gpus = GpuMonitor(
        fake, interval_s=3600.0, on_samples=lambda *_: None, job_pids=lambda: frozenset()
    )
    assert gpus.open()
    yield fake, gpus
    gpus.stop()


def limits(gpus: GpuMonitor, now: float) -> list[float]:
    """The power limit of every GPU in one reading at ``now`` (one entry per GPU sending it)."""
    return [
        sample.value
        for samples in gpus.read_once(now).values()
        for sample in samples
        if sample.name == GPU_POWER_LIMIT
    ]


def test_readings_within_the_interval_ask_nvml_once_and_all_carry_the_limit(
    opened: tuple[FakeNvml, GpuMonitor],
) -> None:
    fake, gpus = opened
    seen = [limits(gpus, NOW + offset_s) for offset_s in (0.0, 1.0, POWER_LIMIT_REREAD_S - 1)]
    assert seen == [[700.0] * GPUS] * 3
    assert fake.calls[CALL] == GPUS


@pytest.mark.parametrize(
    ("later_s", "expected_w"),
    [(POWER_LIMIT_REREAD_S - 1, 700.0), (POWER_LIMIT_REREAD_S, 450.0), (-10.0, 450.0)],
    ids=["within-interval-keeps-last", "after-interval-reads-again", "clock-set-back-reads-again"],
)
def test_a_changed_limit_shows_once_the_interval_has_passed(
    opened: tuple[FakeNvml, GpuMonitor], later_s: float, expected_w: float
) -> None:
    fake, gpus = opened
    limits(gpus, NOW)
    fake.gpus[0].power_limit_mw = 450_000  # nvidia-smi -pl 450
    assert limits(gpus, NOW + later_s)[0] == expected_w


def test_a_failed_reread_keeps_the_last_value_and_is_tried_at_the_next_poll(
    opened: tuple[FakeNvml, GpuMonitor],
) -> None:
    fake, gpus = opened
    limits(gpus, NOW)
    fake.gpus[0].power_limit_mw = 450_000
    fake.fail(CALL, pynvml.NVMLError_Unknown, gpu=0, times=1)
    later = NOW + POWER_LIMIT_REREAD_S
    assert limits(gpus, later)[0] == 700.0
    assert limits(gpus, later + 1.0)[0] == 450.0


def test_a_gpu_without_a_power_limit_sends_none(opened: tuple[FakeNvml, GpuMonitor]) -> None:
    fake, gpus = opened
    fake.fail(CALL, pynvml.NVMLError_NotSupported, gpu=1)
    readings = gpus.read_once(NOW)
    assert GPU_POWER_LIMIT not in {sample.name for sample in readings["gpu:1"]}
    assert GPU_POWER_LIMIT in {sample.name for sample in readings["gpu:0"]}
