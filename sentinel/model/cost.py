"""Money: GPU-hours and what they cost, for the ``cost_overrun`` rule and incident reports.

Amounts carry no currency symbol: ``[cost] price_per_gpu_hour`` is "in your
currency", so every amount is a plain number with two decimals (``412.50``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sentinel.model.facts import RunFacts
from sentinel.model.incidents import Incident

SECONDS_PER_HOUR = 3600.0

#: What a report says when the money of an incident cannot be counted.
UNKNOWN_COST = (
    "unknown: set [cost] price_per_gpu_hour (and [cost] gpus where no GPU is attributed to the job)"
)


def gpu_hours(gpus: float, seconds: float) -> float:
    """GPU-hours of ``gpus`` GPUs held for ``seconds``."""
    return gpus * seconds / SECONDS_PER_HOUR


def money(gpu_hours: float, price_per_gpu_hour: float) -> float:
    """What ``gpu_hours`` cost at ``price_per_gpu_hour``."""
    return gpu_hours * price_per_gpu_hour


def format_money(amount: float) -> str:
    """An amount as sentinel writes it everywhere: two decimals, no currency symbol."""
    return f"{amount:.2f}"


@dataclass(frozen=True)
class IncidentCost:
    """The money an incident cost: its GPUs held from its onset until sentinel acted."""

    gpus: int
    price_per_gpu_hour: float
    #: Epoch seconds: the onset of the incident and the end of the interval counted.
    start_time: float
    end_time: float
    #: What ended the interval: sentinel's first action, the resolution, or the present.
    until: Literal["action", "resolution", "now"]

    @property
    def hours(self) -> float:
        return (self.end_time - self.start_time) / SECONDS_PER_HOUR

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.hours

    @property
    def amount(self) -> float:
        return money(self.gpu_hours, self.price_per_gpu_hour)

    def text(self) -> str:
        """``12.40 (4 GPUs x 1.55 h from onset to action at 2.00/GPU-hour)``."""
        noun = "GPU" if self.gpus == 1 else "GPUs"
        return (
            f"{format_money(self.amount)} ({self.gpus} {noun} x {self.hours:.2f} h"
            f" from onset to {self.until} at {format_money(self.price_per_gpu_hour)}/GPU-hour)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "amount": self.amount,
            "text": self.text(),
            "gpus": self.gpus,
            "hours": self.hours,
            "gpu_hours": self.gpu_hours,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "until": self.until,
        }


def incident_onset_time(incident: Incident) -> float:
    """When the incident began: its own onset, or earlier where a rule says so.

    A rule may put ``details["onset_time"]`` on its alerts when the evidence began
    before the alert (a stall began at the last progress, not at its timeout).
    """
    onset = incident.onset_time
    for alert in incident.alerts:
        stated = alert.details.get("onset_time")
        if isinstance(stated, int | float) and not isinstance(stated, bool):
            onset = min(onset, float(stated))
    return onset


def incident_cost(incident: Incident, facts: RunFacts, now: float) -> IncidentCost | None:
    """The money lost to an incident: from its onset to sentinel's first action.

    Without an action, to its resolution; while it is still open, to ``now``. The
    GPU count is the one known now. None when the price or the GPU count is unknown.
    """
    price = facts.price_per_gpu_hour
    gpus = facts.gpu_count
    if price is None or gpus is None:
        return None
    until: Literal["action", "resolution", "now"]
    if incident.actions:
        end, until = min(time for time, _ in incident.actions), "action"
    elif incident.resolved_at is not None:
        end, until = incident.resolved_at, "resolution"
    else:
        end, until = now, "now"
    start = incident_onset_time(incident)
    return IncidentCost(
        gpus=gpus,
        price_per_gpu_hour=price,
        start_time=start,
        end_time=max(start, end),
        until=until,
    )
