"""loss_spike's episode: one per rule, shared by every watched metric.

What the rule says once a value was judged a spike (or a metric in the episode came
back under the bar): the opening warning, the escalation when a run of spikes persists
with a second signal, the resolve when every metric recovered or settled at a new
level. The decision whether a value is a spike is not made here
(``loss_spike_config.spikes``); this module only keeps the episode's story.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.eval_signal import EvalSignal
from sentinel.rules.loss_spike_config import LossSpikeConfig, SpikeSeries, spike_bar
from sentinel.rules.noise import beyond_seen

#: ``BaseDetector.sample_alert`` of the rule: how its alerts are built.
AlertMaker = Callable[..., Alert]


class SpikeEpisode:
    """The open episode of the rule (if any): its onset, whether it escalated."""

    def __init__(self, settings: LossSpikeConfig, alert: AlertMaker) -> None:
        self.settings = settings
        self.alert = alert
        self.series: dict[str, SpikeSeries] = {}
        self.open = False
        self.escalated = False
        self.onset_step: int | None = None
        #: The rule's count of judged values when the episode opened.
        self.onset_count = 0
        #: The evaluations: the eval loss rising since the onset is a second signal.
        self.evals = EvalSignal()

    def reset(self, series: dict[str, SpikeSeries]) -> None:
        """A new attempt: no episode, and these are the metrics' series."""
        self.series = series
        self.evals.reset()
        self.open = False
        self.escalated = False
        self.onset_step = None
        self.onset_count = 0

    def spike(
        self,
        series: SpikeSeries,
        baseline: float,
        sample: Sample,
        count: int,
        source: str,
        time: float,
    ) -> list[Alert]:
        """A judged value that is a spike: opens the episode, escalates it, or ends this
        metric's part as a level shift; ``count`` is the rule's count of judged values."""
        settings = self.settings
        name = sample.name
        series.calm = 0
        series.run.append((sample.step, sample.value))
        series.episode.append(sample.value)
        alerts: list[Alert] = []
        if not series.offending:
            series.offending = True
            if not self.open:
                self.open = True
                self.onset_step = sample.step
                self.onset_count = count
                ratio = sample.value / baseline
                message = (
                    f"{name} {sample.value:.4g} at step {sample.step}"
                    f" is {ratio:.1f}x its recent median {baseline:.4g}"
                )
                details = self._details("spike", series, baseline, sample)
                details["ratio"] = round(ratio, 3)
                alerts.append(self._say(settings.severity, message, sample, source, time, details))
        run_length = len(series.run)
        evidence = None
        if (
            run_length >= settings.sustain
            and not self.escalated
            and settings.sustain_severity > settings.severity
        ):
            evidence = self._second_signal(series)
        if evidence is not None:
            self.escalated = True
            bar = spike_bar(baseline, settings.factor)
            message = (
                f"{name} above {bar:.4g} ({settings.factor:g}x its recent"
                f" median {baseline:.4g}) for {run_length} consecutive values since step"
                f" {series.run[0][0]} (now {sample.value:.4g} at step {sample.step}), {evidence}"
            )
            details = self._details("persistent", series, baseline, sample)
            details["evidence"] = evidence
            alerts.append(
                self._say(settings.sustain_severity, message, sample, source, time, details)
            )
        if run_length >= settings.window:
            alerts += self._level_shift(series, baseline, sample, source, time)
        return alerts

    def under(
        self, series: SpikeSeries, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        """A value under the bar of a metric that keeps the episode open."""
        series.run.clear()
        series.calm += 1
        if series.calm < self.settings.resolve_after:
            return []
        series.offending = False
        series.calm = 0
        # Spikes the run came back from are part of its wobble (a rhythm's peaks).
        series.noise.extend(series.episode)
        series.episode.clear()
        if self._still_offending():
            return []
        details = self._details("recovered", series, baseline, sample)
        message = (
            f"{sample.name} back under {spike_bar(baseline, self.settings.factor):.4g} for"
            f" {self.settings.resolve_after} values (last {sample.value:.4g} at step"
            f" {sample.step})"
        )
        return [self._resolve(message, sample, source, time, details)]

    def _second_signal(self, series: SpikeSeries) -> str | None:
        """What makes a persistent run more than one noisy signal, or None: a value far
        beyond anything the run has shown, a spike of another watched metric since
        ``sustain`` judged values before the onset, or the eval loss risen at an evaluation
        since the onset (``eval_signal``)."""
        settings = self.settings
        highest = max(value for _, value in series.run)
        if beyond_seen(highest, series.noise.values, settings.extreme_factor):
            return f"far beyond anything the run has shown ({max(series.noise.values):.4g})"
        since = self.onset_count - settings.sustain
        for name, other in self.series.items():
            if other is not series and other.spiked_at is not None and other.spiked_at >= since:
                return f"and {name} spiked with it"
        return self.evals.rose_since(self.onset_step)

    def _level_shift(
        self, series: SpikeSeries, baseline: float, sample: Sample, source: str, time: float
    ) -> list[Alert]:
        """A whole window above the bar is a new level: learn it; this metric's part is over."""
        details = self._details("level_shift", series, baseline, sample)
        run_start = series.run[0][0]
        series.baseline.clear()
        for _, value in series.run:
            series.baseline.add(value)
        series.noise.extend(series.episode)
        series.episode.clear()
        series.run.clear()
        series.offending = False
        if self._still_offending():
            return []
        new_level = series.baseline.median()
        details["new_baseline"] = new_level
        message = (
            f"{sample.name} above {spike_bar(baseline, self.settings.factor):.4g} for"
            f" {self.settings.window} values since step {run_start}: a level shift, not a"
            f" spike; baseline re-learned at {new_level:.4g}"
        )
        return [self._resolve(message, sample, source, time, details)]

    def _still_offending(self) -> bool:
        return any(series.offending for series in self.series.values())

    def _details(
        self, kind: str, series: SpikeSeries, baseline: float, sample: Sample
    ) -> dict[str, Any]:
        window = self.settings.window
        recent = list(series.recent)[-(window + len(series.run)) :]
        return {
            "kind": kind,
            "metric": sample.name,
            "baseline": baseline,
            "threshold": spike_bar(baseline, self.settings.factor),
            "factor": self.settings.factor,
            "onset_step": self.onset_step,
            "run_length": len(series.run),
            "values": [value for _, value in recent],
            "steps": [step for step, _ in recent],
        }

    def _say(
        self,
        severity: Severity,
        message: str,
        sample: Sample,
        source: str,
        time: float,
        details: dict[str, Any],
    ) -> Alert:
        return self.alert(
            sample,
            severity=severity,
            message=message,
            time=time,
            source=source,
            onset_step=self.onset_step,
            details=details,
        )

    def _resolve(
        self, message: str, sample: Sample, source: str, time: float, details: dict[str, Any]
    ) -> Alert:
        alert = self.alert(
            sample,
            severity=Severity.INFO,
            message=message,
            time=time,
            source=source,
            onset_step=self.onset_step,
            resolves=True,
            details=details,
        )
        self.open = False
        self.escalated = False
        self.onset_step = None
        return alert
