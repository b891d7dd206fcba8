"""The engine's sample path: one line's samples shown to the rules that watch them.

``Engine.feed_text`` (and ``feed_samples``, for a structured reader or the GPU and
process sources) hands a line's samples to its ``SampleFeeder``. It moves the run's
step and history as it goes (a step-less sample is at the run's newest step), then
shows each rule the samples routed to it, all at once (``observe_samples``) or, for
a rule without its own, one by one (``observe``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sentinel.engine.blocks import Disable
from sentinel.engine.history import History
from sentinel.engine.position import RunPosition
from sentinel.engine.ranks import with_rank
from sentinel.engine.routes import Routes
from sentinel.model.records import PROGRESS, Alert, Sample
from sentinel.rules import BaseDetector

#: The engine's way to show a line of one rank (above 0) to that rank's own rules.
FeedRank = Callable[[int, list[Sample], str, float], list[Alert]]

_new_sample = tuple.__new__


def _position(found: tuple[int, Alert]) -> int:
    return found[0]


class SampleFeeder:
    """Shows a line's samples to the rules, moving the run's position and history."""

    __slots__ = ("_disable", "_feed_rank", "history", "position", "routes")

    def __init__(
        self,
        *,
        position: RunPosition,
        history: History,
        routes: Routes,
        feed_rank: FeedRank,
        disable: Disable,
    ) -> None:
        self.position = position
        self.history = history
        self.routes = routes
        self._feed_rank = feed_rank
        self._disable = disable

    def feed(
        self, samples: Iterable[Sample], source: str, now: float, rank: int | None = None
    ) -> list[Alert]:
        """``Engine.feed_samples``: the alerts in the order of the samples that raised them,
        rules in registry order for the same sample."""
        if rank:
            return self._feed_rank(rank, list(samples), source, now)
        shown: list[Sample] = []
        metrics = 0
        position = self.position
        current = position.current_step
        history = self.history.by_metric
        data_clock = position.data_clock
        for sample in samples:
            name, value, step, stamp = sample[:4]
            if stamp is not None and not data_clock:
                position.data_time = stamp
            if name == PROGRESS:
                # Forward only: an evaluation's own progress bar counts batches from 0 again.
                if step is not None and (current is None or step > current):
                    current = step
                    # A progress bar's new step is progress for the rules that measure it
                    # (stall): a job logging metrics every 500 steps still moves every step.
                    shown.append(sample)
                continue
            if step is None:
                sample = _new_sample(Sample, (name, value, current, stamp, None))
            elif current is None or step > current:
                current = step
                position.note_seen(step, now)
            metrics += 1
            kept = history.get(name)
            if kept is None:
                kept = self.history.series(name)
            kept.append(sample)
            shown.append(sample)
        position.current_step = current
        if not shown:
            return []
        self.history.samples_seen += metrics
        names = tuple([sample.name for sample in shown])
        routes = self.routes
        route = routes.lines.get(names)
        if route is None:
            route = routes.line(names)
        found: list[tuple[int, Alert]] | None = None
        merged = False
        for detector, sample_by_sample in route:
            if sample_by_sample:
                raised = self._observe_each(detector, shown, source, now)
            else:
                try:
                    raised = detector.observe_samples(shown, source, now)
                except Exception as error:
                    raised = [(len(shown), self._disable(detector, error, now))]
            if raised:
                if found is None:
                    found = raised
                else:
                    found = found + raised
                    merged = True
        if found is None:
            return []
        if merged:
            # Sample order first; for one sample, the rules' order (a stable sort).
            found.sort(key=_position)
        alerts = [alert for _, alert in found]
        return alerts if rank is None else with_rank(alerts, rank)

    def _observe_each(
        self, detector: BaseDetector, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """A rule without its own ``observe_samples``: ``observe`` per sample it watches.

        A rule that raises is disabled at that sample, its earlier alerts kept.
        """
        found: list[tuple[int, Alert]] = []
        watches = detector.watches
        for index, sample in enumerate(samples):
            name = sample.name
            if name == PROGRESS:
                if not detector.sees_progress:
                    continue
            elif watches is not None and name not in watches:
                continue
            try:
                raised = detector.observe(sample, source, now)
            except Exception as error:
                found.append((index, self._disable(detector, error, now)))
                break
            if raised:
                found += [(index, alert) for alert in raised]
        return found
