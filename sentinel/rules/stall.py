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
Before the rhythm is learned the fixed timeouts apply, raised to ``gap_factor`` times
the longest gap already seen. A run that logs no step learns its rhythm from its
timestamped metric lines instead.

A silence nobody watched (replay's clock jumps from line to line; no tick and no reading
came during it) is judged when the next line says how it ended (``stall_ends``): the run
starting again (a banner, a step going back) is a new attempt, not a stall; new steps
done at under the soft timeout each are the run's cadence; otherwise it is judged as a
watched one would have been, but only warns in a run that logs no step (its lines
coming back cannot tell a restart from a hang).
"""

from __future__ import annotations

from sentinel.model.machine import SYSTEM_METRICS
from sentinel.model.records import Alert, Block, Line, Sample, Severity
from sentinel.rules.base import BaseDetector
from sentinel.rules.series import LazyRolling
from sentinel.rules.stall_ends import starts_a_run, steps_kept_pace
from sentinel.rules.stall_evidence import (
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
from sentinel.rules.stall_message import Silence, silence_alert

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
        #: The last tick or machine reading: the rule was watching then.
        self._watched_at: float | None = None
        #: The tick whose silence nobody watched, judged when the next line says how it ended,
        #: and what the machine showed then (the line that ends it is no evidence of a hang).
        self._held: float | None = None
        self._held_evidence: Evidence | None = None
        #: Per source, per metric: the latest (value, read at).
        self._readings: dict[str, dict[str, tuple[float, float]]] = {}

    def job_started(self, now: float) -> None:
        self._started_at = now
        self._last_progress = now
        self._last_step = None
        self._last_step_time = None
        self._last_activity = None
        self._level = None
        self._watched_at = now
        self._held = self._held_evidence = None

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        # Progress bars count too (sees_progress): their step is the job's progress.
        name, value, step, stamp = sample[:4]
        if name in SYSTEM_METRICS:
            if name in EVIDENCE_METRICS:
                self._readings.setdefault(source, {})[name] = (value, now)
            self._watch(now)
            return []  # the machine's state, never the job's progress
        at = stamp if stamp is not None else now
        held = self._held_step(step, stamp, at) if self._held is not None else []
        if step is not None and (self._last_step is None or step > self._last_step):
            return held + self._new_step(step, at, source)
        if stamp is not None and not self._steps_seen:
            # A timestamped sample is new output even without a step (replay's only evidence),
            # and, in a run that logs no step, its rhythm.
            self._mark(at)
            return held + self._progress(at, source)
        self._active(at)
        return held

    def output(self, line: Line) -> list[Alert]:
        return self.output_text(line.text, line.source, line.time)

    def output_text(self, text: str, source: str, now: float) -> list[Alert]:
        held = self._held_output(text, now) if self._held is not None else []
        if self._steps_seen:
            self._active(now)
            return held
        return held + self._progress(now, source)

    def _held_step(self, step: int | None, stamp: float | None, at: float) -> list[Alert]:
        """A sample after a silence nobody watched: how that silence ended, if it tells."""
        held, last_step = self._held, self._last_step
        assert held is not None and self._last_progress is not None
        if step is None:
            if stamp is None or self._steps_seen:
                return []  # activity: still untold
            return self._release(held, Severity.WARNING)  # lines back in a run of no steps
        if last_step is None:
            return self._release(held, None)  # the attempt's first step
        if step < last_step:
            self.job_started(at)  # the run started again: a new attempt, not a stall
            return []
        if step == last_step:
            return []
        silent_s = held - self._last_progress
        if steps_kept_pace(silent_s, step - last_step, self.timeouts().soft_s):
            self._held = self._held_evidence = None
            return []
        return self._release(held, None)

    def _held_output(self, text: str, now: float) -> list[Alert]:
        """An output line after a silence nobody watched: how that silence ended, if it tells."""
        if starts_a_run(text):
            self.job_started(now)
            return []
        if self._steps_seen:
            return []  # a step will tell
        assert self._held is not None
        return self._release(self._held, Severity.WARNING)

    def _release(self, held: float, most: Severity | None) -> list[Alert]:
        """Judge the held silence as a watched one at ``held``, at most ``most``."""
        evidence = self._held_evidence
        assert evidence is not None
        self._held = self._held_evidence = None
        return self._judge(held, evidence, most)

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
        if block.ticks and block.clock[-1] > (block.start_clock or 0.0):
            self._watch(block.clock[-1])
        self._last_step = progress.last_step
        self._last_step_time = progress.last_step_time
        self._last_progress = progress.last_progress
        self._last_activity = progress.last_activity

    def _block_progress(self, block: Block) -> BlockProgress | None:
        """What ``block`` does to the progress state, or None unless it is steady."""
        if self._level is not None or self._held is not None:
            return None  # the first new step would resolve the episode, or tell the silence
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

    def _mark(self, at: float) -> None:
        """A timestamped line of a run that logs no step: its gaps are the run's rhythm."""
        if self._last_step_time is None or at > self._last_step_time:
            self._learn(at)
            self._last_step_time = at

    def _watch(self, now: float) -> None:
        if self._watched_at is None or now > self._watched_at:
            self._watched_at = now

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
        elif settings.adaptive and settings.gap_factor * self._longest_gap_s > soft_s:
            # Not learned yet: still, a run that has gone this long between steps is not hung.
            soft_s = settings.gap_factor * self._longest_gap_s
            hard_s = max(hard_s, self._hard_after(soft_s))
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
        watched_at = self._watched_at
        self._watch(now)
        if self._last_progress is None:
            # Nothing seen yet (replay before its first timestamp): no baseline to measure from.
            return []
        if now - self._last_progress < self._least_soft_s:
            return []
        held = self._held
        if held is not None and self._printed_since(held):
            if now - held < self.timeouts().soft_s:
                return []  # lines came back after it: a step or a banner will tell, soon
        elif watched_at is not None and now - watched_at >= self._least_soft_s:
            # The clock jumped over this silence (replay; sentinel asleep): judged by how it
            # ends (``_held_step``, ``_held_output``), or at the next tick if it goes on.
            self._held, self._held_evidence = now, self.evidence(now)
            return []
        self._held = self._held_evidence = None
        return self._judge(now, None, None)

    def _printed_since(self, held: float) -> bool:
        """Whether the job printed since the silence held at ``held`` (a restart loading
        its model before its first step, or a hang that prints)."""
        activity = self._last_activity
        return activity is not None and activity >= held

    def _judge(self, now: float, evidence: Evidence | None, most: Severity | None) -> list[Alert]:
        """The warning or critical a silence up to ``now`` is worth (at most ``most``), once,
        on ``evidence`` taken at ``now`` (None: take it now)."""
        assert self._last_progress is not None
        silent_s = now - self._last_progress
        timeouts = self.timeouts()
        if silent_s < timeouts.soft_s:
            return []
        if evidence is None:
            evidence = self.evidence(now)
        verdict = evidence.verdict
        level = Severity.WARNING
        if (silent_s >= timeouts.hard_s and verdict != "busy") or silent_s >= timeouts.busy_s:
            level = Severity.CRITICAL
        if most is not None and level > most:
            level = most
        if self._level is not None and level <= self._level:
            return []
        self._level = level
        rhythm = None
        if timeouts.learned:
            rhythm = (
                f"learned from {len(self._intervals)} step gaps: median"
                f" {self._intervals.median():.3g} s, longest {self._longest_gap_s:.3g} s"
            )
        silence = Silence(silent_s, self._last_step, self._last_progress, rhythm)
        return [silence_alert(self.rule, now, silence, level, timeouts, evidence)]


__all__ = ["INTERVAL_WINDOW", "StallConfig", "StallDetector"]
