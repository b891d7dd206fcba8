"""The GPUs as a source: NVML read on threads of its own, one sample list per GPU.

A poll thread reads every GPU each ``interval_s`` (``reading``); an XID thread waits
for XID critical errors on an NVML event set (``xid``). Only these threads call NVML,
so a driver call that hangs (it happens, on a GPU falling off the bus) never holds up
the engine: the engine only receives what ``on_samples`` hands it.

No NVML is not an error: ``start()`` logs one line and returns False, and the GPU rules
see no GPU samples. Errors are per metric (see ``reading``), and nothing NVML raises
ends a thread.

GPUs are named by NVML's index (``gpu:<index>``), which is the physical order, the one
``nvidia-smi`` shows. ``visible_devices`` (the job's ``CUDA_VISIBLE_DEVICES``) narrows the
GPUs watched; it does not renumber them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sentinel.gpu.nvml import GpuProbe, shutdown
from sentinel.gpu.reading import Attribution, GpuReader, WatchedGpu, open_gpus
from sentinel.gpu.xid import watch_xids
from sentinel.model.machine import OnSamples
from sentinel.model.records import Sample

log = logging.getLogger(__name__)

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


class GpuMonitor:
    """Reads every GPU NVML shows, and its XID errors, for the engine."""

    def __init__(
        self,
        probe: GpuProbe | None,
        *,
        interval_s: float,
        on_samples: OnSamples,
        job_pids: Callable[[], frozenset[int]],
        job_devices: Callable[[], frozenset[str] | None] = lambda: None,
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
        self._job_devices = job_devices
        self._attribution: Attribution = attribution
        self._xid_events = xid_events
        self._visible_devices = visible_devices
        self._xid_wait_ms = xid_wait_ms
        self._stop_timeout_s = stop_timeout_s
        self._gpus: list[WatchedGpu] = []
        self._reader: GpuReader | None = None
        self._stop = threading.Event()
        self._read_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._opened = False
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
        gpus = open_gpus(probe, self._visible_devices)
        if gpus is None:
            return False
        self._gpus = gpus
        self._reader = GpuReader(
            probe,
            gpus,
            attribution=self._attribution,
            job_pids=self._job_pids,
            job_devices=self._job_devices,
        )
        self._opened = self.available = True
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

    # --- readings and threads ---------------------------------------------------------------

    def read_once(self, now: float) -> dict[str, list[Sample]]:
        """One reading of every GPU: source -> samples; ``now`` paces the repeated logs."""
        with self._read_lock:
            if not self._opened or self._reader is None:
                return {}
            return self._reader.read(now)

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
        assert self._probe is not None
        watch_xids(
            self._probe,
            self._gpus,
            stop=self._stop,
            wait_ms=self._xid_wait_ms,
            deliver=self._deliver_xid,
        )

    def _deliver_xid(self, source: str, samples: list[Sample], now: float) -> None:
        """An XID, unless it is of a GPU the job's environment does not name."""
        reader = self._reader  # not under the read lock: a hung poll must not hold an XID
        if reader is None or reader.judged(source):
            self._deliver(source, samples, now)
        else:
            log.info("%s: XID of a GPU that is not the job's, not judged: %s", source, samples)
