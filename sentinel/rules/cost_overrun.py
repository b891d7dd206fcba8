"""cost_overrun: spend or projected spend at completion passes the budget.

Spend is price per GPU-hour x GPUs x the time the job held them, summed over
every attempt of the job this sentinel ran (the budget is for the run, so a
restart does not start it again). The projection adds what the remaining steps
will cost at the recent step rate, so a run whose throughput halves is flagged
hours before the money is actually gone.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import accumulate, compress, islice, repeat
from operator import add, gt, itemgetter, le, lt, mul, sub, truediv
from typing import Any, ClassVar, Literal, NamedTuple

from pydantic import Field, model_validator

from sentinel.model.cost import SECONDS_PER_HOUR, format_money
from sentinel.model.machine import GPU_JOB
from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricNames, Reading, Recent, RuleConfig
from sentinel.rules.series import rising_steps

#: Relative slack when comparing spend to a level: 80.0 reached through float sums is 80%.
_EPSILON = 1e-9


class CostOverrunConfig(RuleConfig):
    """``[rules.cost_overrun]``.

    The runbooks' defaults: warn at 80% of the budget spent, critical at 100%, and warn
    when the projection at completion passes 120%. The projection waits for ten
    minutes and ten steps of progress in an attempt: the first minutes of a run
    (compilation, data-loader warmup, a first evaluation) are slower than the rest,
    and a projection from them would cry wolf at every start.
    """

    renamed: ClassVar[Mapping[str, str]] = {"kill_at": "kill_fraction"}

    #: The run's budget, in the currency of ``[cost] price_per_gpu_hour``. Unset: silent.
    budget: float | None = Field(default=None, gt=0)
    #: Fraction of the budget spent that warns.
    warn_fraction: float = Field(default=0.8, gt=0)
    #: Fraction of the budget spent that is critical.
    critical_fraction: float = Field(default=1.0, gt=0)
    #: Fraction of the budget at which sentinel stops the job (no restart). Unset: never.
    kill_fraction: float | None = Field(default=None, gt=0)
    #: The projection at completion warns above ``budget x (1 + projected_margin)``
    #: (the runbooks' 20%); it resolves once back at or under the budget itself.
    projected_margin: float = Field(default=0.2, ge=0)
    #: Seconds of progress the step rate is measured over: long enough to average out an
    #: evaluation or a checkpoint save, short enough to notice a slowdown within the hour.
    rate_window_s: float = Field(default=1800.0, gt=0)
    #: Seconds of progress in the current attempt before projecting (after a restart too).
    projection_min_s: float = Field(default=600.0, ge=0)
    #: Steps of progress in the current attempt before projecting.
    projection_min_steps: int = Field(default=10, ge=1)
    #: Metrics whose steps tell progress (the first sample of each new step counts).
    step_metrics: MetricNames = Field(default_factory=lambda: ["loss", "grad_norm", "lr"])
    #: Restarting a job that is over budget spends more: notify by default.
    on_critical: Literal["notify", "stop", "restart"] = "notify"

    @model_validator(mode="after")
    def _ordered(self) -> CostOverrunConfig:
        if self.warn_fraction >= self.critical_fraction:
            raise ValueError(
                f"warn_fraction ({self.warn_fraction:g}) must be less than"
                f" critical_fraction ({self.critical_fraction:g})"
            )
        if self.kill_fraction is not None and self.kill_fraction < self.critical_fraction:
            raise ValueError(
                f"kill_fraction ({self.kill_fraction:g}) must be at least"
                f" critical_fraction ({self.critical_fraction:g}): it stops the job"
                " only after the critical alert"
            )
        return self


@dataclass(slots=True)
class CostState:
    """What ``cost_overrun`` knows of the run's spend and of the current attempt's progress."""

    gpu_s: float = 0.0
    #: Seconds held before any GPU count was known: charged at the first count known
    #: (the GPU source attributes the GPUs a poll or two after the job took them).
    unknown_s: float = 0.0
    #: Start of the interval not yet charged, while an attempt runs; else None.
    since: float | None = None
    #: GPU count at ``since`` (the last one known).
    gpus: int | None = None
    started: bool = False
    #: Budget fractions already alerted on (warn, critical, kill), for the whole run.
    raised: set[str] = field(default_factory=set)
    projection_open: bool = False
    last_step: int | None = None
    #: (time, step) of each new step of the current attempt, within the rate window.
    progress: deque[tuple[float, int]] = field(default_factory=deque)
    #: (time, step) of the current attempt's first step: the evidence starts there.
    first: tuple[float, int] | None = None


def reached_levels(settings: CostOverrunConfig, price: float | None, gpu_s: float) -> list[str]:
    """The levels (warn, critical, kill) ``gpu_s`` GPU-seconds of spend reach: a prefix."""
    budget = settings.budget
    if budget is None or price is None or gpu_s <= 0:
        return []
    spent = gpu_s / SECONDS_PER_HOUR * price
    levels = (
        ("warn", settings.warn_fraction),
        ("critical", settings.critical_fraction),
        ("kill", settings.kill_fraction),
    )
    return [
        name
        for name, fraction in levels
        if fraction is not None and spent >= fraction * budget * (1 - _EPSILON)
    ]


class Taken(NamedTuple):
    """What a block fed line by line leaves of the spend and the step rate: the clock
    charged up to, GPU-seconds, unknown seconds, the new steps' (time, step) points, and
    how many of the rate's points (those kept, then the new) the window drops."""

    since: float | None
    gpu_s: float
    unknown_s: float
    points: list[tuple[float, int]]
    dropped: int


def taken(
    state: CostState,
    settings: CostOverrunConfig,
    block: Block,
    *,
    step_metrics: frozenset[str],
    gpu_count: int | None,
    price: float | None,
    max_steps: int | None,
    judge: bool,
) -> Taken | None:
    """What ``block`` leaves of the rule's spend and step rate (``state``, with the run's
    GPU count, price and total steps given); None unless it is calm (the projections are
    judged only when ``judge``: ``absorb`` knows they hold)."""
    budget, since, gpus = settings.budget, state.since, state.gpus
    gpu_s, unknown_s, count = state.gpu_s, state.unknown_s, gpu_count
    if budget is None:
        return Taken(since, gpu_s, unknown_s, [], 0)  # no hook does anything
    watched = not step_metrics.isdisjoint(block.names)
    if since is None or not (watched or block.ticks):
        # No hook runs, or observe waits for an attempt to start, which a tick starts.
        return None if since is None and block.ticks else Taken(since, gpu_s, unknown_s, [], 0)
    if GPU_JOB in block.names or (count is not None and count != gpus):
        return None  # the GPU count changes
    if gpus is not None and unknown_s:
        return None  # time held before the count was known is charged now
    # Every line's hooks charge up to its clock (a tick, or the samples it watches);
    # a line the clock did not move charges 0.0, which adds nothing.
    clock = block.clock
    held_s = list(map(sub, clock, [since, *clock[:-1]]))
    if min(held_s) < 0:
        return None  # a clock going back: line by line
    charged: list[float] = []
    if gpus is None:
        unknown_s = list(accumulate(held_s, add, initial=unknown_s))[-1]
    else:
        charged = list(accumulate(map(mul, held_s, repeat(gpus)), add, initial=gpu_s))[1:]
        gpu_s = charged[-1]
    reached = reached_levels(settings, price, gpu_s)
    if reached and reached[-1] not in state.raised:
        return None  # spend passes a level within the block
    steps = block.steps
    new = rising_steps(steps, state.last_step)
    if new is None:
        points = list(zip(clock, steps, strict=True))
    else:
        points = list(zip(compress(clock, new), compress(steps, new), strict=True))
        charged = list(compress(charged, new))
    if not watched or not points:
        return Taken(clock[-1], gpu_s, unknown_s, [], 0)
    window = [*state.progress, *points]
    times = list(map(itemgetter(0), window))
    kept = len(window) - len(points)
    if not all(map(le, times, islice(times, 1, kept + 1))):
        return None  # points kept out of time order (a live clock that went back)
    if (
        judge
        and charged
        and price is not None
        and max_steps is not None
        and not projection_holds(state, settings, window, times, kept, charged, price, max_steps)
    ):
        return None
    # At each new step observe drops the points before the last one at or before
    # now - window; the times only grow, so the drop at the last step covers them all.
    dropped = bisect_right(times, times[-1] - settings.rate_window_s) - 1
    return Taken(clock[-1], gpu_s, unknown_s, points, max(dropped, 0))


def projection_holds(
    state: CostState,
    settings: CostOverrunConfig,
    window: list[tuple[float, int]],
    times: list[float],
    kept: int,
    charged: list[float],
    price: float,
    max_steps: int,
) -> bool:
    """Whether the projection at each new step (``window[kept:]``, with the GPU-seconds
    ``charged`` then) leaves ``state.projection_open`` as it is: the rule's own float
    operations, a column at a time."""
    budget, gpus = settings.budget, state.gpus
    if budget is None or gpus is None:
        return True  # no projection
    # The window's first point at each new step: the last at or before now - window,
    # or the one it started at for the step before (observe's popleft).
    now = times[kept:]
    starts = map(sub, now, repeat(settings.rate_window_s))
    lasts = map(bisect_right, repeat(times), starts, repeat(0), range(kept + 1, len(times) + 1))
    heads = accumulate(map(sub, lasts, repeat(1)), max, initial=0)
    next(heads)
    firsts = list(map(window.__getitem__, heads))
    step = list(map(itemgetter(1), window[kept:]))
    started_s, started_step = state.first or window[kept]
    # Too soon in the attempt is a prefix (time and step only grow); then a step is
    # judged when the window spans some time (and so some steps).
    soon = max(
        bisect_left(now, settings.projection_min_s, key=lambda at: at - started_s),
        bisect_left(step, settings.projection_min_steps, key=lambda at: at - started_step),
    )
    first_s = list(map(itemgetter(0), firsts))
    judged = [False] * soon + list(map(lt, first_s[soon:], now[soon:]))
    now, step = list(compress(now, judged)), list(compress(step, judged))
    first_s = list(compress(first_s, judged))
    first_step = list(compress(map(itemgetter(1), firsts), judged))
    rate = map(truediv, map(sub, step, first_step), map(sub, now, first_s))
    remaining = map(max, map(sub, repeat(max_steps), step), repeat(0))
    future = map(mul, map(mul, map(truediv, remaining, rate), repeat(gpus)), repeat(price))
    hours = map(truediv, compress(charged, judged), repeat(SECONDS_PER_HOUR))
    projected = map(
        add, map(mul, hours, repeat(price)), map(truediv, future, repeat(SECONDS_PER_HOUR))
    )
    if state.projection_open:
        return not any(map(le, projected, repeat(budget)))
    return not any(map(gt, projected, repeat(budget * (1 + settings.projected_margin))))


__all__ = [
    "CostOverrunConfig",
    "CostState",
    "Taken",
    "projection_holds",
    "reached_levels",
    "taken",
]


class CostOverrunDetector(BaseDetector):
    """Alerts as spend passes fractions of the budget, and on a projected overrun.

    Spend warns at ``warn_fraction`` of the budget, is critical at
    ``critical_fraction``, and at ``kill_fraction`` raises a critical that asks to stop
    the job (``details["on_critical"] = "stop"``); each once per run, a jump past
    several levels raising only the highest. The projection at completion warns once
    while it is over the budget by more than the margin, and resolves when back
    within the budget (unless spend alerts were raised: spent money never resolves).

    GPU-seconds are integrated piecewise: the GPU count seen when the rule is called
    (ticks, samples, job events; ``gpu_job`` samples among them, so a new attribution
    counts from the moment the GPU source reports it) holds until the next call. Time
    held before any count was known is charged at the first count known: the job
    held its GPUs before the GPU source attributed them.

    Silent while ``budget``, ``[cost] price_per_gpu_hour`` or the GPU count
    (``[cost] gpus``, else the attributed GPUs) is unknown; the owner logs that once.
    The projection also needs the run's total steps (``facts.max_steps``). Attached
    to a job it did not start (no ``job_started``), time counts from the first tick:
    what sentinel saw.
    """

    rule = "cost_overrun"
    config_model = CostOverrunConfig

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        return (
            "the run costs more than its budget",
            "check throughput (a slowdown stretches the bill), or raise the budget",
            None,
        )

    def start_notes(self) -> list[str]:
        if self.settings.budget is None or self.facts.price_per_gpu_hour is not None:
            return []
        return [
            f"[rules.cost_overrun] budget is {self.settings.budget:g} but [cost]"
            " price_per_gpu_hour is unset: no money is counted"
        ]

    def __init__(self, config: CostOverrunConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._step_metrics = frozenset(config.step_metrics)
        # Without a budget the rule has nothing to judge: it costs nothing per sample.
        self.watches = self._step_metrics | {GPU_JOB} if config.budget is not None else frozenset()
        #: Spend and progress: what the hooks and the block path move.
        self.state = CostState()

    # -- hooks ------------------------------------------------------------------------

    def job_started(self, now: float) -> None:
        if self.state.since is not None:
            self._accrue(now)  # the previous attempt's exit was never reported
        self.state.started = True
        self.state.since = now
        count = self.facts.gpu_count
        if count is not None:
            self.state.gpus = count
        self.state.last_step = None
        self.state.progress.clear()
        self.state.first = None

    def job_exited(self, exit_code: int | None, now: float, *, expected: bool) -> list[Alert]:
        alerts = self._spend(now)
        self.state.since = None
        return alerts

    def tick(self, now: float) -> list[Alert]:
        if self.settings.budget is None:
            return []
        if not self.state.started:
            self.job_started(now)
        return self._spend(now)

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        state = self.state
        if state.since is None:
            return []  # no attempt running (replay before its first timestamp)
        alerts = self._spend(now)
        step = sample.step
        if sample.name not in self._step_metrics or step is None:
            return alerts
        if state.last_step is not None and step <= state.last_step:
            return alerts
        state.last_step = step
        if state.first is None:
            state.first = (now, step)
        progress = state.progress
        progress.append((now, step))
        # Keep one point at or before the window's start, so the span covers the window.
        start = now - self.settings.rate_window_s
        while len(progress) > 1 and progress[1][0] <= start:
            progress.popleft()
        return alerts + self._project(step, source, now)

    # -- blocks -----------------------------------------------------------------------

    def can_absorb(self, block: Block) -> bool:
        """Without a budget, always: nothing is judged. With one, when the spend at the
        block's last clock reaches no level not yet raised (spend only grows, so it did
        not before either) and the projection at each new step, worked out as line by
        line would, neither opens nor closes."""
        return self._taken(block, judge=True) is not None

    def absorb(self, block: Block) -> None:
        done = self._taken(block, judge=False)
        if done is None:
            raise ValueError("cost_overrun was handed a block it refused")
        state = self.state
        state.since, state.gpu_s, state.unknown_s, points, dropped = done
        if points:
            state.first = state.first or points[0]
            state.last_step = points[-1][1]
            state.progress.extend(points)
            state.progress = deque(islice(state.progress, dropped, None))

    def _taken(self, block: Block, *, judge: bool) -> Taken | None:
        facts = self.facts
        return taken(
            self.state,
            self.settings,
            block,
            step_metrics=self._step_metrics,
            gpu_count=facts.gpu_count,
            price=facts.price_per_gpu_hour,
            max_steps=facts.max_steps,
            judge=judge,
        )

    # -- memory across restarts of sentinel ------------------------------------------

    def memory(self, now: float) -> dict[str, Any] | None:
        if self.settings.budget is None:
            return None
        self._accrue(now)
        state = self.state
        return {
            "gpu_s": state.gpu_s,
            "unknown_s": state.unknown_s,
            "raised": sorted(state.raised),
            "at": now,
        }

    def remember(self, memory: dict[str, Any], *, same_job: bool) -> None:
        """The spend of earlier attempts counts on. The same job's spend up to the save
        replaces what its start time implies (charged again from the save, so the time
        sentinel was down is charged once)."""
        state = self.state
        gpu_s, unknown_s = float(memory["gpu_s"]), float(memory["unknown_s"])
        if same_job:
            state.gpu_s, state.unknown_s = gpu_s, unknown_s
            if state.since is not None:
                state.since = max(state.since, float(memory["at"]))
        else:
            state.gpu_s += gpu_s + unknown_s * (state.gpus or 0)
        state.raised.update(str(level) for level in memory["raised"])

    # -- spend ------------------------------------------------------------------------

    def _accrue(self, now: float) -> None:
        """Charge the GPU-seconds since the last call; note the GPU count known now."""
        state = self.state
        count = self.facts.gpu_count
        if state.since is not None and now > state.since:
            held_s = now - state.since
            if state.gpus is None:
                state.unknown_s += held_s
            else:
                state.gpu_s += (held_s + state.unknown_s) * state.gpus
                state.unknown_s = 0.0
            state.since = now
        if count is not None:
            state.gpus = count

    def _spend(self, now: float) -> list[Alert]:
        self._accrue(now)
        reached = reached_levels(self.settings, self.facts.price_per_gpu_hour, self.state.gpu_s)
        if not reached or reached[-1] in self.state.raised:
            return []
        budget = self.settings.budget
        price = self.facts.price_per_gpu_hour
        assert budget is not None and price is not None
        gpu_hours = self.state.gpu_s / SECONDS_PER_HOUR
        spent = gpu_hours * price
        # A jump past several levels raises only the highest: one page, not three.
        self.state.raised.update(reached)
        level = reached[-1]
        details: dict[str, Any] = {
            "spent": spent,
            "budget": budget,
            "fraction_spent": spent / budget,
            "gpu_hours": gpu_hours,
            "gpus": self.state.gpus,
            "price_per_gpu_hour": price,
        }
        message = (
            f"spent {format_money(spent)} of the {format_money(budget)} budget"
            f" ({spent / budget:.0%}): {gpu_hours:.2f} GPU-hours"
            f" at {format_money(price)}/GPU-hour"
        )
        if level == "kill":
            details["on_critical"] = "stop"
            kill = self.settings.kill_fraction
            message += f"; past kill_fraction ({kill:.0%} of the budget): stop the job"
        return [
            Alert(
                rule=self.rule,
                severity=Severity.WARNING if level == "warn" else Severity.CRITICAL,
                message=message,
                time=now,
                step=self.state.last_step,
                metric="cost",
                value=spent,
                details=details,
            )
        ]

    # -- projection -------------------------------------------------------------------

    def _project(self, step: int, source: str, now: float) -> list[Alert]:
        budget = self.settings.budget
        price = self.facts.price_per_gpu_hour
        max_steps = self.facts.max_steps
        gpus = self.state.gpus
        if budget is None or price is None or max_steps is None or gpus is None:
            return []
        assert self.state.first is not None
        started_s, started_step = self.state.first
        if (
            now - started_s < self.settings.projection_min_s
            or step - started_step < self.settings.projection_min_steps
        ):
            return []
        window_s, window_step = self.state.progress[0]
        if now <= window_s or step <= window_step:
            return []
        rate = (step - window_step) / (now - window_s)
        spent = self.state.gpu_s / SECONDS_PER_HOUR * price
        remaining = max(max_steps - step, 0)
        projected = spent + remaining / rate * gpus * price / SECONDS_PER_HOUR
        details: dict[str, Any] = {
            "projected": projected,
            "spent": spent,
            "budget": budget,
            "gpu_hours": self.state.gpu_s / SECONDS_PER_HOUR,
            "gpus": gpus,
            "price_per_gpu_hour": price,
            "steps_per_s": rate,
            "step": step,
            "max_steps": max_steps,
        }
        over = projected / budget - 1
        where = f"step {step} of {max_steps} at {rate:.3g} steps/s"
        if not self.state.projection_open:
            if projected <= budget * (1 + self.settings.projected_margin):
                return []
            self.state.projection_open = True
            return [
                Alert(
                    rule=self.rule,
                    severity=Severity.WARNING,
                    message=(
                        f"projected {format_money(projected)} at completion ({where}):"
                        f" over the {format_money(budget)} budget by {over:.0%}"
                    ),
                    time=now,
                    source=source,
                    step=step,
                    metric="projected_cost",
                    value=projected,
                    details=details,
                )
            ]
        if projected > budget:
            return []
        self.state.projection_open = False
        if self.state.raised:
            # The incident is about money already spent now: that never resolves.
            return []
        return [
            Alert(
                rule=self.rule,
                severity=Severity.INFO,
                message=(
                    f"projected {format_money(projected)} at completion ({where}):"
                    f" back within the {format_money(budget)} budget"
                ),
                time=now,
                source=source,
                step=step,
                metric="projected_cost",
                value=projected,
                resolves=True,
                details=details,
            )
        ]


__all__ = ["CostOverrunConfig", "CostOverrunDetector"]
