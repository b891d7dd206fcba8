"""gpu_health: XID, ECC, sustained thermal or power throttling, temperature.

Each GPU (source ``gpu:<index>``) has its own episodes, one per kind: ``xid``,
``ecc``, ``throttle``, ``temp``. The incident tracker keeps one incident per rule,
so every episode that opens raises its alert (the journal has them all, the
tracker folds them into the open incident and only escalation pages again), and
the rule's single resolve goes out only when no episode is left open on any GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from sentinel.model.machine import (
    CLOCK_EVENTS_POWER,
    CLOCK_EVENTS_THERMAL,
    GPU_CLOCK_EVENTS,
    GPU_ECC_UNCORRECTED,
    GPU_TEMP,
    GPU_XID,
)
from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, Reading, Recent, RuleConfig

#: What an XID means, from NVIDIA's catalogue (https://docs.nvidia.com/deploy/xid-errors/,
#: "Analyzing Xid Errors with the Xid Catalog"), for the ones a training job meets.
XID_MEANINGS: dict[int, str] = {
    8: "GPU stopped processing (channel idle timeout)",
    13: "graphics engine exception",
    31: "GPU memory page fault (MMU fault)",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double bit ECC error (DBE)",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}

#: XIDs whose catalogue action is a GPU reset, a node reboot or an RMA: memory (48, 63, 64,
#: 92, 94, 95), interconnect (74), the bus (79), firmware (61, 62, 119, 120). The
#: application-caused ones (13, 31, 43, 45: the catalogue's RESTART_APP) stay warnings.
HARDWARE_XIDS: tuple[int, ...] = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)

#: ``nvmlClocksEventReason*`` bits by name (pynvml's values).
THROTTLE_BITS: dict[str, int] = {
    "sw_power_cap": 0x04,
    "hw_slowdown": 0x08,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}

ThrottleReason = Literal[
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
]
Kind = Literal["xid", "ecc", "throttle", "temp"]

DEFAULT_THROTTLE_REASONS: tuple[ThrottleReason, ...] = (
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)


class GpuHealthConfig(RuleConfig):
    """``[rules.gpu_health]``.

    ``on_critical`` is ``notify``: a hardware fault is for a human (drain the node,
    reset or RMA the GPU); stopping and restarting the job on the same GPU does not
    help, and a job that crashes of it is restarted by ``job_crash`` anyway.
    """

    renamed: ClassVar[Mapping[str, str]] = {"temp_readings": "temp_sustain"}

    on_critical: Literal["notify", "stop", "restart"] = "notify"
    #: XIDs that are critical (hardware); every other XID warns.
    critical_xids: list[int] = Field(default_factory=lambda: list(HARDWARE_XIDS))
    #: XIDs never reported (a cluster's known noise).
    ignore_xids: list[int] = Field(default_factory=list)
    #: A GPU's warning XID episode ends after this long without another XID from it: an
    #: application fault comes as a burst (13, then 43 and 45), paged once. Critical XIDs
    #: and ECC errors do not heal by waiting: they stay open until the job's next attempt.
    xid_quiet_s: float = Field(default=300.0, gt=0)
    #: Clock event reasons that count as throttling. Not ``sw_power_cap`` by default: a
    #: busy datacenter GPU sits at its power cap most of the time, and that is its
    #: rated speed, not a fault. HW slowdown, power brake and thermal slowdown are.
    throttle_reasons: list[ThrottleReason] = Field(
        default_factory=lambda: list(DEFAULT_THROTTLE_REASONS)
    )
    #: Throttling must hold on every reading for this long: a power brake or a thermal
    #: slowdown of a few seconds under a load step is normal; five minutes of it costs
    #: real throughput and points at cooling or power delivery.
    throttle_sustain_s: float = Field(default=300.0, ge=0)
    #: A throttle episode ends once no counted reason was set for this long.
    throttle_clear_s: float = Field(default=60.0, ge=0)
    #: Core temperature that warns. A100 and H100 list 85-87 C as their maximum operating
    #: temperature and slow down near 90 C: 85 warns before the clocks are cut.
    max_temp_c: float = Field(default=85.0, gt=0)
    #: Readings in a row at or above ``max_temp_c`` before warning (one is a spike).
    temp_sustain: int = Field(default=2, ge=1)
    #: The temperature episode ends below ``max_temp_c - temp_hysteresis_c``.
    temp_hysteresis_c: float = Field(default=5.0, ge=0)


class GpuHealthDetector(BaseDetector):
    """Alerts on each XID, on an uncorrected ECC increase, sustained throttling, heat.

    Every GPU the GPU source reads is judged, the job's or not: a sick GPU on the node
    is the node's problem, and the source narrows itself to the job's
    ``CUDA_VISIBLE_DEVICES`` when it knows them. Corrected ECC errors are not judged:
    the hardware fixed them, and the pattern that matters
    (a high single-bit rate, a row remap) comes as its own XID (92, 63/64).
    """

    rule = "gpu_health"
    config_model = GpuHealthConfig
    evidence_before_stop = True
    node_fault = True

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        return (
            "a GPU hardware fault or throttling",
            "drain the node if it is an XID or ECC error (nvidia-smi -q shows the GPU's"
            " state); for throttling check the cooling and the power limit",
            alert.metric,
        )

    watches = frozenset({GPU_XID, GPU_ECC_UNCORRECTED, GPU_CLOCK_EVENTS, GPU_TEMP})

    def __init__(self, config: GpuHealthConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._critical_xids = frozenset(config.critical_xids)
        self._ignored_xids = frozenset(config.ignore_xids)
        self._throttle_mask = 0
        for reason in config.throttle_reasons:
            self._throttle_mask |= THROTTLE_BITS[reason]
        self._reset()

    def _reset(self) -> None:
        #: Open episodes per (GPU, kind), with their severity.
        self._open: dict[tuple[str, Kind], Severity] = {}
        #: Per GPU: time of its last warning XID (its episode's clock).
        self._xid_last: dict[str, float] = {}
        self._ecc_seen: dict[str, float] = {}
        #: Per GPU: when the counted throttle reasons were first set, in the current run.
        self._throttled_since: dict[str, float] = {}
        #: Per GPU with an open throttle episode: when the reasons were last set.
        self._throttled_last: dict[str, float] = {}
        self._hot_readings: dict[str, int] = {}

    def job_started(self, now: float) -> None:
        # The tracker closes the previous attempt's incidents; the episodes go with them.
        self._reset()

    def tick(self, now: float) -> list[Alert]:
        return self._expire_xids(now, None) if self._xid_last else []

    def can_absorb(self, block: Block) -> bool:
        """A log block holds no GPU reading, and its ticks end no XID episode: each would
        end the one whose last XID is ``xid_quiet_s`` old, and none is by the latest clock."""
        if not self.watches.isdisjoint(block.names):
            return False  # a log that carries GPU readings: line by line
        quiet = self._xid_last
        return not quiet or max(block.clock) - min(quiet.values()) < self.settings.xid_quiet_s

    def absorb(self, block: Block) -> None:
        """Nothing to take: the ticks of an accepted block change nothing."""
        return None

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        alerts = self._expire_xids(now, sample.step) if self._xid_last else []
        value = sample.value
        if not math.isfinite(value):
            return alerts
        name = sample.name
        if name == GPU_XID:
            alerts += self._xid(sample, source, now)
        elif name == GPU_ECC_UNCORRECTED:
            alerts += self._ecc(sample, source, now)
        elif name == GPU_CLOCK_EVENTS:
            alerts += self._throttle(sample, source, now)
        elif name == GPU_TEMP:
            alerts += self._temp(sample, source, now)
        return alerts

    # -- the four kinds --------------------------------------------------------------

    def _xid(self, sample: Sample, source: str, now: float) -> list[Alert]:
        xid = int(sample.value)
        if xid in self._ignored_xids:
            return []
        meaning = XID_MEANINGS.get(xid, "see NVIDIA's XID catalogue")
        if xid in self._critical_xids:
            severity = Severity.CRITICAL
            advice = "a hardware fault: drain the node and reset or replace the GPU"
            self._xid_last.pop(source, None)  # held until the next attempt, not timed
        else:
            severity = Severity.WARNING
            advice = "usually the application's fault"
            if self._open.get((source, "xid")) is not Severity.CRITICAL:
                self._xid_last[source] = now
        key: tuple[str, Kind] = (source, "xid")
        self._open[key] = max(severity, self._open.get(key, severity))
        message = f"XID {xid} on {source}: {meaning} ({advice})"
        return [
            self.sample_alert(
                sample,
                severity=severity,
                message=message,
                time=now,
                source=source,
                details={"xid": xid, "meaning": meaning},
            )
        ]

    def _ecc(self, sample: Sample, source: str, now: float) -> list[Alert]:
        count = sample.value
        first = self._ecc_seen.setdefault(source, count)
        if count <= first or (source, "ecc") in self._open:
            return []
        # The volatile count only grows until a driver reload: one episode per attempt.
        self._open[(source, "ecc")] = Severity.CRITICAL
        message = (
            f"{count - first:g} new uncorrected ECC error(s) on {source}"
            f" ({count:g} since the driver loaded): the GPU's memory is failing;"
            " drain the node and reset or replace the GPU"
        )
        return [
            self.sample_alert(
                sample,
                severity=Severity.CRITICAL,
                message=message,
                time=now,
                source=source,
                details={"new_errors": count - first},
            )
        ]

    def _throttle(self, sample: Sample, source: str, now: float) -> list[Alert]:
        bits = int(sample.value) & self._throttle_mask
        key: tuple[str, Kind] = (source, "throttle")
        if bits:
            since = self._throttled_since.setdefault(source, now)
            if key in self._open:
                self._throttled_last[source] = now
                return []
            if now - since < self.settings.throttle_sustain_s:
                return []
            self._open[key] = Severity.WARNING
            self._throttled_last[source] = now
            kinds = [
                kind
                for kind, mask in (("thermal", CLOCK_EVENTS_THERMAL), ("power", CLOCK_EVENTS_POWER))
                if bits & mask
            ]
            reasons = [reason for reason, bit in THROTTLE_BITS.items() if bits & bit]
            message = (
                f"{source} {' and '.join(kinds)} throttling for {now - since:.0f} s"
                f" ({', '.join(reasons)}): its clocks are held down"
            )
            return [
                self.sample_alert(
                    sample,
                    severity=Severity.WARNING,
                    message=message,
                    time=now,
                    source=source,
                    details={"throttle": kinds, "reasons": reasons, "onset_time": since},
                )
            ]
        self._throttled_since.pop(source, None)
        last = self._throttled_last.get(source)
        if last is None or now - last < self.settings.throttle_clear_s:
            return []
        del self._throttled_last[source]
        return self._close(key, f"{source} throttling ended", sample, source, now)

    def _temp(self, sample: Sample, source: str, now: float) -> list[Alert]:
        settings = self.settings
        temp_c = sample.value
        key: tuple[str, Kind] = (source, "temp")
        if key in self._open:
            if temp_c >= settings.max_temp_c - settings.temp_hysteresis_c:
                return []
            self._hot_readings.pop(source, None)
            return self._close(key, f"{source} cooled to {temp_c:g} C", sample, source, now)
        if temp_c < settings.max_temp_c:
            self._hot_readings.pop(source, None)
            return []
        hot = self._hot_readings[source] = self._hot_readings.get(source, 0) + 1
        if hot < settings.temp_sustain:
            return []
        self._open[key] = Severity.WARNING
        message = (
            f"{source} at {temp_c:g} C, at or above {settings.max_temp_c:g} C for {hot}"
            " readings: check its cooling before it slows down"
        )
        return [
            self.sample_alert(
                sample,
                severity=Severity.WARNING,
                message=message,
                time=now,
                source=source,
                details={},
            )
        ]

    # -- episodes ----------------------------------------------------------------------

    def _expire_xids(self, now: float, step: int | None) -> list[Alert]:
        """End the warning XID episodes that have been quiet for ``xid_quiet_s``."""
        alerts: list[Alert] = []
        quiet_s = self.settings.xid_quiet_s
        for gpu, last in list(self._xid_last.items()):
            if now - last >= quiet_s:
                del self._xid_last[gpu]
                quiet = Sample(GPU_XID, math.nan, step)
                text = f"no XID from {gpu} for {now - last:.0f} s"
                alerts += self._close((gpu, "xid"), text, quiet, gpu, now)
        return alerts

    def _close(
        self, key: tuple[str, Kind], text: str, sample: Sample, source: str, now: float
    ) -> list[Alert]:
        """End one episode; the rule's resolve when it was the last one open.

        ``sample`` is the reading that cleared it (an XID episode's has no value).
        """
        if self._open.pop(key, None) is None or self._open:
            return []
        return [
            Alert(
                rule=self.rule,
                severity=Severity.INFO,
                message=f"{text}; every GPU healthy again",
                time=now,
                source=source,
                step=sample.step,
                metric=sample.name,
                value=sample.value if math.isfinite(sample.value) else None,
                resolves=True,
            )
        ]
