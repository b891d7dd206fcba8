"""What the real NVML answers, beside what ``tests.helpers.nvml.FakeNvml`` answers: one JSON.

Run on a machine with an NVIDIA GPU (bench/gpu_check.sh does)::

    python bench/gpu_probe.py OUT.json

Three parts, each in the JSON:

- ``raw``: every NVML call the GPU source makes (and the edge cases the fake scripts:
  calls before ``nvmlInit``, reference counting, a bad index, a bad sensor, other clocks,
  aggregate ECC, the event set), made once on the real library and once on ``FakeNvml``,
  each with the type and value it returned or the error class it raised;
- ``sentinel``: ``GpuMonitor(None, ...)`` (the real ``pynvml``) opened and read three times
  through sentinel's own code, with every log record it wrote (which metrics it dropped as
  unsupported), before and after this process puts work on the GPU (attribution);
- ``timing_us``: the mean time of each call the poll makes, over 200 calls.

Nothing here asserts: the JSON is read by a person, and ``diff`` lists the calls where the
real library and the fake disagree on the type returned or the error raised.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentinel.gpu.monitor import GpuMonitor
from sentinel.model.records import Sample
from tests.helpers.nvml import FakeNvml


def describe(value: Any) -> Any:
    """A JSON-able picture of what a call returned."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return {"type": type(value).__name__, "value": value}
    if isinstance(value, bytes):
        return {"type": "bytes", "value": value.decode(errors="replace")}
    if isinstance(value, list):
        return {"type": "list", "items": [describe(v) for v in value[:8]], "len": len(value)}
    if isinstance(value, ctypes._Pointer):
        return {"type": type(value).__name__, "address": ctypes.cast(value, ctypes.c_void_p).value}
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        out = {}
        for name, *_ in fields:
            field = getattr(value, name, None)
            if isinstance(field, ctypes._Pointer):
                field = ctypes.cast(field, ctypes.c_void_p).value
            out[name] = field if isinstance(field, (int, float, str, type(None))) else repr(field)
        return {"type": type(value).__name__, "fields": out}
    if isinstance(value, pynvml.nvmlFriendlyObject):
        return {"type": "nvmlFriendlyObject", "fields": dict(vars(value))}
    return {"type": type(value).__name__, "repr": repr(value)[:200]}


def attempt(function: Callable[[], Any]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        result = describe(function())
    except Exception as exc:
        result = {"raised": type(exc).__name__, "message": str(exc)}
    result["ms"] = round((time.perf_counter() - started) * 1000, 3)
    return result


def raw_calls(nv: Any) -> dict[str, dict[str, Any]]:
    """The calls, in order, on ``nv`` (the ``pynvml`` module or a ``FakeNvml``)."""
    out: dict[str, dict[str, Any]] = {}
    out["before_init.nvmlDeviceGetCount"] = attempt(nv.nvmlDeviceGetCount)
    out["before_init.nvmlShutdown"] = attempt(nv.nvmlShutdown)
    out["nvmlInit"] = attempt(nv.nvmlInit)
    out["nvmlInit.again"] = attempt(nv.nvmlInit)
    out["nvmlShutdown.one_of_two"] = attempt(nv.nvmlShutdown)
    out["nvmlDeviceGetCount.still_initialised"] = attempt(nv.nvmlDeviceGetCount)
    out["nvmlDeviceGetHandleByIndex(99)"] = attempt(lambda: nv.nvmlDeviceGetHandleByIndex(99))
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        h2 = nv.nvmlDeviceGetHandleByIndex(0)
    except Exception as exc:
        out["handle"] = {"raised": type(exc).__name__, "message": str(exc)}
        return out
    out["handle"] = describe(h)
    out["handle.same_address_each_call"] = describe(
        ctypes.cast(h, ctypes.c_void_p).value == ctypes.cast(h2, ctypes.c_void_p).value
    )
    out["handle.equal_by_eq"] = describe(bool(h == h2))
    calls: dict[str, Callable[[], Any]] = {
        "nvmlDeviceGetName": lambda: nv.nvmlDeviceGetName(h),
        "nvmlDeviceGetUUID": lambda: nv.nvmlDeviceGetUUID(h),
        "nvmlDeviceGetUtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetMemoryInfo": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetTemperature(GPU)": lambda: nv.nvmlDeviceGetTemperature(
            h, pynvml.NVML_TEMPERATURE_GPU
        ),
        "nvmlDeviceGetTemperature(7)": lambda: nv.nvmlDeviceGetTemperature(h, 7),
        "nvmlDeviceGetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h),
        "nvmlDeviceGetClockInfo(SM)": lambda: nv.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "nvmlDeviceGetClockInfo(GRAPHICS)": lambda: nv.nvmlDeviceGetClockInfo(
            h, pynvml.NVML_CLOCK_GRAPHICS
        ),
        "nvmlDeviceGetClockInfo(MEM)": lambda: nv.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
        "nvmlDeviceGetClockInfo(VIDEO)": lambda: nv.nvmlDeviceGetClockInfo(
            h, pynvml.NVML_CLOCK_VIDEO
        ),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(
            h
        ),
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda: (
            nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        ),
    }
    for error_type in ("UNCORRECTED", "CORRECTED"):
        for counter in ("VOLATILE", "AGGREGATE"):
            calls[f"nvmlDeviceGetTotalEccErrors({error_type},{counter})"] = (
                lambda e=error_type, c=counter: nv.nvmlDeviceGetTotalEccErrors(
                    h,
                    getattr(pynvml, f"NVML_MEMORY_ERROR_TYPE_{e}"),
                    getattr(pynvml, f"NVML_{c}_ECC"),
                )
            )
    calls["nvmlDeviceGetComputeRunningProcesses"] = lambda: nv.nvmlDeviceGetComputeRunningProcesses(
        h
    )
    calls["nvmlDeviceGetSupportedEventTypes"] = lambda: nv.nvmlDeviceGetSupportedEventTypes(h)
    for name, call in calls.items():
        out[name] = attempt(call)
    event_set = nv.nvmlEventSetCreate()
    out["nvmlEventSetCreate"] = describe(event_set)
    xid = pynvml.nvmlEventTypeXidCriticalError
    out["nvmlDeviceRegisterEvents(xid)"] = attempt(
        lambda: nv.nvmlDeviceRegisterEvents(h, xid, event_set)
    )
    out["nvmlDeviceRegisterEvents(all 64 bits)"] = attempt(
        lambda: nv.nvmlDeviceRegisterEvents(h, 0xFFFFFFFFFFFFFFFF, event_set)
    )
    out["nvmlEventSetWait_v2(200 ms)"] = attempt(lambda: nv.nvmlEventSetWait_v2(event_set, 200))
    out["nvmlEventSetWait_v2(0 ms)"] = attempt(lambda: nv.nvmlEventSetWait_v2(event_set, 0))
    out["nvmlEventSetFree"] = attempt(lambda: nv.nvmlEventSetFree(event_set))
    out["nvmlShutdown"] = attempt(nv.nvmlShutdown)
    out["after_shutdown.nvmlDeviceGetCount"] = attempt(nv.nvmlDeviceGetCount)
    out["after_shutdown.nvmlShutdown"] = attempt(nv.nvmlShutdown)
    return out


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def through_sentinel(with_work: Callable[[], Any]) -> dict[str, Any]:
    """``GpuMonitor`` over the real pynvml: three readings, then three with work on the GPU."""
    records = Records()
    source_log = logging.getLogger("sentinel.model.machine")
    source_log.addHandler(records)
    source_log.setLevel(logging.DEBUG)
    out: dict[str, Any] = {}
    try:
        for attribution in ("auto", "job"):
            monitor = GpuMonitor(
                None,
                interval_s=3600.0,
                on_samples=lambda *_: None,
                job_pids=lambda: frozenset({os.getpid()}),
                attribution=attribution,  # type: ignore[arg-type]
                xid_events=False,
            )
            opened = monitor.open()
            readings = []
            for _ in range(3):
                readings.append(_named(monitor.read_once(time.time())))
                time.sleep(0.2)
            monitor.stop()
            out[f"attribution={attribution}, no work"] = {"opened": opened, "readings": readings}
        keep = with_work()
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            out["raw, this process on the GPU"] = {"raised": f"{type(exc).__name__}: {exc}"}
        else:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            out["raw, this process on the GPU"] = {
                "nvmlDeviceGetComputeRunningProcesses": attempt(
                    lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                ),
                "nvmlDeviceGetMemoryInfo": attempt(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle)),
                "nvmlDeviceGetMemoryInfo(v2)": attempt(
                    lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)
                ),
                "nvmlDeviceGetCurrentClocksEventReasons": attempt(
                    lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
                ),
                "pid": os.getpid(),
            }
            pynvml.nvmlShutdown()
        monitor = GpuMonitor(
            None,
            interval_s=0.2,
            on_samples=lambda *_: None,
            job_pids=lambda: frozenset({os.getpid()}),
            attribution="job",
        )
        monitor.start()
        readings = []
        for _ in range(3):
            time.sleep(0.5)
            readings.append(_named(monitor.read_once(time.time())))
        started = time.perf_counter()
        monitor.stop()
        out["attribution=job, this process on the GPU, xid thread on"] = {
            "readings": readings,
            "stop_s": round(time.perf_counter() - started, 3),
        }
        del keep
    finally:
        source_log.removeHandler(records)
    out["log"] = records.lines
    return out


def _named(reading: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
    return {source: {s.name: s.value for s in samples} for source, samples in reading.items()}


def put_work_on_gpu() -> Any:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(50):
        x = torch.tanh(x @ x)
    torch.cuda.synchronize()
    return x


def timing_us() -> dict[str, float]:
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        calls: dict[str, Callable[[], Any]] = {
            "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
            "nvmlDeviceGetMemoryInfo": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
            "nvmlDeviceGetTemperature": lambda: pynvml.nvmlDeviceGetTemperature(
                h, pynvml.NVML_TEMPERATURE_GPU
            ),
            "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
            "nvmlDeviceGetClockInfo": lambda: pynvml.nvmlDeviceGetClockInfo(
                h, pynvml.NVML_CLOCK_SM
            ),
            "nvmlDeviceGetCurrentClocksEventReasons": lambda: (
                pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            ),
            "nvmlDeviceGetTotalEccErrors": lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            ),
            "nvmlDeviceGetComputeRunningProcesses": lambda: (
                pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            ),
        }
        out = {}
        for name, call in calls.items():
            try:
                call()
            except pynvml.NVMLError:
                out[name] = -1.0
                continue
            started = time.perf_counter()
            for _ in range(200):
                call()
            out[name] = round((time.perf_counter() - started) / 200 * 1e6, 1)
        return out
    finally:
        pynvml.nvmlShutdown()


def diff(real: dict[str, Any], fake: dict[str, Any]) -> list[str]:
    """Calls where the real library and the fake differ in type returned or error raised."""
    lines = []
    for name, answer in real.items():
        other = fake.get(name, {})
        mine = answer.get("raised") or answer.get("type")
        theirs = other.get("raised") or other.get("type")
        same_value = "value" not in answer or answer.get("value") == other.get("value")
        if mine != theirs or (name.startswith("handle.") and not same_value):
            lines.append(
                f"{name}: real {mine} {answer.get('value', '')}, fake {theirs} "
                f"{other.get('value', '')}".rstrip()
            )
    return lines


def main() -> None:
    out_path = Path(sys.argv[1])
    result: dict[str, Any] = {"pynvml": getattr(pynvml, "__version__", "?")}
    result["raw"] = {"real": raw_calls(pynvml), "fake": raw_calls(FakeNvml())}
    result["diff"] = diff(result["raw"]["real"], result["raw"]["fake"])
    try:
        pynvml.nvmlInit()
        result["driver"] = pynvml.nvmlSystemGetDriverVersion()
        result["nvml_version"] = pynvml.nvmlSystemGetNVMLVersion()
        result["cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as exc:
        result["driver"] = f"{type(exc).__name__}: {exc}"
    result["sentinel"] = through_sentinel(put_work_on_gpu)
    try:
        result["timing_us"] = timing_us()
    except Exception as exc:
        result["timing_us"] = {"raised": f"{type(exc).__name__}: {exc}"}
    out_path.write_text(json.dumps(result, indent=1, default=repr))
    for line in result["diff"]:
        print("DIFF", line)


if __name__ == "__main__":
    main()
