"""cost_overrun: spend or projected spend at completion passes the budget.

Spend is price per GPU-hour x GPUs x the time the job held them, summed over
every attempt of the job this sentinel ran (the budget is for the run, so a
restart does not start it again). The projection adds what the remaining steps
will cost at the recent step rate, so a run whose throughput halves is flagged
hours before the money is actually gone.
"""

from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Any

from sentinel.model.cost import SECONDS_PER_HOUR, format_money
from sentinel.model.machine import GPU_JOB
from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector
from sentinel.rules.cost_blocks import CostOverrunConfig, CostState, Taken, reached_levels, taken


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

    def job_exited(self, exit_code: int, now: float, *, expected: bool) -> list[Alert]:
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
