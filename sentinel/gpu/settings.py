"""``[gpu]``: the settings of the NVML source."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sentinel.model.bounds import SettingsTable


class GpuConfig(SettingsTable):
    """``[gpu]``: the NVML source. Without NVML (no driver, no GPU) the GPU rules are off."""

    enabled: bool = True
    #: Seconds between readings of every GPU. One reading costs a few NVML calls a GPU.
    interval_s: float = Field(default=5.0, gt=0)
    #: Which GPUs are the job's: "auto" takes those running one of the job's processes, or
    #: every visible GPU when NVML shows none of them (a container's own PID namespace
    #: hides them); "job" only the former; "all" every visible GPU.
    attribution: Literal["auto", "job", "all"] = "auto"
    #: Wait for XID critical errors on a thread of their own (NVML event set).
    xid_events: bool = True
