"""cost_overrun: spend or projected spend at completion passes the budget.

Spend is price per GPU-hour x GPUs x the time the job held them, summed over
every attempt of the job this sentinel ran (the budget is for the run, so a
restart does not start it again). The projection adds what the remaining steps
will cost at the recent step rate, so a run whose throughput halves is flagged
hours before the money is actually gone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from itertools import islice
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from sentinel.cost import SECONDS_PER_HOUR, format_money
from sentinel.detectors import BaseDetector, MetricNames, RuleConfig
from sentinel.detectors.cost_blocks import taken
from sentinel.records import Alert, Block, Sample, Severity
from sentinel.sources import GPU_JOB

#: Relative slack when comparing spend to a level: 80.0 reached through float sums is 80%.
_EPSILON = 1e-9


class CostOverrunConfig(RuleConfig):
    """``[rules.cost_overrun]``.

    DESIGN's table: warn at 80% of the budget spent, critical at 100%, and warn
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

    def __init__(self, config: CostOverrunConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._step_metrics = frozenset(config.step_metrics)
        # Without a budget the rule has nothing to judge: it costs nothing per sample.
        self.watches = self._step_metrics | {GPU_JOB} if config.budget is not None else frozenset()
        self._gpu_s = 0.0
        #: Seconds held before any GPU count was known: charged at the first count known
        #: (the GPU source attributes the GPUs a poll or two after the job took them).
        self._unknown_s = 0.0
        #: Start of the interval not yet charged, while an attempt runs; else None.
        self._since: float | None = None
        #: GPU count at ``_since`` (the last one known).
        self._gpus: int | None = None
        self._started = False
        #: Budget fractions already alerted on (warn, critical, kill), for the whole run.
        self._raised: set[str] = set()
        self._projection_open = False
        self._last_step: int | None = None
        #: (time, step) of each new step of the current attempt, within the rate window.
        self._progress: deque[tuple[float, int]] = deque()
        #: (time, step) of the current attempt's first step: the evidence starts there.
        self._first: tuple[float, int] | None = None

    # -- hooks ------------------------------------------------------------------------

    def job_started(self, now: float) -> None:
        if self._since is not None:
            self._accrue(now)  # the previous attempt's exit was never reported
        self._started = True
        self._since = now
        count = self.facts.gpu_count
        if count is not None:
            self._gpus = count
        self._last_step = None
        self._progress.clear()
        self._first = None

    def job_exited(self, exit_code: int, now: float, *, expected: bool) -> list[Alert]:
        alerts = self._spend(now)
        self._since = None
        return alerts

    def tick(self, now: float) -> list[Alert]:
        if self.settings.budget is None:
            return []
        if not self._started:
            self.job_started(now)
        return self._spend(now)

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        if self._since is None:
            return []  # no attempt running (replay before its first timestamp)
        alerts = self._spend(now)
        step = sample.step
        if sample.name not in self._step_metrics or step is None:
            return alerts
        if self._last_step is not None and step <= self._last_step:
            return alerts
        self._last_step = step
        if self._first is None:
            self._first = (now, step)
        self._progress.append((now, step))
        # Keep one point at or before the window's start, so the span covers the window.
        start = now - self.settings.rate_window_s
        while len(self._progress) > 1 and self._progress[1][0] <= start:
            self._progress.popleft()
        return alerts + self._project(step, source, now)

    # -- blocks -----------------------------------------------------------------------

    def can_absorb(self, block: Block) -> bool:
        """Without a budget, always: nothing is judged. With one, when the spend at the
        block's last clock reaches no level not yet raised (spend only grows, so it did
        not before either) and the projection at each new step, worked out as line by
        line would, neither opens nor closes."""
        return taken(self, block, judge=True) is not None

    def absorb(self, block: Block) -> None:
        state = taken(self, block, judge=False)
        if state is None:
            raise ValueError("cost_overrun was handed a block it refused")
        self._since, self._gpu_s, self._unknown_s, points, dropped = state
        if points:
            self._first = self._first or points[0]
            self._last_step = points[-1][1]
            self._progress.extend(points)
            self._progress = deque(islice(self._progress, dropped, None))

    # -- spend ------------------------------------------------------------------------

    def _accrue(self, now: float) -> None:
        """Charge the GPU-seconds since the last call; note the GPU count known now."""
        count = self.facts.gpu_count
        if self._since is not None and now > self._since:
            held_s = now - self._since
            if self._gpus is None:
                self._unknown_s += held_s
            else:
                self._gpu_s += (held_s + self._unknown_s) * self._gpus
                self._unknown_s = 0.0
            self._since = now
        if count is not None:
            self._gpus = count

    def _reached(self, gpu_s: float) -> list[str]:
        """The levels (warn, critical, kill) ``gpu_s`` GPU-seconds of spend reach: a prefix."""
        settings, price = self.settings, self.facts.price_per_gpu_hour
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

    def _spend(self, now: float) -> list[Alert]:
        self._accrue(now)
        reached = self._reached(self._gpu_s)
        if not reached or reached[-1] in self._raised:
            return []
        budget = self.settings.budget
        price = self.facts.price_per_gpu_hour
        assert budget is not None and price is not None
        gpu_hours = self._gpu_s / SECONDS_PER_HOUR
        spent = gpu_hours * price
        # A jump past several levels raises only the highest: one page, not three.
        self._raised.update(reached)
        level = reached[-1]
        details: dict[str, Any] = {
            "spent": spent,
            "budget": budget,
            "fraction_spent": spent / budget,
            "gpu_hours": gpu_hours,
            "gpus": self._gpus,
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
                step=self._last_step,
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
        gpus = self._gpus
        if budget is None or price is None or max_steps is None or gpus is None:
            return []
        assert self._first is not None
        started_s, started_step = self._first
        if (
            now - started_s < self.settings.projection_min_s
            or step - started_step < self.settings.projection_min_steps
        ):
            return []
        window_s, window_step = self._progress[0]
        if now <= window_s or step <= window_step:
            return []
        rate = (step - window_step) / (now - window_s)
        spent = self._gpu_s / SECONDS_PER_HOUR * price
        remaining = max(max_steps - step, 0)
        projected = spent + remaining / rate * gpus * price / SECONDS_PER_HOUR
        details: dict[str, Any] = {
            "projected": projected,
            "spent": spent,
            "budget": budget,
            "gpu_hours": self._gpu_s / SECONDS_PER_HOUR,
            "gpus": gpus,
            "price_per_gpu_hour": price,
            "steps_per_s": rate,
            "step": step,
            "max_steps": max_steps,
        }
        over = projected / budget - 1
        where = f"step {step} of {max_steps} at {rate:.3g} steps/s"
        if not self._projection_open:
            if projected <= budget * (1 + self.settings.projected_margin):
                return []
            self._projection_open = True
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
        self._projection_open = False
        if self._raised:
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
