"""sentinel as a service: its own health for the orchestrator (HTTP probes, Prometheus
metrics, the node_exporter textfile, systemd's notify protocol), fed by the loop.

Every probe speaks of sentinel itself, never of the job: a NaN in the job must
never make a kubelet or systemd restart the watchdog. A failure here (a port in
use at start is an error; a textfile that cannot be written later is logged) never
stops the watch.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Callable, Mapping, Sequence

from sentinel.config import Settings
from sentinel.model.records import Alert, Sample
from sentinel.service.http import HealthServer, state_dir_usable
from sentinel.service.metrics import Metrics
from sentinel.service.sdnotify import SystemdNotifier, format_status

log = logging.getLogger(__name__)


class Service:
    """The loop's reporter: metrics on every batch and tick, readiness, systemd notify."""

    def __init__(
        self,
        settings: Settings,
        *,
        job_name: str,
        mode: str,
        live_checks: Mapping[str, Callable[[], bool]] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics(job_name=job_name, host=socket.gethostname(), mode=mode)
        self.metrics.job_info(job_name, socket.gethostname(), mode)
        self.notifier = SystemdNotifier()
        self.server: HealthServer | None = None
        if settings.http is not None:
            self.server = HealthServer(
                self.metrics,
                settings.http,
                live_within_s=3 * settings.tick_interval_s + 5.0,
                ready_checks={"state_dir": state_dir_usable(settings.state_dir)},
                live_checks=live_checks,
            )
        self._garbled_seen = 0
        self.problem: str | None = None

    def start(self) -> None:
        """Serve the probes (OSError: the address is taken); ready once the loop can run."""
        if self.server is not None:
            self.server.start()
            log.info("serving /metrics, /livez, /readyz at %s", self.server.url)

    def ready(self) -> None:
        """Config loaded and state usable: sentinel is ready, whatever the job is doing."""
        if self.server is not None:
            self.server.set_ready()
        self.notifier.ready("watching")

    def lines(self, count: int) -> None:
        self.metrics.lines_read(count)

    def alerted(self, alerts: Sequence[Alert]) -> None:
        """The rules' alerts: each non-finite value one names counts for its metric."""
        for alert in alerts:
            value = alert.value
            if alert.metric is not None and value is not None and not math.isfinite(value):
                self.metrics.sample(alert.metric, value, alert.step)

    def turned(self, now: float) -> None:
        """A good cycle of the loop: liveness, and systemd's watchdog."""
        self.metrics.loop_turned(now)
        self.notifier.good_cycle()

    def tick(
        self,
        now: float,
        *,
        latest: Mapping[str, list[Sample]],
        attempt: int,
        open_incidents: Mapping[str, int],
        outbox_depth: int | None,
        garbled_total: int,
        spend: float | None,
        fp16_skipped_steps: int = 0,
    ) -> None:
        """Once a clock tick: the gauges, systemd's STATUS line, the textfile.

        ``garbled_total``: garbled lines since the start (the counter takes the rise);
        ``outbox_depth`` and ``spend`` are left as they were when None (not knowable now);
        ``fp16_skipped_steps``: the steps the loss scaler skipped in this attempt.
        """
        metrics = self.metrics
        metrics.fp16_skipped_steps(fp16_skipped_steps)
        if garbled_total > self._garbled_seen:
            metrics.garbled(garbled_total - self._garbled_seen)
            self._garbled_seen = garbled_total
        if spend is not None:
            metrics.spend(spend)
        step = None
        for name, samples in latest.items():
            if not samples:
                continue
            last = samples[-1]
            if last.step is not None and (step is None or last.step > step):
                step = last.step
            if math.isfinite(last.value):  # a non-finite one is counted from its alert
                metrics.sample(name, last.value, last.step, now)  # gauges of the known names
        metrics.incidents_active(open_incidents)
        if outbox_depth is not None:
            metrics.outbox_depth(outbox_depth)
        self.notifier.status(
            format_status(
                step=step,
                attempt=attempt,
                open_incidents=sum(open_incidents.values()),
                problem=self.problem,
            )
        )
        path = self.settings.metrics_textfile
        if path is not None:
            metrics.write_textfile(str(path))

    def stopping(self, drain_s: float) -> None:
        """Stopping: tell systemd, and ask for the time the drain may take."""
        self.notifier.stopping("draining notifications")
        if drain_s > 0:
            self.notifier.extend_timeout(drain_s + 5.0)

    def close(self) -> None:
        path = self.settings.metrics_textfile
        if path is not None:
            # As the run ended: the job gone (target_up 0), its last attempt and incidents,
            # not as of the last tick before the end.
            self.metrics.write_textfile(str(path))
        if self.server is not None:
            self.server.stop()
        self.notifier.close()
