"""The machine's side of the job: its process tree and its GPUs, each read on its own thread.

``SystemSources`` starts what the config enables and hands every reading to one
callback (the supervisor's queue). Without NVML the GPU source is simply absent:
``GpuMonitor.start`` has said so once in the log.
"""

from __future__ import annotations

import logging
import os
import time

import psutil

from sentinel.gpu.monitor import GpuMonitor, OnReading
from sentinel.gpu.nvml import runtime_devices
from sentinel.gpu.settings import GpuConfig
from sentinel.model.machine import OnSamples
from sentinel.model.records import Sample
from sentinel.process.identity import ProcessIdentity
from sentinel.process.proctree import ProcessMonitor
from sentinel.process.settings import ProcessConfig

log = logging.getLogger(__name__)

#: A job younger than this may not have exec'd yet: an environment naming no GPU is read again.
ENVIRON_SETTLE_S = 2.0


class SystemSources:
    """The process-tree and GPU sources of one ``sentinel run``."""

    def __init__(
        self,
        gpu: GpuConfig,
        process: ProcessConfig,
        on_samples: OnSamples,
        *,
        on_reading: OnReading | None = None,
    ) -> None:
        """``on_reading``: where the periodic readings go, each as one call: a GPU poll's of
        every GPU, the process tree's (None: ``on_samples``, a call per source). XIDs, which
        are events, always go to ``on_samples``: a receiver may let readings wait a little,
        not those."""
        self.gpu_settings = gpu
        self.process_settings = process
        self.on_samples = on_samples
        self.on_reading = on_reading
        self.processes: ProcessMonitor | None = None
        self.gpus: GpuMonitor | None = None
        self._job: ProcessIdentity | None = None
        #: The GPUs the job's environment names, read once per attempt.
        self._job_devices: tuple[ProcessIdentity, frozenset[str] | None] | None = None

    def start(self) -> None:
        if self.process_settings.enabled:
            self.processes = ProcessMonitor(
                interval_s=self.process_settings.interval_s, on_samples=self._process_samples()
            )
            self.processes.start()
        gpu = self.gpu_settings
        if gpu.enabled:
            gpus = GpuMonitor(
                None,
                interval_s=gpu.interval_s,
                on_samples=self.on_samples,
                on_reading=self.on_reading,
                job_pids=self.job_pids,
                job_devices=self.job_devices,
                attribution=gpu.attribution,
                xid_events=gpu.xid_events,
                # The job inherits sentinel's environment: watch the GPUs it can use.
                visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            )
            if gpus.start():
                self.gpus = gpus

    def _process_samples(self) -> OnSamples:
        on_reading = self.on_reading
        if on_reading is None:
            return self.on_samples

        def as_reading(source: str, samples: list[Sample], read_at: float) -> None:
            on_reading({source: samples}, read_at)

        return as_reading

    def set_job(self, identity: ProcessIdentity | None) -> None:
        """The job's attempt now running (None between attempts)."""
        self._job = identity
        if self.processes is not None:
            self.processes.set_root(identity)

    def job_pids(self) -> frozenset[int]:
        """The job's processes, for attributing GPUs: its tree, or its own pid alone."""
        if self.processes is not None:
            return self.processes.pids()
        job = self._job
        return frozenset() if job is None else frozenset({job.pid})

    def job_devices(self) -> frozenset[str] | None:
        """The GPUs to read, by UUID: those the job's ``NVIDIA_VISIBLE_DEVICES`` names, what a
        container runtime gave the job's container; None: every GPU NVML shows sentinel.

        A sidecar given every GPU of the node (its own ``NVIDIA_VISIBLE_DEVICES=all``; it
        requests none) reads only the job's: none before the job is known, none for a job
        the runtime gave no GPU (or whose environment it cannot read), every one for a job
        given ``all``. Elsewhere a job that names none (unset, ``all``, indexes) leaves
        every GPU sentinel sees, as before."""
        sees_all = os.environ.get("NVIDIA_VISIBLE_DEVICES") == "all"
        job = self._job
        if job is None:
            return frozenset() if sees_all else None
        cached = self._job_devices
        if cached is not None and cached[0] == job:
            return cached[1]
        try:
            value = psutil.Process(job.pid).environ().get("NVIDIA_VISIBLE_DEVICES")
        except psutil.Error as exc:
            # Another user's job without CAP_SYS_PTRACE, or gone.
            log.info("cannot read the job's environment for its GPUs: %s", exc)
            value = None
        devices = runtime_devices(value)
        if devices is not None:
            log.info("the job's GPUs, by its NVIDIA_VISIBLE_DEVICES: %s", ",".join(sorted(devices)))
        elif sees_all and value != "all":
            devices = frozenset()
        if devices is None or not devices:
            if time.time() - job.create_time < ENVIRON_SETTLE_S:
                # Forked, maybe not yet exec'd: /proc/PID/environ may still be its parent's.
                return devices
            if devices is not None:
                log.info("the job names no GPU of its own (NVIDIA_VISIBLE_DEVICES): none is read")
        self._job_devices = (job, devices)
        return devices

    def alive(self) -> bool:
        """Whether every started source's thread still runs (a dead one watches nothing)."""
        processes_ok = self.processes is None or self.processes.running
        return processes_ok and (self.gpus is None or self.gpus.running)

    def stop(self) -> None:
        if self.gpus is not None:
            self.gpus.stop()
        if self.processes is not None:
            self.processes.stop()
