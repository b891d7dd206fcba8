"""Where a run is: its newest step, the step a step-less line implies, the data's own time.

The engine and its block path share one ``RunPosition``: both move it exactly as
feeding the lines one by one would.
"""

from __future__ import annotations

from collections import deque

from sentinel.model.records import PROGRESS, Sample

#: Metrics that mark a line as a training log line (as opposed to an eval line).
TRAINING_LOG_METRICS = frozenset({"loss", "grad_norm", "lr"})

#: The ``now`` of what replay reads before the data's first timestamp: no clock yet.
UNCLOCKED = 0.0

_new_sample = tuple.__new__


#: Steps whose first sight is kept (``RunPosition.seen``).
SEEN_KEPT = 512


class RunPosition:
    """The run's step and time as the engine has seen them.

    ``data_clock`` (replay): time comes from the data's own timestamps, not from the
    caller. ``logging_steps``: step-less training log lines (HF's printed dicts) are
    that many steps apart, counted from ``start_step``.
    """

    __slots__ = (
        "current_step", "data_clock", "data_time", "logged", "logging_steps", "read_since", "seen",
        "start_step",
    )  # fmt: skip

    def __init__(self, *, data_clock: bool = False, logging_steps: int | None = None) -> None:
        self.data_clock = data_clock
        self.logging_steps = logging_steps
        self.start_step = 0
        #: Step-less training lines counted since ``start_step``.
        self.logged = 0
        #: The newest step seen from any source: progress bars and stepped metrics.
        self.current_step: int | None = None
        #: The data's own newest timestamp (replay's clock).
        self.data_time: float | None = None
        #: A time the lines being fed were not written yet (``Engine.feed_texts``): the
        #: previous read of their source, or the start of their read's window if later.
        #: None outside ``feed_texts``.
        self.read_since: float | None = None
        #: When each of the latest steps was written at the earliest (``note_seen``), oldest first.
        self.seen: deque[tuple[int, float]] = deque(maxlen=SEEN_KEPT)

    def note_seen(self, step: int, now: float) -> None:
        """The run reached ``step``, whose line was read at ``now`` (the caller's clock) or
        stamped ``now`` (the data's): it was written after ``read_since``, else at ``now``."""
        since = self.read_since
        self.seen.append((step, now if since is None or self.data_clock else since))

    def logged_before(self, step: int) -> bool:
        """Whether this attempt logged a step before ``step`` (its first values were not
        all at or after it)."""
        return any(seen < step for seen, _ in self.seen)

    def written_after(self, step: int) -> float | None:
        """A time before which ``step``'s line was not written yet: the start of the window
        of the read that found it, or the read of its source before that one if later (its
        own timestamp, with the data's clock), where the step is still among the latest
        kept; None otherwise. What a rollback that places checkpoints by
        time needs of the last healthy value. Not when its line was read: a save between
        it and the first bad value, read together with both, was written before that
        (accelerate's ``checkpoint_6``, of step 35, holding the NaN of step 33, sat
        before an onset time taken from the read of step 30 and was resumed)."""
        found = None
        for seen, at in reversed(self.seen):
            if seen < step:
                break
            if seen == step:
                found = at
        return found

    def restart(self, start_step: int) -> None:
        """A new attempt: steps start again from its checkpoint."""
        self.start_step = start_step
        self.logged = 0
        self.current_step = None
        self.seen.clear()

    def count_step(self, samples: list[Sample]) -> list[Sample]:
        """Give a step-less line the step its position implies: start + n x logging_steps.

        A training line with a step of its own (an HF dict whose epoch gave it one) is the
        cadence's count too: the next step-less one is a logging interval past it."""
        assert self.logging_steps is not None
        has_metric = training = False
        own: int | None = None
        for sample in samples:
            name = sample.name
            if name != PROGRESS:
                if own is None:
                    own = sample.step
                has_metric = True
                training = training or name in TRAINING_LOG_METRICS
        if own is not None:
            if training:
                self.logged = self.logged_at(own, self.logged)
            return samples
        if not has_metric:
            return samples
        if training:
            self.logged += 1  # an eval line belongs to the step last logged
        step = self.start_step + self.logged * self.logging_steps
        return [
            sample
            if sample.name == PROGRESS
            else _new_sample(Sample, (sample.name, sample.value, step, sample.time, None))
            for sample in samples
        ]

    def count_lines(self, names: tuple[str, ...], steps: list[int]) -> None:
        """``count_step`` for lines that each carry their own step (a block's): training
        lines are the cadence's count."""
        if self.logging_steps is None or TRAINING_LOG_METRICS.isdisjoint(names):
            return
        logged = self.logged
        for step in steps:
            logged = self.logged_at(step, logged)
        self.logged = logged

    def logged_at(self, step: int, logged: int) -> int:
        """The count of logged lines after a training line at its own ``step`` (``logged``
        before it): the logging intervals from the attempt's start to that step; before
        the start (a line from an earlier attempt), the count is left as it was."""
        assert self.logging_steps is not None
        if step < self.start_step:
            return logged
        return (step - self.start_step) // self.logging_steps
