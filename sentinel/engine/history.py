"""The last samples of each metric, for incident reports ("the last samples before onset")."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import partial
from itertools import repeat

from sentinel.model.records import Sample

#: Samples of each metric kept.
HISTORY_LEN = 32

#: ``Sample._make`` without its Python-level call: history is kept for every block.
_sample_of = partial(tuple.__new__, Sample)


class History:
    """A ring buffer of ``HISTORY_LEN`` samples per metric, and a count of all seen."""

    __slots__ = ("by_metric", "samples_seen")

    def __init__(self) -> None:
        #: Per metric name, its newest samples (the engine appends to these directly).
        self.by_metric: dict[str, deque[Sample]] = {}
        #: Metric samples seen, kept or not.
        self.samples_seen = 0

    def series(self, name: str) -> deque[Sample]:
        """The kept samples of ``name``, made empty on first use."""
        kept = self.by_metric.get(name)
        if kept is None:
            kept = self.by_metric[name] = deque(maxlen=HISTORY_LEN)
        return kept

    def extend(
        self,
        names: Sequence[str],
        columns: dict[str, list[float]],
        steps: list[int],
        times: list[float] | None,
    ) -> None:
        """A block's lines: one column of values per name, one step (and time) per line."""
        count = len(steps)
        self.samples_seen += count * len(names)
        tail = slice(max(0, count - HISTORY_LEN), count)
        tail_steps = steps[tail]
        tail_times = times[tail] if times is not None else [None] * len(tail_steps)
        for name in names:
            values = columns[name][tail]
            self.series(name).extend(
                map(_sample_of, zip(repeat(name), values, tail_steps, tail_times, repeat(None)))
            )

    def recent(self, before_step: int | None, per_metric: int = 8) -> dict[str, list[Sample]]:
        """The last samples of each metric up to ``before_step`` (inclusive)."""
        out: dict[str, list[Sample]] = {}
        for name, history in self.by_metric.items():
            kept = [
                s for s in history if before_step is None or s.step is None or s.step <= before_step
            ]
            if kept:
                out[name] = kept[-per_metric:]
        return out

    def clear(self) -> None:
        """A new attempt: its steps start again, the samples before it would mislead."""
        self.by_metric.clear()
