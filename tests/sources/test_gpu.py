"""GPU source: readings, NVML's errors, XIDs, attribution; through FakeNvml, and real NVML."""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pynvml
import pytest

from sentinel.gpu.monitor import GpuMonitor
from sentinel.gpu.nvml import runtime_devices
from sentinel.gpu.reading import REPEAT_LOG_S, Attribution
from sentinel.gpu.settings import GpuConfig
from sentinel.model.machine import (
    CLOCK_EVENTS_THERMAL,
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
from sentinel.process.identity import ProcessIdentity
from sentinel.process.settings import ProcessConfig
from sentinel.process.system import SystemSources
from tests.helpers.nvml import FakeNvml, real_nvml_or_skip

NOW = 1_700_000_000.0
#: The GPU source's loggers: the monitor, its reading and its XID thread.
LOGGERS = frozenset({"sentinel.gpu.monitor", "sentinel.gpu.reading", "sentinel.gpu.xid"})

DEADLINE_S = 10.0


def from_gpu_source(record: logging.LogRecord) -> bool:
    """Logged by the GPU source's package (the monitor, its reading or its XID thread)."""
    return record.name in LOGGERS


class Received:
    """What ``on_samples`` was handed, from any thread, with waiting on a condition."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Sample], float]] = []
        self._changed = threading.Condition()

    def __call__(self, source: str, samples: list[Sample], now: float) -> None:
        with self._changed:
            self.calls.append((source, samples, now))
            self._changed.notify_all()

    def named(self, name: str, source: str | None = None) -> list[float]:
        with self._changed:
            return [
                s.value
                for src, samples, _ in self.calls
                if source in (None, src)
                for s in samples
                if s.name == name
            ]

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        with self._changed:
            if not self._changed.wait_for(condition, timeout=DEADLINE_S):
                raise AssertionError(f"not seen within {DEADLINE_S} s: {what}")


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {DEADLINE_S} s: {what}")
        time.sleep(0.005)


def monitor(
    fake: FakeNvml | None,
    received: Received | None = None,
    *,
    job_pids: frozenset[int] = frozenset(),
    **options: object,
) -> GpuMonitor:
    options.setdefault("interval_s", 3600.0)
    return GpuMonitor(
        fake,
        on_samples=received or Received(),
        job_pids=lambda: job_pids,
        **options,  # type: ignore[arg-type]
    )


def values(samples: list[Sample]) -> dict[str, float]:
    return {s.name: s.value for s in samples}


def gpu_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if from_gpu_source(r) and r.levelno == level]


@pytest.fixture
def opened() -> Iterator[tuple[FakeNvml, GpuMonitor]]:
    """Two fake GPUs, NVML open, no thread: ``read_once`` is called by the test."""
    fake = FakeNvml(gpus=2)
    gpus = monitor(fake)
    assert gpus.open()
    yield fake, gpus
    gpus.stop()


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A real process other than this one, for a pid on a GPU."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


# --- readings ----------------------------------------------------------------------------


def test_reading_gives_every_metric_in_sentinel_units(opened: tuple[FakeNvml, GpuMonitor]) -> None:
    fake, gpus = opened
    gpu = fake.gpus[1]
    gpu.util_percent = 87
    gpu.mem_used_bytes = 12 * 2**30
    gpu.mem_total_bytes = 80 * 2**30
    gpu.temp_c = 71
    gpu.power_mw = 312_500
    gpu.power_limit_mw = 700_000
    gpu.sm_clock_mhz = 1755
    gpu.clock_event_reasons = 0x04
    gpu.ecc_uncorrected = 2
    gpu.ecc_corrected = 5

    readings = gpus.read_once(NOW)

    assert set(readings) == {"gpu:0", "gpu:1"}
    assert values(readings["gpu:1"]) == {
        GPU_UTIL: 87.0,
        GPU_MEM_USED: 12.0 * 2**30,
        GPU_MEM_TOTAL: 80.0 * 2**30,
        GPU_TEMP: 71.0,
        GPU_POWER: 312.5,
        GPU_POWER_LIMIT: 700.0,
        GPU_SM_CLOCK: 1755.0,
        GPU_CLOCK_EVENTS: 4.0,
        GPU_ECC_UNCORRECTED: 2.0,
        GPU_ECC_CORRECTED: 5.0,
        GPU_JOB: 1.0,
    }
    assert all(s.step is None and s.time is None for s in readings["gpu:1"])


def test_throttle_episode_shows_in_successive_readings(
    opened: tuple[FakeNvml, GpuMonitor],
) -> None:
    fake, gpus = opened
    events: list[float] = []
    for reasons in (0, 0x20 | 0x40, 0x40, 0):
        fake.gpus[0].clock_event_reasons = reasons
        events.append(values(gpus.read_once(NOW)["gpu:0"])[GPU_CLOCK_EVENTS])
    assert events == [0.0, 96.0, 64.0, 0.0]
    assert [bool(int(e) & CLOCK_EVENTS_THERMAL) for e in events] == [False, True, True, False]


def test_read_once_before_open_reads_nothing() -> None:
    fake = FakeNvml()
    assert monitor(fake).read_once(NOW) == {}
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 0


@pytest.mark.parametrize(
    ("visible", "sources"),
    [
        ("1", {"gpu:1"}),
        ("2,0", {"gpu:0", "gpu:2"}),
        ("GPU-00000000-0000-0000-0000-000000000002", {"gpu:2"}),
        ("0,foo,2", {"gpu:0"}),
        ("", set()),
    ],
    ids=["index", "two-indexes", "uuid", "stops-at-invalid", "empty-hides-all"],
)
def test_visible_devices_narrow_the_gpus_read(visible: str, sources: set[str]) -> None:
    gpus = monitor(FakeNvml(gpus=3), visible_devices=visible)
    assert gpus.open()
    try:
        assert set(gpus.read_once(NOW)) == sources
        assert gpus.device_count == len(sources)
    finally:
        gpus.stop()


# --- no NVML -----------------------------------------------------------------------------


def _library_missing() -> FakeNvml:
    return FakeNvml(library_missing=True)


def _failing_init(error: type[Exception]) -> Callable[[], FakeNvml]:
    def make() -> FakeNvml:
        fake = FakeNvml()
        fake.fail("nvmlInit", error)
        return fake

    return make


@pytest.mark.parametrize(
    "make_fake",
    [
        _library_missing,
        _failing_init(pynvml.NVMLError_DriverNotLoaded),
        _failing_init(pynvml.NVMLError_NoPermission),
    ],
    ids=["library-not-found", "driver-not-loaded", "no-permission"],
)
def test_without_nvml_start_is_false_and_says_so_once(
    make_fake: Callable[[], FakeNvml], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sentinel.gpu")
    fake = make_fake()
    gpus = monitor(fake)

    assert gpus.start() is False
    gpus.stop()

    assert (gpus.available, gpus.device_count, gpus.running) == (False, 0, False)
    assert fake.calls["nvmlDeviceGetCount"] == 0
    assert [r.getMessage() for r in caplog.records if from_gpu_source(r)] == [
        f"no NVML ({fake_error(fake)}): GPU rules are off"
    ]


def fake_error(fake: FakeNvml) -> str:
    """The message of the error the fake's nvmlInit raises."""
    try:
        fake.nvmlInit()
    except pynvml.NVMLError as exc:
        return str(exc)
    raise AssertionError("nvmlInit did not fail")


def test_real_pynvml_without_a_gpu_is_off_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML: test_real_gpu covers it")
    caplog.set_level(logging.DEBUG, logger="sentinel.gpu")
    gpus = monitor(None)

    assert gpus.start() is False
    gpus.stop()

    messages = [r.getMessage() for r in caplog.records if from_gpu_source(r)]
    assert len(messages) == 1
    assert messages[0].startswith("no NVML (")
    assert messages[0].endswith("): GPU rules are off")


# --- NVML errors while reading -----------------------------------------------------------


def test_not_supported_metric_is_dropped_for_that_gpu_only(
    opened: tuple[FakeNvml, GpuMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sentinel.gpu")
    fake, gpus = opened
    fake.fail("nvmlDeviceGetTotalEccErrors", pynvml.NVMLError_NotSupported, gpu=0)

    first = gpus.read_once(NOW)
    calls_after_first = fake.calls["nvmlDeviceGetTotalEccErrors"]
    second = gpus.read_once(NOW + 1)

    for reading in (first, second):
        assert GPU_ECC_UNCORRECTED not in values(reading["gpu:0"])
        assert GPU_ECC_CORRECTED not in values(reading["gpu:0"])
        assert GPU_TEMP in values(reading["gpu:0"])
        assert GPU_ECC_UNCORRECTED in values(reading["gpu:1"])
    # From then on GPU 0 is not asked again: only GPU 1's two counters are.
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] - calls_after_first == 2
    dropped = [r for r in gpu_records(caplog, logging.INFO) if "does not support" in r.getMessage()]
    assert [r.getMessage() for r in dropped] == [  # one line per counter, never again
        "gpu:0 does not support gpu_ecc_uncorrected: not read from now on",
        "gpu:0 does not support gpu_ecc_corrected: not read from now on",
    ]
    assert gpu_records(caplog, logging.WARNING) == []


def test_other_nvml_error_skips_the_metric_for_one_reading(
    opened: tuple[FakeNvml, GpuMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sentinel.gpu")
    fake, gpus = opened
    fake.fail("nvmlDeviceGetTemperature", pynvml.NVMLError_Unknown, gpu=0, times=1)

    first = gpus.read_once(NOW)
    second = gpus.read_once(NOW + 1)

    assert GPU_TEMP not in values(first["gpu:0"])
    assert GPU_TEMP in values(second["gpu:0"])
    (warning,) = gpu_records(caplog, logging.WARNING)
    assert warning.getMessage() == "gpu:0: reading gpu_temp_c failed (Unknown Error); skipped"


def test_a_lasting_nvml_error_is_logged_once_then_again_after_the_repeat_interval(
    opened: tuple[FakeNvml, GpuMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sentinel.gpu")
    fake, gpus = opened
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVMLError_Unknown, gpu=1)

    for offset in (0, 1, 2):
        assert GPU_POWER not in values(gpus.read_once(NOW + offset)["gpu:1"])
    assert len(gpu_records(caplog, logging.WARNING)) == 1
    gpus.read_once(NOW + REPEAT_LOG_S)

    warnings = [r.getMessage() for r in gpu_records(caplog, logging.WARNING)]
    assert len(warnings) == 2
    assert warnings[1].endswith("(and 2 more times since)")


def test_an_exception_not_from_nvml_is_logged_with_traceback_and_the_rest_read(
    opened: tuple[FakeNvml, GpuMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sentinel.gpu")
    fake, gpus = opened
    fake.fail("nvmlDeviceGetClockInfo", ZeroDivisionError, gpu=0)

    reading = values(gpus.read_once(NOW)["gpu:0"])

    assert GPU_SM_CLOCK not in reading
    assert GPU_UTIL in reading and GPU_ECC_CORRECTED in reading
    (error,) = gpu_records(caplog, logging.ERROR)
    assert error.exc_info is not None and error.exc_info[0] is ZeroDivisionError


def test_lost_gpu_reports_xid_79_once_and_is_no_longer_read(
    opened: tuple[FakeNvml, GpuMonitor], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sentinel.gpu")
    fake, gpus = opened
    fake.lose_gpu(1)

    first = gpus.read_once(NOW)
    second = gpus.read_once(NOW + 1)

    assert first["gpu:1"] == [Sample(GPU_XID, 79.0)]
    assert "gpu:1" not in second
    assert GPU_UTIL in values(second["gpu:0"])
    (error,) = gpu_records(caplog, logging.ERROR)
    assert "gpu:1 is lost" in error.getMessage()


@pytest.mark.parametrize(
    "call",
    [
        lambda fake: fake.nvmlDeviceGetCount(),
        lambda fake: fake.nvmlEventSetCreate(),
        lambda fake: fake.nvmlShutdown(),
    ],
    ids=["device-count", "event-set", "shutdown"],
)
def test_fake_raises_uninitialized_before_init(call: Callable[[FakeNvml], object]) -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        call(FakeNvml())


def test_stop_shuts_nvml_down_so_later_calls_are_uninitialized() -> None:
    fake = FakeNvml()
    gpus = monitor(fake, xid_wait_ms=20)
    assert gpus.start()
    handle = fake.nvmlDeviceGetHandleByIndex(0)

    gpus.stop()
    gpus.stop()  # twice is harmless

    assert not fake.initialized
    assert not gpus.running
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)


def test_stop_without_start_calls_nothing() -> None:
    fake = FakeNvml()
    monitor(fake).stop()
    assert sum(fake.calls.values()) == 0


# --- attribution -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "on_gpus", "expected"),
    [
        ("job", ("job", "other"), [1.0, 0.0]),
        ("job", ("other", None), [0.0, 0.0]),
        ("auto", ("other", "job"), [0.0, 1.0]),
        ("auto", ("other", None), [1.0, 1.0]),
        ("all", ("job", None), [1.0, 1.0]),
    ],
    ids=[
        "job-by-pid",
        "job-none-seen",
        "auto-by-pid",
        "auto-none-seen-takes-all",
        "all",
    ],
)
def test_attribution(
    mode: Attribution,
    on_gpus: tuple[str | None, str | None],
    expected: list[float],
    child: subprocess.Popen[bytes],
) -> None:
    fake = FakeNvml(gpus=2)
    # The job is the real child process; this test's own process is someone else's.
    pids = {"job": child.pid, "other": os.getpid()}
    for gpu, who in zip(fake.gpus, on_gpus, strict=True):
        if who is not None:
            gpu.processes[pids[who]] = 2 * 2**30
    gpus = monitor(fake, job_pids=frozenset({child.pid}), attribution=mode)
    assert gpus.open()
    try:
        reading = gpus.read_once(NOW)
    finally:
        gpus.stop()
    assert [values(reading[gpu_source(i)])[GPU_JOB] for i in range(2)] == expected


@pytest.mark.parametrize(
    ("named", "read"),
    [([1, 2], [1, 2]), ([3], [3]), (None, [0, 1, 2, 3])],
    ids=["two-named", "one-named", "none-named-reads-all"],
)
def test_a_sidecar_that_sees_every_gpu_reads_only_those_the_jobs_environment_names(
    named: list[int] | None, read: list[int], child: subprocess.Popen[bytes]
) -> None:
    """A Kubernetes sidecar asks the runtime for every GPU of the node (it requests none)
    and never sees the job's pids in NVML (another PID namespace): it reads, attributes to
    the job and judges only the GPUs whose UUIDs the job's NVIDIA_VISIBLE_DEVICES names,
    never another job's; their XIDs alone reach the rules."""
    fake = FakeNvml(gpus=4)
    uuids = None if named is None else frozenset(fake.gpus[i].uuid for i in named)
    received = Received()
    gpus = monitor(
        fake, received, job_pids=frozenset({child.pid}), job_devices=lambda: uuids,
        interval_s=3600.0, xid_wait_ms=20,
    )  # fmt: skip
    assert gpus.start()
    try:
        reading = gpus.read_once(NOW)
        assert sorted(reading) == [gpu_source(i) for i in read]
        assert all(values(reading[gpu_source(i)])[GPU_JOB] == 1.0 for i in read)
        wait_until(lambda: fake.registered_event_types(3) != 0, "XID thread registered")
        # In this order: before the first of the job's arrives, gpu:3's (another job's in
        # the first case) has had its turn.
        for index in (3, 2, 1, 0):
            fake.inject_xid(index, 79)
        received.wait_for(lambda: received.named(GPU_XID, gpu_source(read[0])) == [79.0], "XID")
    finally:
        gpus.stop()
    judged = [i for i in range(4) if received.named(GPU_XID, gpu_source(i))]
    assert judged == read


def test_a_gpu_whose_uuid_nvml_cannot_tell_is_not_read_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeNvml(gpus=2)
    fake.fail("nvmlDeviceGetUUID", pynvml.NVMLError_Unknown, gpu=0)
    uuids = frozenset({fake.gpus[1].uuid})
    gpus = monitor(fake, job_devices=lambda: uuids)
    assert gpus.open()
    try:
        readings = [gpus.read_once(NOW + i) for i in range(3)]
    finally:
        gpus.stop()
    assert all(sorted(reading) == ["gpu:1"] for reading in readings)
    said = [r for r in caplog.records if "cannot tell its UUID" in r.getMessage()]
    assert len(said) == 1 and said[0].getMessage().startswith("gpu:0")


def test_a_job_read_before_its_exec_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after a start the job may still be the shell that will exec it, whose
    environment is not the job's: what it names then is not kept for the attempt."""
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    python = f"{sys.executable} -c 'print(\"ready\", flush=True); import time; time.sleep(60)'"
    job = subprocess.Popen(
        ["sh", "-c", f"sleep 0.5; exec env NVIDIA_VISIBLE_DEVICES=GPU-1111 {python}"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        sources = SystemSources(GpuConfig(enabled=False), ProcessConfig(enabled=False), print)
        sources.set_job(ProcessIdentity.of(job.pid))
        assert sources.job_devices() is None  # the shell's, before its exec
        assert job.stdout is not None and job.stdout.readline() == "ready\n"
        assert sources.job_devices() == frozenset({"GPU-1111"})
    finally:
        os.killpg(job.pid, 9)
        job.wait()
        if job.stdout is not None:
            job.stdout.close()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("GPU-aa,GPU-bb", {"GPU-aa", "GPU-bb"}),
        (" GPU-aa ", {"GPU-aa"}),
        ("all", None),
        ("none", None),
        ("void", None),
        ("0,1", None),  # the node's numbering: not NVML's in another container
        ("GPU-aa,1", None),
        ("", None),
        (None, None),
    ],
)
def test_runtime_devices_reads_only_uuids(value: str | None, expected: set[str] | None) -> None:
    assert runtime_devices(value) == (None if expected is None else frozenset(expected))


@pytest.mark.parametrize(
    ("sentinel_sees", "environment", "before", "expected"),
    [
        (None, {"NVIDIA_VISIBLE_DEVICES": "GPU-1111,GPU-2222"}, None, {"GPU-1111", "GPU-2222"}),
        (None, {"NVIDIA_VISIBLE_DEVICES": "all"}, None, None),
        (None, {}, None, None),
        # A sidecar given every GPU of the node: none until the job names its own.
        ("all", {"NVIDIA_VISIBLE_DEVICES": "GPU-1111"}, set(), {"GPU-1111"}),
        ("all", {}, set(), set()),
        ("all", {"NVIDIA_VISIBLE_DEVICES": "all"}, set(), None),
    ],
    ids=["uuids", "all", "unset", "sidecar-uuids", "sidecar-job-without-gpu", "sidecar-job-all"],
)
def test_the_jobs_gpus_are_read_from_its_own_environment(
    sentinel_sees: str | None,
    environment: dict[str, str],
    before: set[str] | None,
    expected: set[str] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real job with its own environment (not sentinel's): what the runtime gave it."""
    env = {k: v for k, v in os.environ.items() if k != "NVIDIA_VISIBLE_DEVICES"}
    if sentinel_sees is None:
        monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", sentinel_sees)
    job = subprocess.Popen(
        [sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"],
        env=env | environment, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None and job.stdout.readline() == "ready\n"  # exec'd
        sources = SystemSources(GpuConfig(enabled=False), ProcessConfig(enabled=False), print)
        assert sources.job_devices() == (None if before is None else frozenset(before))
        sources.set_job(ProcessIdentity.of(job.pid))
        assert sources.job_devices() == (None if expected is None else frozenset(expected))
    finally:
        job.kill()
        job.wait()
        if job.stdout is not None:
            job.stdout.close()


# --- threads -----------------------------------------------------------------------------


def test_poll_thread_hands_each_gpu_to_on_samples_with_its_time() -> None:
    fake = FakeNvml(gpus=2)
    fake.gpus[0].temp_c = 64
    received = Received()
    gpus = monitor(fake, received, interval_s=0.01, xid_events=False)
    assert gpus.start()
    try:
        received.wait_for(lambda: len(received.calls) >= 4, "two readings of two GPUs")
    finally:
        gpus.stop()
    assert {source for source, _, _ in received.calls} == {"gpu:0", "gpu:1"}
    assert set(received.named(GPU_TEMP, "gpu:0")) == {64.0}
    assert all(now > 0 for _, _, now in received.calls)


def test_with_on_reading_each_poll_hands_every_gpu_over_at_once() -> None:
    fake = FakeNvml(gpus=3)
    fake.gpus[2].temp_c = 64
    readings: queue.Queue[tuple[dict[str, list[Sample]], float]] = queue.Queue()
    per_gpu = Received()
    gpus = monitor(
        fake,
        per_gpu,
        interval_s=0.01,
        xid_events=False,
        on_reading=lambda reading, now: readings.put((reading, now)),
    )
    assert gpus.start()
    try:
        polls = [readings.get(timeout=DEADLINE_S) for _ in range(2)]
    finally:
        gpus.stop()
    for reading, now in polls:
        assert set(reading) == {"gpu:0", "gpu:1", "gpu:2"}
        assert values(reading["gpu:2"])[GPU_TEMP] == 64.0
        assert now > 0
    assert per_gpu.calls == []


def test_a_raising_receiver_does_not_end_the_poll_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="sentinel.gpu")
    received = Received()
    calls: list[str] = []

    def flaky(source: str, samples: list[Sample], now: float) -> None:
        calls.append(source)
        if len(calls) == 1:
            raise RuntimeError("engine hiccup")
        received(source, samples, now)

    gpus = GpuMonitor(
        FakeNvml(), interval_s=0.01, on_samples=flaky, job_pids=frozenset, xid_events=False
    )
    assert gpus.start()
    try:
        received.wait_for(lambda: len(received.calls) >= 2, "readings after the failure")
    finally:
        gpus.stop()
    (error,) = gpu_records(caplog, logging.ERROR)
    assert error.exc_info is not None and error.exc_info[0] is RuntimeError


def test_each_xid_event_is_delivered_exactly_once() -> None:
    fake = FakeNvml(gpus=2)
    received = Received()
    gpus = monitor(fake, received, interval_s=0.01, xid_wait_ms=20)
    assert gpus.start()
    try:
        wait_until(lambda: fake.registered_event_types(1) != 0, "XID thread registered")
        assert fake.inject_xid(1, 48) == 1
        assert fake.inject_xid(1, 63) == 1
        received.wait_for(lambda: len(received.named(GPU_XID)) == 2, "two XIDs")
        # Many readings later, still two: an XID is an event, never a sticky value.
        seen = len(received.named(GPU_UTIL, "gpu:1"))
        received.wait_for(lambda: len(received.named(GPU_UTIL, "gpu:1")) >= seen + 5, "polls")
    finally:
        gpus.stop()
    assert received.named(GPU_XID, "gpu:1") == [48.0, 63.0]
    assert received.named(GPU_XID, "gpu:0") == []


def test_gpu_without_xid_events_is_skipped_and_others_registered() -> None:
    fake = FakeNvml(gpus=2)
    fake.gpus[0].supported_event_types = pynvml.nvmlEventTypeSingleBitEccError
    gpus = monitor(fake, xid_wait_ms=20)
    assert gpus.start()
    try:
        wait_until(lambda: fake.registered_event_types(1) != 0, "GPU 1 registered")
        assert fake.registered_event_types(0) == 0
    finally:
        gpus.stop()
    assert fake.calls["nvmlEventSetFree"] == 1


@pytest.mark.slow
def test_a_hanging_nvml_call_stalls_neither_xids_nor_stop() -> None:
    fake = FakeNvml(gpus=2)
    fake.block("nvmlDeviceGetUtilizationRates", seconds=60.0)
    received = Received()
    gpus = monitor(fake, received, interval_s=0.01, xid_wait_ms=20, stop_timeout_s=0.2)
    assert gpus.start()
    try:
        wait_until(fake.blocking.is_set, "the poll thread hangs in NVML")
        wait_until(lambda: fake.registered_event_types(0) != 0, "XID thread registered")
        fake.inject_xid(0, 79)
        received.wait_for(lambda: received.named(GPU_XID) == [79.0], "the XID, while hung")

        gpus.stop()

        # stop() came back while the poll thread is still inside its 60 s call; NVML is
        # not shut down under it.
        assert fake.blocking.is_set()
        assert gpus.running
        assert fake.initialized
    finally:
        fake.release()
    wait_until(lambda: not gpus.running, "the poll thread ends once the call returns")
    # The reading that outlived stop() is not delivered.
    assert received.named(GPU_UTIL) == []


# --- a real GPU --------------------------------------------------------------------------


@pytest.mark.gpu
def test_real_gpu() -> None:
    real_nvml_or_skip()
    received = Received()
    gpus = monitor(None, received, interval_s=0.05, job_pids=frozenset({os.getpid()}))
    assert gpus.start()
    try:
        assert gpus.available and gpus.device_count >= 1
        received.wait_for(lambda: len(received.calls) >= gpus.device_count, "a reading")
        reading = gpus.read_once(time.time())
    finally:
        gpus.stop()
    for source, samples in reading.items():
        metric = values(samples)
        assert 0 <= metric[GPU_UTIL] <= 100, source
        assert 0 < metric[GPU_MEM_USED] <= metric[GPU_MEM_TOTAL], source
        assert 10 < metric[GPU_TEMP] < 110, source
        assert 0 < metric[GPU_POWER] < 2 * metric[GPU_POWER_LIMIT], source
        assert 10 < metric[GPU_POWER_LIMIT] < 2000, source
        assert 0 < metric[GPU_SM_CLOCK] < 5000, source
        assert metric[GPU_JOB] in (0.0, 1.0), source
