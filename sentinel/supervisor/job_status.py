"""What sentinel tells of the job as it goes: the state store's keys behind
``sentinel status``, and the service's metrics and heartbeat on each clock tick.

The supervisor decides; ``JobStatus`` only counts and says: the lines skipped in a
flood, the steps the fp16 loss scaler skipped, the spend since the first attempt,
the job's state and pid.
"""

from __future__ import annotations

import time
from collections import Counter

from sentinel.model.cost import gpu_hours, money
from sentinel.rules.skipped import skipped_steps
from sentinel.service.health import Service
from sentinel.service.watch import Watch
from sentinel.store.state import StateStore
from sentinel.supervisor.holders import Handle
from sentinel.supervisor.job_state import JobState
from sentinel.supervisor.shedding import Shedder


class JobStatus:
    """Says how the job is doing, to the state store and the service (see the module)."""

    def __init__(self, service: Service, watch: Watch, store: StateStore, shedder: Shedder) -> None:
        self.service = service
        self.watch = watch
        self.store = store
        self._shedder = shedder
        #: When the first attempt started (time.time()), from which spend is counted.
        self.first_started_at: float | None = None
        #: Lines skipped as counted in the metrics, and in the state store, so far.
        self._skipped_told = 0
        self._skipped_stored = 0
        self._fp16_stored = 0

    def attempt_started(self, started_at: float) -> None:
        if self.first_started_at is None:
            self.first_started_at = started_at

    def lines_shed(self) -> None:
        """The lines the shedder skipped since last said, to the metrics."""
        shedder = self._shedder
        if shedder.skipped != self._skipped_told:
            self.service.metrics.lines_skipped(shedder.skipped - self._skipped_told)
            self._skipped_told = shedder.skipped

    def tick(self, now: float, *, attempt: int, outbox_depth: int | None) -> None:
        """The clock's tick: what changed to the state store, the heartbeat and metrics."""
        watch, store = self.watch, self.store
        if self._skipped_stored != self._skipped_told:
            self._skipped_stored = self._skipped_told  # for `sentinel status`
            watch.safely("the job's state", store.put, "job.lines_skipped", str(self._skipped_told))
        fp16_skipped = skipped_steps(watch.engine.detectors)
        if self._fp16_stored != fp16_skipped:
            self._fp16_stored = fp16_skipped  # for `sentinel status`
            watch.safely("the job's state", store.put, "job.fp16_skipped_steps", str(fp16_skipped))
        open_incidents = Counter(watch.tracker.open.keys())
        problems = watch.state_problems
        self.service.problem = "; ".join(f"cannot write {what}" for what in problems) or None
        self.service.tick(
            now,
            latest=watch.engine.recent(None, per_metric=1),
            attempt=attempt,
            open_incidents=open_incidents,
            outbox_depth=outbox_depth,
            garbled_total=watch.engine.parser.stats.garbled,
            spend=self.spend(now),
            fp16_skipped_steps=fp16_skipped,
        )

    def spend(self, now: float) -> float | None:
        """What the job's GPUs have cost since the first attempt started; None when unknown."""
        facts = self.watch.engine.facts
        gpus, price = facts.gpu_count, facts.price_per_gpu_hour
        if gpus is None or price is None or self.first_started_at is None:
            return None
        return money(gpu_hours(gpus, now - self.first_started_at), price)

    def state(self, state: JobState, job: Handle | None, restarts: int) -> None:
        """The job's state, pid and restarts so far (for `sentinel status`)."""
        self.watch.safely(
            "the job's state",
            self.store.put_many,
            {
                "job.state": str(state),
                "job.pid": str(job.pid) if job is not None else "",
                "job.restarts": str(restarts),
                "job.updated_at": repr(time.time()),
            },
        )
