"""XID critical errors: what the XID thread does, waiting on an NVML event set.

NVML's wait cannot be interrupted: it is called with a timeout (``wait_ms``) and the
stop event is checked between waits. Nothing NVML raises ends the wait loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sentinel.gpu.nvml import GpuProbe, LimitedLog, address
from sentinel.gpu.reading import REPEAT_LOG_S, WatchedGpu
from sentinel.model.machine import GPU_XID, gpu_source
from sentinel.model.records import Sample

log = logging.getLogger(__name__)

#: Where an XID goes: (source, samples, read at epoch seconds).
Deliver = Callable[[str, list[Sample], float], None]


def watch_xids(
    probe: GpuProbe,
    gpus: Sequence[WatchedGpu],
    *,
    stop: threading.Event,
    wait_ms: int,
    deliver: Deliver,
) -> None:
    """Hand every XID critical error of ``gpus`` to ``deliver`` until ``stop`` is set."""
    try:
        event_set = probe.nvmlEventSetCreate()
    except Exception as exc:
        log.warning("no XID events (NVML event set: %s)", exc)
        return
    try:
        by_address = _register(probe, event_set, gpus)
        if by_address:
            _wait(probe, event_set, by_address, stop, wait_ms, deliver)
        else:
            log.info("no GPU reports XID events: none will be seen")
    finally:
        try:
            probe.nvmlEventSetFree(event_set)
        except Exception as exc:
            log.debug("freeing the NVML event set: %s", exc)


def _register(probe: GpuProbe, event_set: Any, gpus: Sequence[WatchedGpu]) -> dict[int, int]:
    """Register every GPU that reports XIDs: handle address -> GPU index."""
    xid = probe.nvmlEventTypeXidCriticalError
    by_address: dict[int, int] = {}
    for gpu in gpus:
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


def _wait(
    probe: GpuProbe,
    event_set: Any,
    by_address: dict[int, int],
    stop: threading.Event,
    wait_ms: int,
    deliver: Deliver,
) -> None:
    log_limited = LimitedLog(log, REPEAT_LOG_S)
    while not stop.is_set():
        now = time.time()
        try:
            event = probe.nvmlEventSetWait_v2(event_set, wait_ms)
        except probe.NVMLError_Timeout:
            continue
        except Exception as exc:
            log_limited(("xid", type(exc)), now, logging.WARNING, "waiting for XIDs: %s", exc)
            # Not a timeout: the wait returned at once; do not spin on it.
            stop.wait(wait_ms / 1000)
            continue
        if not event.eventType & probe.nvmlEventTypeXidCriticalError:
            continue
        index = by_address.get(address(event.device))
        if index is None:
            log.warning("XID %d on a GPU not watched", event.eventData)
            continue
        log.warning("%s: XID %d", gpu_source(index), event.eventData)
        deliver(gpu_source(index), [Sample(GPU_XID, float(event.eventData))], now)
