"""Facts about the run that its log states in passing: batch size, total steps.

Explaining an incident needs them ("inspect samples 72-75"), and the HF
Trainer prints them once at the start (at info verbosity)::

    Total train batch size (w. parallel, distributed & accumulation) = 32
    Total optimization steps = 1,000

``RunFacts`` picks them up from lines and from ``trainer_state.json``, with
the ``[training]`` config as the fallback (``Settings.run_facts``). The line check is a substring
test first, so it costs nothing on the usual line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_TOTAL_BATCH = re.compile(r"Total train batch size[^=]*=\s*([\d,]+)")
_TOTAL_STEPS = re.compile(r"Total optimization steps\s*=\s*([\d,]+)")


@dataclass(frozen=True)
class ReferenceCurve:
    """A finished run of the same recipe (``--reference``): per metric, its logged
    ``(step, value)`` pairs in step order, and where it was read from."""

    source: str
    series: Mapping[str, tuple[tuple[int, float], ...]]


@dataclass(frozen=True)
class Resumed:
    """Where an attempt resumed after a rollback: what the ``recovery`` rule judges it by."""

    #: The attempt's number (2 for the first restart).
    attempt: int
    #: The step of the checkpoint it resumed from (None: unknown, or from scratch).
    step: int | None
    #: The onset of the failure rolled back from, and its rule.
    onset_step: int | None
    cause: str


@dataclass
class RunFacts:
    """What is known about the run; each fact from the log, else from the config."""

    samples_per_step: int | None = None
    max_steps: int | None = None
    #: GPUs the job holds, when configured (``[cost] gpus``); else the rules count the
    #: GPUs the GPU source attributes to the job.
    gpus: int | None = None
    #: ``[cost] price_per_gpu_hour``; None when no money is counted.
    price_per_gpu_hour: float | None = None
    #: GPU sources (``gpu:<index>``) the GPU source attributes to the job, as last read.
    job_gpus: set[str] = field(default_factory=set)
    #: The curve a healthy run of the same recipe followed (``[reference] path``).
    reference: ReferenceCurve | None = None
    #: Whether leaving the reference's band acts on its own (``[reference] act``).
    reference_acts: bool = False
    #: The current attempt resumed after a rollback (None: a first attempt, or not so).
    resumed: Resumed | None = None

    @property
    def gpu_count(self) -> int | None:
        """GPUs the job holds: configured, else attributed, else unknown (None)."""
        if self.gpus is not None:
            return self.gpus
        return len(self.job_gpus) or None

    def observe_gpu(self, source: str, attached: bool) -> None:
        """The GPU source says whether GPU ``source`` is the job's."""
        if attached:
            self.job_gpus.add(source)
        else:
            self.job_gpus.discard(source)

    def observe_line(self, text: str) -> None:
        """Take any fact the line states (the log beats the config: it is what ran)."""
        if "Total " not in text:
            return
        batch = _TOTAL_BATCH.search(text)
        if batch:
            self.samples_per_step = int(batch.group(1).replace(",", ""))
        steps = _TOTAL_STEPS.search(text)
        if steps:
            self.max_steps = int(steps.group(1).replace(",", ""))

    def observe_trainer_state(
        self, state: dict[str, Any], *, accumulation_steps: int = 1, world_size: int = 1
    ) -> None:
        """Facts from HF's ``trainer_state.json``; its batch size is per device, per micro-batch.

        ``accumulation_steps`` and ``world_size`` (``[training]``) make it a step's.
        """
        max_steps = state.get("max_steps")
        if isinstance(max_steps, int) and max_steps > 0:
            self.max_steps = max_steps
        batch = state.get("train_batch_size")
        if self.samples_per_step is None and isinstance(batch, int) and batch > 0:
            self.samples_per_step = batch * accumulation_steps * world_size
