"""Sources: what sentinel watches, turned into lines and samples for the engine.

Log files and the job's own output become lines (``logfile``, ``tailer``,
``process``); the hardware and the job's process tree become samples with the
names below, read on their own threads so that a slow driver call never holds
up the engine (``gpu``, ``proctree``). The engine and the rules treat these
samples like any logged metric: they have no step and no time of their own
(the engine gives them the current step; the clock is the one it is handed).

Each GPU reports as source ``gpu:<index>``; the job's process tree as ``process``.
"""

from __future__ import annotations

from collections.abc import Callable

from sentinel.model.records import Sample

#: Called from a source's own thread with (source, samples, read at epoch seconds).
OnSamples = Callable[[str, list[Sample], float], None]

# --- GPU, per device (source "gpu:<index>"), from NVML -------------------------------------

#: Percent of the last sample period a kernel was running (NVML's "utilization.gpu").
#: Not evidence of work on its own: a hung NCCL collective spins at 100%.
GPU_UTIL = "gpu_util_percent"
GPU_MEM_USED = "gpu_mem_used_bytes"
GPU_MEM_TOTAL = "gpu_mem_total_bytes"
GPU_TEMP = "gpu_temp_c"
#: Power draw and the enforced limit, watts. Low power is the sign of no real work.
GPU_POWER = "gpu_power_w"
GPU_POWER_LIMIT = "gpu_power_limit_w"
GPU_SM_CLOCK = "gpu_sm_clock_mhz"
#: ``nvmlDeviceGetCurrentClocksEventReasons``: the bitmask of why clocks are held down.
GPU_CLOCK_EVENTS = "gpu_clock_events"
#: Volatile (since driver load) ECC error counts, uncorrected and corrected.
GPU_ECC_UNCORRECTED = "gpu_ecc_uncorrected"
GPU_ECC_CORRECTED = "gpu_ecc_corrected"
#: One sample per XID critical error event; the value is the XID.
GPU_XID = "gpu_xid"
#: 1 when the GPU is attributed to the job (one of its processes runs on it), else 0.
GPU_JOB = "gpu_job"

GPU_METRICS = frozenset(
    {
        GPU_UTIL,
        GPU_MEM_USED,
        GPU_MEM_TOTAL,
        GPU_TEMP,
        GPU_POWER,
        GPU_POWER_LIMIT,
        GPU_SM_CLOCK,
        GPU_CLOCK_EVENTS,
        GPU_ECC_UNCORRECTED,
        GPU_ECC_CORRECTED,
        GPU_XID,
        GPU_JOB,
    }
)

#: Clock event reasons (pynvml's ``nvmlClocksEventReason*``) that mean throttling.
CLOCK_EVENTS_THERMAL = 0x20 | 0x40  # SwThermalSlowdown | HwThermalSlowdown
CLOCK_EVENTS_POWER = 0x04 | 0x08 | 0x80  # SwPowerCap | HwSlowdown | HwPowerBrakeSlowdown

# --- the job's process tree (source "process"), from psutil ---------------------------------

#: CPU use of the whole tree, percent of one core (200 = two cores busy).
PROC_CPU = "proc_cpu_percent"
PROC_RSS = "proc_rss_bytes"
#: Processes in the tree (the job and its descendants).
PROC_COUNT = "proc_count"
#: Processes in uninterruptible sleep (D state): they do not die on SIGTERM.
PROC_D_STATE = "proc_d_state"
PROC_ZOMBIES = "proc_zombies"
#: Bytes read and written by the tree so far (where the platform counts them).
PROC_IO = "proc_io_bytes"

PROCESS_METRICS = frozenset({PROC_CPU, PROC_RSS, PROC_COUNT, PROC_D_STATE, PROC_ZOMBIES, PROC_IO})

#: Samples about the machine, not the training: not progress, not shown as training metrics.
SYSTEM_METRICS = GPU_METRICS | PROCESS_METRICS

PROCESS_SOURCE = "process"


def gpu_source(index: int) -> str:
    """The source name of GPU ``index``."""
    return f"gpu:{index}"
