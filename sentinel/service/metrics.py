"""sentinel's own Prometheus series: what it watches, what it saw, what it did.

One ``Metrics`` per sentinel, on a registry of its own (never prometheus_client's
global one, so two in one process, as in the tests, never collide). The loop calls
its plain methods as things happen; a scrape of ``/metrics`` or a write of the
node_exporter textfile reads them. The methods take no lock beyond
prometheus_client's own, since some are called for every batch of lines.

Names follow Prometheus' rules: a ``sentinel_`` prefix, base units in the name
(``_seconds``), ``_total`` only on counters, ``_info`` for the run's identity (join
on it rather than labelling every series), separate "total" and "failures"
counters rather than a result label.

A gauge of something the job may never show (its loss, grad-norm, throughput, spend,
the step) has no sample until the first value arrives: a series nobody logged is
absent, never a made-up ``0.0`` a dashboard or an alert would believe.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Info, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import write_to_textfile

from sentinel import __version__
from sentinel.model.records import Sample

log = logging.getLogger(__name__)

#: Distinct ``metric`` label values of the non-finite counter; later names count as
#: ``other``, so a log with a new metric name on every line cannot grow the scrape forever.
MAX_METRIC_LABELS = 64
OTHER_METRIC = "other"

#: The samples whose last value has a gauge of its own (the parsers' canonical names).
LOSS = "loss"
GRAD_NORM = "grad_norm"
TOKENS_PER_SEC = "tokens_per_sec"


class _GaugeOnceSet:
    """A gauge with no sample until it is first set (prometheus_client's ``Gauge`` shows
    ``0.0`` from birth): registered on the first :meth:`set`, then a plain gauge."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self._gauge = Gauge(name, documentation, registry=None)
        self._registry = registry
        self._registered = False
        self._lock = threading.Lock()

    def set(self, value: float) -> None:
        if not self._registered:
            with self._lock:  # only until the first value: two threads never register twice
                if not self._registered:
                    self._registry.register(self._gauge)
                    self._registered = True
        self._gauge.set(value)


class _PlainCounter:
    """A counter that is a plain number until a scrape reads it: ``inc`` is an addition,
    not prometheus_client's lock and checks, for a count the loop adds to on every turn
    (on a VM a cold turn pays for every page it touches). For one thread's additions."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.value = 0
        self._name, self._documentation = name, documentation
        registry.register(self)

    def inc(self, amount: int) -> None:
        self.value += amount

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(self._name, self._documentation, value=self.value)


class Metrics:
    """The series sentinel exports, and the loop's liveness for ``/livez``.

    ``clock`` is monotonic time (injected in tests); it only serves
    :meth:`loop_idle_s`. Wall times for the ``_timestamp_seconds`` gauges are
    given by the caller or read from ``time.time()``.
    """

    def __init__(
        self,
        *,
        job_name: str = "",
        host: str = "",
        mode: str = "run",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._loop_turned_at = clock()  # the loop has this long to turn a first time
        registry = self.registry
        self._build = Info("sentinel_build", "The running sentinel.", registry=registry)
        self._build.info({"version": __version__})
        self._job = Info(
            "sentinel_job",
            "The job watched: its name, the host, and how sentinel holds it (run or watch).",
            registry=registry,
        )
        self.job_info(job_name, host, mode)
        self._target_up = Gauge(
            "sentinel_target_up",
            "1 while sentinel observes the job's process, else 0.",
            registry=registry,
        )
        self._attempt = _GaugeOnceSet(
            "sentinel_job_attempt",
            "The attempt of the job being watched (1 for the first, then one per relaunch).",
            registry,
        )
        self._restarts = Counter(
            "sentinel_job_restarts",
            "Restarts of the job that sentinel made after a rollback.",
            registry=registry,
        )
        self._step = _GaugeOnceSet(
            "sentinel_training_step", "The newest training step seen.", registry
        )
        self._progress_at = _GaugeOnceSet(
            "sentinel_last_progress_timestamp_seconds",
            "When the training step last advanced (Unix time).",
            registry,
        )
        self._loop_at = _GaugeOnceSet(
            "sentinel_loop_last_success_timestamp_seconds",
            "When the detection loop last turned (Unix time).",
            registry,
        )
        self._lines = _PlainCounter(
            "sentinel_log_lines", "Lines of the job's output read.", registry
        )
        self._skipped = Counter(
            "sentinel_log_lines_skipped",
            "Lines of a flood left unparsed to keep up (searched only for a non-finite value"
            " or an error).",
            registry=registry,
        )
        self._garbled = Counter(
            "sentinel_log_lines_garbled",
            "Lines read that looked like metrics but could not be parsed.",
            registry=registry,
        )
        self._nonfinite = Counter(
            "sentinel_nonfinite_values",
            "NaN or infinite values seen, by metric.",
            ["metric"],
            registry=registry,
        )
        self._incidents = Counter(
            "sentinel_incidents",
            "Incidents opened, by rule and severity.",
            ["rule", "severity"],
            registry=registry,
        )
        self._incidents_active = Gauge(
            "sentinel_incidents_active", "Incidents open now, by rule.", ["rule"], registry=registry
        )
        self._actions = Counter(
            "sentinel_actions",
            "Actions taken on the job (stop, kill, rollback, restart), by kind.",
            ["kind"],
            registry=registry,
        )
        self._action_failures = Counter(
            "sentinel_action_failures",
            "Actions that failed, by kind.",
            ["kind"],
            registry=registry,
        )
        self._notifications = Counter(
            "sentinel_notifications",
            "Notifications sent or tried, by the target URL's scheme.",
            ["scheme"],
            registry=registry,
        )
        self._notification_failures = Counter(
            "sentinel_notification_failures",
            "Notification attempts that failed, by the target URL's scheme.",
            ["scheme"],
            registry=registry,
        )
        self._outbox = _GaugeOnceSet(
            "sentinel_outbox_pending", "Messages waiting in the outbox to be delivered.", registry
        )
        self._spend = _GaugeOnceSet(
            "sentinel_spend_currency_units",
            "Money the run has cost so far, in the currency of [cost] price_per_gpu_hour"
            " (absent without a price and a GPU count).",
            registry,
        )
        self._fp16_skipped = _GaugeOnceSet(
            "sentinel_fp16_skipped_steps",
            "Steps the fp16 loss scaler skipped in this attempt (a non-finite grad-norm with a"
            " finite loss, or an overflow line): counted, not alarmed.",
            registry,
        )
        self._loss = _GaugeOnceSet("sentinel_loss", "The last training loss seen.", registry)
        self._grad_norm = _GaugeOnceSet(
            "sentinel_grad_norm", "The last gradient norm seen.", registry
        )
        self._tokens_per_second = _GaugeOnceSet(
            "sentinel_tokens_per_second", "The last throughput seen.", registry
        )
        self._last = {LOSS: self._loss, GRAD_NORM: self._grad_norm}
        self._last[TOKENS_PER_SEC] = self._tokens_per_second
        self._newest_step: int | None = None
        self._nonfinite_children: dict[str, Counter] = {}
        self._active_rules: set[str] = set()
        self._textfile_failing = False

    # -- identity and the job ----------------------------------------------------

    def job_info(self, name: str, host: str, mode: str) -> None:
        """The job's identity: its name, the host sentinel runs on, ``run`` or ``watch``."""
        self._job.info({"name": name, "host": host, "mode": mode})

    def target_up(self, up: bool) -> None:
        """Whether sentinel observes the job's process now."""
        self._target_up.set(1 if up else 0)

    def attempt_started(self, attempt: int) -> None:
        """A new attempt of the job is watched (1, 2, ...): it is up, its step starts over."""
        self._attempt.set(attempt)
        self._target_up.set(1)
        self._newest_step = None

    def restarted(self) -> None:
        """sentinel relaunched the job after a rollback."""
        self._restarts.inc()

    # -- what was read --------------------------------------------------------------

    def lines_read(self, count: int, garbled: int = 0) -> None:
        """A batch of ``count`` lines was read, ``garbled`` of them unparseable (the loop's
        thread alone)."""
        self._lines.inc(count)
        if garbled:
            self._garbled.inc(garbled)

    def lines_skipped(self, count: int) -> None:
        """``count`` lines were skipped to keep up with the output
        (``sentinel.supervisor.shedding``)."""
        self._skipped.inc(count)

    def garbled(self, count: int) -> None:
        """``count`` lines looked like metrics but could not be parsed."""
        self._garbled.inc(count)

    def sample(
        self, name: str, value: float, step: int | None = None, now: float | None = None
    ) -> None:
        """One metric value: counts a non-finite one, keeps the last loss, grad-norm and
        throughput, and a newer ``step`` is progress."""
        if not math.isfinite(value):
            self._nonfinite_child(name).inc()
        gauge = self._last.get(name)
        if gauge is not None:
            gauge.set(value)
        if step is not None:
            newest = self._newest_step
            if newest is None or step > newest:
                self.progress(step, now)

    def samples(self, batch: Iterable[Sample], now: float | None = None) -> None:
        """A batch of samples, as :meth:`sample` each."""
        for item in batch:
            self.sample(item.name, item.value, item.step, now)

    def progress(self, step: int, now: float | None = None) -> None:
        """The job reached ``step`` (wall time ``now``): the step and the progress time."""
        self._newest_step = step
        self._step.set(step)
        self._progress_at.set(time.time() if now is None else now)

    def _nonfinite_child(self, name: str) -> Counter:
        child = self._nonfinite_children.get(name)
        if child is None:
            label = name if len(self._nonfinite_children) < MAX_METRIC_LABELS else OTHER_METRIC
            child = self._nonfinite.labels(label)
            self._nonfinite_children[name] = child
        return child

    # -- the loop and what it decided -------------------------------------------------

    def loop_turned(self, now: float | None = None) -> None:
        """The detection loop ran a turn (wall time ``now``): the liveness ``/livez`` reads."""
        self._loop_turned_at = self._clock()
        self._loop_at.set(time.time() if now is None else now)

    def loop_idle_s(self) -> float:
        """Seconds since the loop last turned (or since this object was made)."""
        return self._clock() - self._loop_turned_at

    def incident_opened(self, rule: str, severity: str) -> None:
        """An incident was opened (``severity``: info, warning or critical).

        Call it again when one escalates, with its new severity: the critical count is
        then the incidents that became critical.
        """
        self._incidents.labels(rule, str(severity)).inc()

    def incidents_active(self, by_rule: Mapping[str, int]) -> None:
        """The incidents open now, counted by rule; a rule left out has none open."""
        for rule in self._active_rules - by_rule.keys():
            self._incidents_active.labels(rule).set(0)
        for rule, count in by_rule.items():
            self._incidents_active.labels(rule).set(count)
        self._active_rules = set(by_rule)

    def action(self, kind: str, ok: bool = True) -> None:
        """sentinel acted on the job (``stop``, ``kill``, ``rollback``, ``restart``...)."""
        self._actions.labels(kind).inc()
        if not ok:
            self._action_failures.labels(kind).inc()

    def notified(self, scheme: str, ok: bool = True) -> None:
        """A notification was tried through a target of ``scheme`` (``slack``, ``mailto``...).

        Give the scheme only: a whole URL holds tokens, so anything from ``://`` on is cut.
        """
        scheme = scheme.split("://", 1)[0]
        self._notifications.labels(scheme).inc()
        if not ok:
            self._notification_failures.labels(scheme).inc()

    def outbox_depth(self, pending: int) -> None:
        """Messages waiting in the outbox now."""
        self._outbox.set(pending)

    def spend(self, amount: float) -> None:
        """What the run has cost so far."""
        self._spend.set(amount)

    def fp16_skipped_steps(self, count: int) -> None:
        """Steps the fp16 loss scaler skipped in this attempt, as the rules counted them."""
        self._fp16_skipped.set(count)

    # -- exposition ---------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text format of every series, as ``/metrics`` serves it."""
        return generate_latest(self.registry)

    def write_textfile(self, path: str) -> bool:
        """Write every series to ``path`` for node_exporter's textfile collector.

        Atomic (a temp file beside it, then ``rename``), so the collector never reads half
        a file. False when it could not be written; logged once until it works again.
        """
        try:
            write_to_textfile(path, self.registry)
        except OSError as error:
            if not self._textfile_failing:
                log.warning("cannot write the metrics textfile %s: %s", path, error)
            self._textfile_failing = True
            return False
        if self._textfile_failing:
            log.info("the metrics textfile %s is written again", path)
        self._textfile_failing = False
        return True
