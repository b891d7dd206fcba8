"""stall: no new step for too long, judged against the run's own rhythm and the machine's state.

Progress is a new step (a training sample whose step is above the last one seen).
Until the job has logged any step, any output counts instead (jobs that log no
steps); after that, output only shows the job is doing something.

Timeouts adapt: once ``learn_steps`` gaps between steps are known, the soft one
covers ``interval_factor`` normal steps and ``gap_factor`` times the longest gap
seen (a checkpoint save, an evaluation), so a save as long as an earlier one
raises nothing. Past the soft timeout a warning says what the GPUs and the
process tree show; past the hard one the rule goes critical only on hang
evidence (the job's GPUs at low power, its CPU idle, a process in D state) or
when there is no evidence at all (replay, no GPU or process source). A job that
is visibly busy is held at a warning until ``busy_factor`` times the hard timeout.
GPU utilisation is never evidence: a hung NCCL collective shows 100% at idle power.
"""

from __future__ import annotations

from sentinel.detectors.base import BaseDetector
from sentinel.detectors.series import LazyRolling
from sentinel.detectors.stall_evidence import (
    EVIDENCE_METRICS,
    BlockProgress,
    Evidence,
    StallConfig,
    Timeouts,
    block_progress,
    learned_gap,
    moment_progress,
    uncapped,
)
from sentinel.records import Alert, Block, Line, Sample, Severity
from sentinel.sources import SYSTEM_METRICS

#: Step gaps kept for the median: recent enough to follow a run that changes pace.
INTERVAL_WINDOW = 100


class StallDetector(BaseDetector):
    """Warns after the soft timeout of no progress; goes critical after the hard one on evidence.

    One warning and one critical per episode; the next progress resolves it. The
    learned rhythm survives a restart of the job (the same run); the silence clock
    starts again at each attempt.
    """

    rule = "stall"
    config_model = StallConfig
    sees_progress = True
    absorbs_progress = True

    def __init__(self, config: StallConfig) -> None:
        super().__init__(config)
        self.settings = config
        # Learned over the run (kept across attempts).
        # The median is asked for only near a timeout: sorted then, not on every step.
        self._intervals = LazyRolling(max(INTERVAL_WINDOW, config.learn_steps))
        #: A gap up to this is never capped (see ``_capped``).
        self._uncapped_s = min(config.hard_timeout_s, 2 * config.min_timeout_s)
        #: No soft timeout in force is ever shorter (see ``timeouts``): a tick before it
        #: is silent without working the timeouts out.
        self._least_soft_s = (
            min(config.soft_timeout_s, config.min_timeout_s)
            if config.adaptive
            else config.soft_timeout_s
        )
        self._longest_gap_s = 0.0
        self._longest_startup_s = 0.0
        self._steps_seen = False
        # This attempt.
        self._started_at: float | None = None
        self._last_progress: float | None = None
        self._last_step: int | None = None
        self._last_step_time: float | None = None
        self._last_activity: float | None = None
        self._level: Severity | None = None
        #: Per source, per metric: the latest (value, read at).
        self._readings: dict[str, dict[str, tuple[float, float]]] = {}

    def job_started(self, now: float) -> None:
        self._started_at = now
        self._last_progress = now
        self._last_step = None
        self._last_step_time = None
        self._last_activity = None
        self._level = None

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        # Progress bars count too (sees_progress): their step is the job's progress.
        name, value, step, stamp = sample[:4]
        if name in SYSTEM_METRICS:
            if name in EVIDENCE_METRICS:
                self._readings.setdefault(source, {})[name] = (value, now)
            return []  # the machine's state, never the job's progress
        at = stamp if stamp is not None else now
        if step is not None and (self._last_step is None or step > self._last_step):
            return self._new_step(step, at, source)
        if stamp is not None and not self._steps_seen:
            # A timestamped sample is new output even without a step (replay's only evidence).
            return self._progress(at, source)
        self._active(at)
        return []

    def output(self, line: Line) -> list[Alert]:
        return self.output_text(line.text, line.source, line.time)

    def output_text(self, text: str, source: str, now: float) -> list[Alert]:
        if self._steps_seen:
            self._active(now)
            return []
        return self._progress(now, source)

    def can_absorb(self, block: Block) -> bool:
        """Steady steps: no tick in the block reaches the least soft timeout in force (so
        none works the timeouts out), no step gap is long enough to be capped, and no
        episode is open for a step to resolve."""
        return self._block_progress(block) is not None

    def absorb(self, block: Block) -> None:
        progress = self._block_progress(block)
        if progress is None:
            raise ValueError("stall was handed a block it refused")
        gaps_s = progress.gaps_s
        if gaps_s:
            # Only the window's last gaps stay: adding just those leaves the same window.
            for gap_s in gaps_s[-(self._intervals.values.maxlen or len(gaps_s)) :]:
                self._intervals.add(gap_s)
            longest_s = max(gaps_s)
            if longest_s > self._longest_gap_s:
                self._longest_gap_s = longest_s
        if progress.new_steps:
            self._steps_seen = True
        self._last_step = progress.last_step
        self._last_step_time = progress.last_step_time
        self._last_progress = progress.last_progress
        self._last_activity = progress.last_activity

    def _block_progress(self, block: Block) -> BlockProgress | None:
        """What ``block`` does to the progress state, or None unless it is steady."""
        if self._level is not None:
            return None  # the first new step would resolve the episode
        if block.progress is not None:
            return moment_progress(
                block,
                last_step=self._last_step,
                last_step_time=self._last_step_time,
                last_activity=self._last_activity,
                clock_running=self._started_at is not None or self._last_progress is not None,
            )
        return block_progress(
            block,
            last_step=self._last_step,
            last_step_time=self._last_step_time,
            last_progress=self._last_progress,
            last_activity=self._last_activity,
            steps_seen=self._steps_seen,
            learning=self.settings.adaptive and self._started_at is not None,
            uncapped_s=self._uncapped_s,
            least_soft_s=self._least_soft_s,
        )

    def _new_step(self, step: int, at: float, source: str) -> list[Alert]:
        """A step past every one before, seen at ``at``: learn the gap, and it is progress."""
        self._learn(at)
        self._last_step = step
        self._last_step_time = at
        self._steps_seen = True
        return self._progress(at, source)

    def _active(self, at: float) -> None:
        if self._last_activity is None or at > self._last_activity:
            self._last_activity = at

    def _learn(self, at: float) -> None:
        """Learn the gap that ends with a new step at ``at`` (capped at the hard timeout)."""
        settings = self.settings
        if not settings.adaptive or self._started_at is None:
            return
        if self._last_step_time is None:
            startup_s = self._capped(at - self._started_at)
            self._longest_startup_s = max(self._longest_startup_s, startup_s)
            return
        gap_s = at - self._last_step_time
        if not learned_gap(gap_s):
            return
        gap_s = self._capped(gap_s)
        self._intervals.add(gap_s)
        if gap_s > self._longest_gap_s:
            self._longest_gap_s = gap_s

    def _capped(self, gap_s: float) -> float:
        """``gap_s``, at most the hard timeout in force (worked out only for a long gap)."""
        # No hard timeout is shorter than this: the fixed one, or a learned soft + min_timeout_s.
        if uncapped(gap_s, self._uncapped_s):
            return gap_s  # the usual step: no need to work out the timeouts
        return min(gap_s, self.timeouts().hard_s)

    def _progress(self, at: float, source: str) -> list[Alert]:
        if self._last_progress is None:
            return []  # not started: no clock to measure silence against
        self._last_progress = max(self._last_progress, at)
        if self._level is None:
            return []
        self._level = None
        return [
            Alert(
                rule=self.rule,
                severity=Severity.INFO,
                message=f"progress resumed at step {self._last_step}",
                time=at,
                source=source,
                step=self._last_step,
                resolves=True,
            )
        ]

    def timeouts(self) -> Timeouts:
        """The soft, hard and busy timeouts in force now."""
        settings = self.settings
        soft_s, hard_s = settings.soft_timeout_s, settings.hard_timeout_s
        learned = settings.adaptive and len(self._intervals) >= settings.learn_steps
        if learned:
            soft_s = max(
                settings.min_timeout_s,
                settings.interval_factor * self._intervals.median(),
                settings.gap_factor * self._longest_gap_s,
            )
            hard_s = self._hard_after(soft_s)
        if settings.adaptive and self._last_step is None and self._longest_startup_s > 0:
            # Before this attempt's first step: it may take as long as an earlier start did.
            startup_soft_s = settings.gap_factor * self._longest_startup_s
            if startup_soft_s > soft_s:
                soft_s = startup_soft_s
                hard_s = max(hard_s, self._hard_after(soft_s))
        return Timeouts(soft_s, hard_s, hard_s * settings.busy_factor, learned)

    def _hard_after(self, soft_s: float) -> float:
        settings = self.settings
        return max(soft_s * settings.hard_factor, soft_s + settings.min_timeout_s)

    def evidence(self, now: float) -> Evidence:
        """What the readings taken during this silence, and recently, show."""
        since = self._last_progress if self._last_progress is not None else now
        evidence = Evidence.from_readings(self._readings, now, since=since, settings=self.settings)
        if self._last_activity is not None and self._last_activity > since:
            age_s = now - self._last_activity
            if age_s <= self.timeouts().soft_s:
                evidence.output_age_s = max(0.0, age_s)
        return evidence

    def tick(self, now: float) -> list[Alert]:
        if self._last_progress is None:
            # Nothing seen yet (replay before its first timestamp): no baseline to measure from.
            return []
        silent_s = now - self._last_progress
        if silent_s < self._least_soft_s:
            return []
        timeouts = self.timeouts()
        if silent_s < timeouts.soft_s:
            return []
        evidence = self.evidence(now)
        verdict = evidence.verdict
        level = Severity.WARNING
        if (silent_s >= timeouts.hard_s and verdict != "busy") or silent_s >= timeouts.busy_s:
            level = Severity.CRITICAL
        if self._level is not None and level <= self._level:
            return []
        self._level = level
        return [
            self._silence_alert(
                now, silent_s=silent_s, level=level, timeouts=timeouts, evidence=evidence
            )
        ]

    def _silence_alert(
        self,
        now: float,
        *,
        silent_s: float,
        level: Severity,
        timeouts: Timeouts,
        evidence: Evidence,
    ) -> Alert:
        """The warning or critical about ``silent_s`` without progress, at ``now``."""
        verdict = evidence.verdict
        seen = evidence.describe()
        if self._last_step is None:
            head = f"no step and no output for {silent_s:.0f} s"
        else:
            head = f"no step after {self._last_step} for {silent_s:.0f} s"
        if level is Severity.CRITICAL and verdict == "busy":
            message = (
                f"no step for {silent_s:.0f} s although the job is busy ({seen}): an endless"
                " loop or an evaluation far longer than any before"
            )
        else:
            if level is Severity.CRITICAL:
                basis = f"hard timeout {timeouts.hard_s:.0f} s"
            else:
                basis = f"soft timeout {timeouts.soft_s:.0f} s"
            if timeouts.learned:
                basis += (
                    f", learned from {len(self._intervals)} step gaps: median"
                    f" {self._intervals.median():.3g} s, longest {self._longest_gap_s:.3g} s"
                )
            meaning = {
                "hang": "it looks hung",
                "busy": "the job is busy (a long save or evaluation?)",
                "none": "nothing tells a hang from a long save",
            }[verdict]
            message = f"{head} ({basis}); {seen}: {meaning}"
        next_step = None if self._last_step is None else self._last_step + 1
        return Alert(
            rule=self.rule,
            severity=level,
            message=message,
            time=now,
            step=self._last_step,
            metric="silence_s",
            value=round(silent_s, 3),
            onset_step=next_step,
            details={
                "evidence": evidence.to_json(),
                "onset_time": self._last_progress,
                "soft_timeout_s": timeouts.soft_s,
                "hard_timeout_s": timeouts.hard_s,
                "busy_timeout_s": timeouts.busy_s,
                "learned": timeouts.learned,
            },
        )


__all__ = ["INTERVAL_WINDOW", "StallConfig", "StallDetector"]
