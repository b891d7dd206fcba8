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

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice
from math import inf
from operator import not_, sub
from typing import Any, Literal

from pydantic import Field, model_validator

from sentinel.model.machine import (
    GPU_JOB,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_UTIL,
    PROC_CPU,
    PROC_D_STATE,
    PROCESS_SOURCE,
    SYSTEM_METRICS,
)
from sentinel.model.records import Alert, Block, Line, Sample, Severity
from sentinel.rules.base import BaseDetector, Reading, Recent, RuleConfig
from sentinel.rules.series import LazyRolling, rising_steps

#: Lines a training script prints as it starts (or starts again): a resume, a checkpoint
#: loaded, the training loop's banner (HF Trainer's ``***** Running training *****``).
_STARTS = re.compile(
    r"\bresum(?:e|es|ed|ing)\b"
    r"|\b(?:load|restor)\w*\b[^\n]{0,40}?\bcheckpoint"
    r"|\bcheckpoint\b[^\n]{0,40}?\b(?:loaded|restored)\b"
    r"|\btraining\]?\s*[:-]?\s*start"
    r"|\bstart(?:ing)?\s+(?:the\s+)?training\b"
    r"|\*\s*running training\s*\*",
    re.IGNORECASE,
)


def starts_a_run(text: str) -> bool:
    """Whether an output line says the run is starting (again): a banner, a resume."""
    return _STARTS.search(text) is not None


def steps_kept_pace(silent_s: float, steps_done: int, soft_s: float) -> bool:
    """Whether a silence that ended with ``steps_done`` new steps is the run's cadence: on
    average each of those steps took under the soft timeout, so the job stepped all along
    and only logs rarely (fairseq's every 100 updates), whatever the silence's length."""
    return steps_done > 0 and silent_s / steps_done < soft_s


Verdict = Literal["hang", "busy", "none"]


class StallConfig(RuleConfig):
    """``[rules.stall]``.

    The fixed timeouts follow torch.distributed: its NCCL watchdog gives up on a
    hung collective after 10 minutes, so 10 minutes of silence is worth a warning;
    30 minutes outlasts the slowest checkpoint save or evaluation of a typical
    fine-tune. They apply until the run's rhythm is learned, and always with
    ``adaptive = false``.
    """

    soft_timeout_s: float = Field(default=600.0, gt=0)
    hard_timeout_s: float = Field(default=1800.0, gt=0)
    #: Learn the timeouts from the run's own step gaps.
    adaptive: bool = True
    #: Step gaps learned before the timeouts adapt: 10 logged steps is past the slow first
    #: steps (compilation, allocator warmup) of most runs and about a minute of a fast one.
    learn_steps: int = Field(default=10, ge=2)
    #: Floor of the learned soft timeout, and the least room between soft and hard: 5 minutes
    #: covers the first save of a ~7B model's weights and optimizer state to local disk, which
    #: a fast run meets before it has seen any long gap to learn from.
    min_timeout_s: float = Field(default=300.0, gt=0)
    #: Soft timeout in normal step gaps: 20 x a 30 s step is the fixed 10 minutes.
    interval_factor: float = Field(default=20.0, gt=1)
    #: Soft timeout over the longest gap seen: a save or eval may run 50% longer than its
    #: longest earlier one (a busier filesystem, a bigger eval batch) without a warning.
    gap_factor: float = Field(default=1.5, ge=1)
    #: Hard timeout over the learned soft one, as the fixed 30 minutes is 3 x 10.
    hard_factor: float = Field(default=3.0, gt=1)
    #: A job that is visibly busy (GPUs at power, CPU working, printing) goes critical only
    #: at this multiple of the hard timeout: twice the longest wait tolerated for a hang.
    busy_factor: float = Field(default=2.0, ge=1)
    #: GPU power under this fraction of its limit is no real work. A training step draws
    #: well above half the limit; an idle or NCCL-spinning GPU draws 10-25%.
    low_power_fraction: float = Field(default=0.3, gt=0, lt=1)
    #: The process tree's CPU under this percent of one core is idle: a Python loop doing
    #: anything at all keeps one core far above it.
    idle_cpu_percent: float = Field(default=5.0, ge=0)
    #: Readings older than this say nothing about now: 3 readings at the GPU and process
    #: sources' default 5 s interval, with room for a slow NVML call.
    evidence_max_age_s: float = Field(default=15.0, gt=0)

    @model_validator(mode="after")
    def _hard_after_soft(self) -> StallConfig:
        if self.hard_timeout_s <= self.soft_timeout_s:
            raise ValueError("hard_timeout_s must be greater than soft_timeout_s")
        return self


#: The readings ``stall`` keeps (the latest of each, per source).
EVIDENCE_METRICS = frozenset(
    {GPU_JOB, GPU_POWER, GPU_POWER_LIMIT, GPU_UTIL, PROC_CPU, PROC_D_STATE}
)


@dataclass
class Evidence:
    """What the latest fresh readings show while the job makes no progress."""

    #: The job's GPUs: source, utilisation (percent, None if not read), power, power limit.
    gpus: list[tuple[str, float | None, float, float]] = field(default_factory=list)
    cpu_percent: float | None = None
    d_state: int | None = None
    #: Seconds since the job last printed, when it printed during this silence.
    output_age_s: float | None = None
    low_power_fraction: float = 0.3
    idle_cpu_percent: float = 5.0

    @classmethod
    def from_readings(
        cls,
        readings_by_source: dict[str, dict[str, tuple[float, float]]],
        now: float,
        *,
        since: float,
        settings: StallConfig,
    ) -> Evidence:
        """What the latest (value, read at) of each metric, per source, shows at ``now`` of a
        silence that began at ``since``: readings older than it or than
        ``evidence_max_age_s`` say nothing. The rule adds the output's age itself."""
        evidence = cls(
            low_power_fraction=settings.low_power_fraction,
            idle_cpu_percent=settings.idle_cpu_percent,
        )
        oldest = max(since, now - settings.evidence_max_age_s)

        def fresh(readings: dict[str, tuple[float, float]], name: str) -> float | None:
            reading = readings.get(name)
            if reading is None or reading[1] < oldest:
                return None
            return reading[0]

        for source, readings in sorted(readings_by_source.items()):
            if source == PROCESS_SOURCE:
                evidence.cpu_percent = fresh(readings, PROC_CPU)
                d_state = fresh(readings, PROC_D_STATE)
                evidence.d_state = None if d_state is None else int(d_state)
                continue
            attached = fresh(readings, GPU_JOB)
            power = fresh(readings, GPU_POWER)
            limit = fresh(readings, GPU_POWER_LIMIT)
            if attached is None or attached < 0.5 or power is None or not limit:
                continue
            evidence.gpus.append((source, fresh(readings, GPU_UTIL), power, limit))
        return evidence

    @property
    def gpus_low(self) -> bool:
        return bool(self.gpus) and all(
            power < self.low_power_fraction * limit for _, _, power, limit in self.gpus
        )

    @property
    def cpu_idle(self) -> bool:
        return self.cpu_percent is not None and self.cpu_percent < self.idle_cpu_percent

    @property
    def verdict(self) -> Verdict:
        """Hang on any hang evidence, else busy on any sign of work, else none."""
        if self.d_state or self.gpus_low or self.cpu_idle:
            return "hang"
        if self.gpus or self.cpu_percent is not None or self.output_age_s is not None:
            return "busy"
        return "none"

    def describe(self) -> str:
        """The evidence in words: "gpu:0 util 100% at 85 W of 700 W, process tree CPU 2%"."""
        parts = []
        for source, util, power, limit in self.gpus:
            at = f"util {util:.0f}% at" if util is not None else "at"
            parts.append(f"{source} {at} {power:.0f} W of {limit:.0f} W")
        if self.cpu_percent is not None:
            parts.append(f"process tree CPU {self.cpu_percent:.0f}%")
        if self.output_age_s is not None:
            parts.append(f"last output {self.output_age_s:.0f} s ago")
        if self.d_state:
            parts.append(
                f"{self.d_state} process(es) in uninterruptible sleep (D state): SIGTERM will"
                " not stop them until their I/O returns; the node may need draining"
            )
        return ", ".join(parts) if parts else "no GPU or process readings"

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": [
                {"source": source, "util_percent": util, "power_w": power, "power_limit_w": limit}
                for source, util, power, limit in self.gpus
            ],
            "cpu_percent": self.cpu_percent,
            "d_state": self.d_state,
            "output_age_s": self.output_age_s,
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Timeouts:
    """The timeouts in force; ``learned`` when they come from the run's own step gaps."""

    soft_s: float
    hard_s: float
    busy_s: float
    learned: bool


def learned_gap(gap_s: float) -> bool:
    """Whether the time between two new steps is a gap the rule learns: lines read in
    one burst (no time between them) are one moment, not a gap."""
    return gap_s > 0.0


def uncapped(gap_s: float, uncapped_s: float) -> bool:
    """Whether a learned gap is taken as it is: up to ``uncapped_s`` no hard timeout in
    force can cap it (a longer one needs the timeouts worked out)."""
    return gap_s <= uncapped_s


@dataclass(frozen=True, slots=True)
class BlockProgress:
    """What feeding a block line by line leaves of ``stall``'s progress state.

    ``gaps_s`` are the gaps the rule learns, in order: the positive ones between
    consecutive new steps (the first from the step before the block), when it learns.
    """

    new_steps: bool
    last_step: int | None
    last_step_time: float | None
    last_progress: float | None
    last_activity: float | None
    gaps_s: list[float]


def block_progress(
    block: Block,
    *,
    last_step: int | None,
    last_step_time: float | None,
    last_progress: float | None,
    last_activity: float | None,
    steps_seen: bool,
    learning: bool,
    uncapped_s: float,
    least_soft_s: float,
) -> BlockProgress | None:
    """Progress, step gaps and activity after ``block`` for a rule in the state given, or
    None unless the block is steady: fed line by line, no tick in it would reach
    ``least_soft_s`` of silence (so none works the timeouts out) and, when ``learning``,
    no step gap would pass ``uncapped_s`` (so none is capped by the hard timeout).

    Line ``i``'s samples all carry ``steps[i]`` and the time ``at[i]`` (its own
    timestamp, else its clock): the first sample of a line whose step is past every
    step before it is a new step (progress at ``at[i]``); every other sample, and the
    output line when steps were already seen, is activity.
    """
    names, times = block.names, block.times
    if not names or not SYSTEM_METRICS.isdisjoint(names):
        return None  # no sample, or the machine's state: line by line
    if times is not None and 0.0 in times:
        return None  # epoch 0, which a block's contract reads as no time: line by line
    if learning and last_step_time is None:
        return None  # the attempt's first step learns its startup
    steps, clock = block.steps, block.clock
    count = len(steps)
    stamps = times if times is not None else clock
    # A block's clock never goes back; the stamps are the clock itself, or times the engine
    # took for the clock because they never go back either: the latest is the last.
    rising = stamps is clock
    new = rising_steps(steps, last_step)
    new_lines: Sequence[int] = range(count)
    new_stamps = stamps
    if new is not None:
        new_lines, new_stamps = list(compress(range(count), new)), list(compress(stamps, new))
    gaps_s: list[float] = []
    if learning and new_stamps:
        assert last_step_time is not None
        gaps_s = list(map(sub, new_stamps, [last_step_time, *new_stamps[:-1]]))
        if not learned_gap(min(gaps_s)):
            gaps_s = list(filter(learned_gap, gaps_s))  # lines read in one burst
        if gaps_s and not uncapped(max(gaps_s), uncapped_s):
            return None  # a long save the hard timeout may cap
    progress = last_progress
    if last_progress is not None:
        if block.ticks and _longest_silence(clock, stamps, new, last_progress) >= least_soft_s:
            return None
        if new_stamps:
            progress = max(last_progress, new_stamps[-1] if rising else max(new_stamps))
            if not steps_seen and block.output:
                # Line 0's output is progress too while no step was ever seen.
                progress = max(progress, clock[0])
    # Activity: the output lines (but line 0's while no step was seen), the samples after
    # each line's first, and the first sample of a line that is no new step.
    seen: list[float] = []
    if block.output and (steps_seen or count > 1):
        seen.append(clock[-1])  # the latest of the clock from line 0 or 1: its last
    if len(names) > 1:
        seen.append(stamps[-1] if rising else max(stamps))
    elif new is not None and not all(new):
        seen.append(max(compress(stamps, map(not_, new))))
    activity = last_activity
    if seen and (activity is None or max(seen) > activity):
        activity = max(seen)
    return BlockProgress(
        new_steps=bool(new_lines),
        last_step=steps[new_lines[-1]] if new_lines else last_step,
        last_step_time=new_stamps[-1] if new_stamps else last_step_time,
        last_progress=progress,
        last_activity=activity,
        gaps_s=gaps_s,
    )


def moment_progress(
    block: Block,
    *,
    last_step: int | None,
    last_step_time: float | None,
    last_activity: float | None,
    clock_running: bool,
) -> BlockProgress | None:
    """``block_progress`` for a block with progress bars among its lines (``block.progress``:
    HF Trainer output replayed before any timestamp), or None unless it is steady.

    Every bar and line is read at one moment, ``block.progress_at``, with no tick and no
    output. The first sample of a bar or line whose step passes every step before it is
    a new step; a line's other samples, and the first of one that is no new step, are
    activity. Only before the rule's clock runs (``clock_running``: an attempt started,
    so there is progress to measure silence from and gaps to learn): such a block comes
    before the data's first timestamp, which starts it.
    """
    seen = block.progress
    if seen is None or clock_running or block.times is not None or block.ticks or block.output:
        return None
    if not SYSTEM_METRICS.isdisjoint(block.names):
        return None  # the machine's state: line by line
    at = block.progress_at
    new = rising_steps(seen, last_step) if seen else []
    new_steps = bool(seen) and (new is None or any(new))
    active = len(block.names) > 1 or (new is not None and not all(new))
    activity = last_activity
    if active and (activity is None or at > activity):
        activity = at
    return BlockProgress(
        new_steps=new_steps,
        last_step=max(seen) if new_steps else last_step,
        last_step_time=at if new_steps else last_step_time,
        last_progress=None,
        last_activity=activity,
        gaps_s=[],
    )


def _longest_silence(
    clock: list[float], stamps: list[float], new: list[bool] | None, last_progress: float
) -> float:
    """At least the longest silence a tick within the block measures: the tick at line
    ``i`` measures from the latest progress before it, which is no earlier than the
    stamp of the last new step before line ``i`` (or ``last_progress``)."""
    if new is None:
        # Every line is a new step: line i's tick comes after line i - 1's step.
        later = max(map(sub, islice(clock, 1, None), stamps), default=-inf)
        return max(clock[0] - last_progress, later)
    # Rarely (a resume, a clock going back): the progress before each line, line by line.
    progressed = [stamp if is_new else -inf for stamp, is_new in zip(stamps, new, strict=True)]
    before = accumulate(progressed, max, initial=last_progress)
    longest: float = max(map(sub, clock, before))
    return longest


__all__ = [
    "EVIDENCE_METRICS",
    "BlockProgress",
    "Evidence",
    "StallConfig",
    "Timeouts",
    "Verdict",
    "block_progress",
    "learned_gap",
    "moment_progress",
    "uncapped",
]


#: What each verdict of the evidence means, in the message.
_MEANING = {
    "hang": "it looks hung",
    "busy": "the job is busy (a long save or evaluation?)",
    "none": "nothing tells a hang from a long save",
}


@dataclass(frozen=True, slots=True)
class Silence:
    """A silence without progress: how long, after which step, since when, and the run's
    learned rhythm the timeouts came from (None while they are not learned)."""

    silent_s: float
    last_step: int | None
    since: float
    rhythm: str | None


def silence_alert(
    rule: str,
    now: float,
    silence: Silence,
    level: Severity,
    timeouts: Timeouts,
    evidence: Evidence,
) -> Alert:
    """The warning or critical about ``silence``, at ``now``."""
    silent_s, last_step = silence.silent_s, silence.last_step
    verdict = evidence.verdict
    seen = evidence.describe()
    if last_step is None:
        head = f"no step and no output for {silent_s:.0f} s"
    else:
        head = f"no step after {last_step} for {silent_s:.0f} s"
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
        if silence.rhythm is not None:
            basis += f", {silence.rhythm}"
        message = f"{head} ({basis}); {seen}: {_MEANING[verdict]}"
    return Alert(
        rule=rule,
        severity=level,
        message=message,
        time=now,
        step=last_step,
        metric="silence_s",
        value=round(silent_s, 3),
        onset_step=None if last_step is None else last_step + 1,
        details={
            "evidence": evidence.to_json(),
            "onset_time": silence.since,
            "soft_timeout_s": timeouts.soft_s,
            "hard_timeout_s": timeouts.hard_s,
            "busy_timeout_s": timeouts.busy_s,
            "learned": timeouts.learned,
        },
    )


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
    evidence_before_stop = True

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        """What a stall's evidence (``details["evidence"]``) points at."""
        evidence = alert.details.get("evidence") or {}
        if evidence.get("d_state"):
            return (
                "no progress, with processes stuck in uninterruptible sleep (D state)",
                "storage or a driver call that does not return (NFS, a GPU fallen off the"
                " bus): SIGTERM and SIGKILL wait for it; the node may need draining",
                None,
            )
        verdict = evidence.get("verdict")
        if verdict == "hang":
            return (
                "a hang: no progress and no work being done",
                "an NCCL collective waiting on a rank that died or diverged, or a data-loader"
                " deadlock; py-spy dump --pid shows where each process waits",
                None,
            )
        if verdict == "busy":
            return (
                "no progress although the job is busy",
                "an endless loop, or an evaluation or save far longer than any before;"
                " py-spy dump --pid shows what it is doing",
                None,
            )
        return (
            "no progress",
            "a hang (an NCCL collective, a data-loader deadlock) or a very long save;"
            " py-spy dump --pid shows where it waits",
            None,
        )

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
