"""One view of the run: each rank its own series, each observation once.

A job of many ranks often prints into one stream; a run often writes the same metrics
into several files (TensorBoard events and a CSV, stdout and ``trainer_state.json``).
``RunSeries`` decides, line by line, before the rules see the samples:

- the line's rank: the one its prefix names (``Sample.rank``, ``parsers.ranks``), or, for
  unlabelled lines, the series it continues. A stream that logs a step it already logged,
  with other values, right after logging it (two ranks printing the same format) holds
  several series: each line goes to the series that has not had its step yet and whose
  last value is nearest its own (ranks an order of magnitude apart stay apart); such
  series are numbered in order of appearance (``rank`` 0, 1...); a NaN that could be
  either's names no rank and goes to the first series. What tells another rank from a
  resume is that ranks interleave: a stream that goes back once and then rises alone has
  resumed (from a checkpoint one or two logged steps back, or far behind): it starts
  again as one series. Only a stream that goes back again within ``INTERLEAVE_LINES``
  lines of going back holds another rank (a one-writer file never does);
- which samples are new observations: a metric at a step it was already seen at, or
  behind, from another source of the run is the same observation (or a late copy of it)
  and is dropped; a non-finite value only when that metric was non-finite at that very
  step in another source (a NaN is never lost). Lines that repeat themselves exactly in
  one stream are dropped too.

Only samples that carry their own step take part: a step the engine filled in (from a
progress bar) says nothing about ranks or copies. ``restart`` (a new attempt) forgets it all.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from itertools import islice, repeat
from operator import lt
from pathlib import PurePath

from sentinel.engine.routes import overrides
from sentinel.model.records import PROGRESS, Alert, Block, Sample
from sentinel.rules import BaseDetector

#: How many of a stream's newest distinct steps a repeated step may be one of and still be
#: another rank's (ranks in lockstep print the same step one after another); further back it
#: is a restart.
RANK_WINDOW = 2
#: A stream that goes back again within this many of its lines after going back holds
#: another rank: ranks interleave (in lockstep every other line; a rank ``RANK_WINDOW``
#: steps behind, every ``2 * RANK_WINDOW`` lines). Once back, a resumed job rises alone.
INTERLEAVE_LINES = 4 * RANK_WINDOW
#: Series an unlabelled stream may hold: more lines at one step than this are not ranks
#: but one series that names the same step many times (``Epoch 2 - Batch loss: 0.83``, a
#: batch's loss each, its epoch the only counter): the stream is one series from then on.
SLOTS_MAX = 64
#: ``_Stream.place``: a line no series can be told to own.
UNPLACED = -1
#: Hooks of a rule that watches the job, not a metric series: such a rule is not made per rank.
_JOB_HOOKS = ("tick", "output", "output_text", "job_exited")
#: Steps of each metric whose values are kept, to tell a late copy from another rank's value.
RECENT_KEPT = 1024
#: Values of two sources at one step this close (relative) are one observation printed twice.
COPY_TOLERANCE = 1e-3
#: A rank in a file's name: ``metrics_rank1.jsonl``, ``rank-1.log``.
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
#: Kinds of line (source, metric names) whose series are kept.
STREAMS_MAX = 4096
#: Non-finite steps remembered per metric (past that many, they are forgotten at once).
NONFINITE_KEPT = 4096


class _Slot:
    """One series of an unlabelled stream: its last step, the values of that line, and
    the last finite first value (what a line is matched by)."""

    __slots__ = ("level", "step", "values")

    def __init__(self, step: int, values: tuple[float, ...]) -> None:
        self.step = step
        self.values = values
        self.level = math.nan
        self.move(step, values)

    def move(self, step: int, values: tuple[float, ...]) -> None:
        self.step = step
        self.values = values
        if values and math.isfinite(values[0]):
            self.level = values[0]


class _Stream:
    """The series of one kind of line (one source, one set of stepped metric names)."""

    __slots__ = ("back_at", "before", "flat", "last", "lines", "one_writer", "recent", "slots")

    def __init__(self, step: int, values: tuple[float, ...], *, one_writer: bool = False) -> None:
        self.slots = [_Slot(step, values)]
        #: The last line placed (its step, values and series), and the values of the line
        #: before it: a progress bar that moved before its postfix did.
        self.last: tuple[int, tuple[float, ...], int] = (step, values, 0)
        self.before: tuple[float, ...] | None = None
        self.recent: deque[int] = deque([step], maxlen=RANK_WINDOW)
        #: A file one logger writes (a CSV, TensorBoard events): a step again is a resume.
        self.one_writer = one_writer
        #: Lines placed, and how many had been when the stream last went back (no series
        #: open for its step): a resume, or one more rank if it goes back again soon.
        self.lines = 0
        self.back_at = -INTERLEAVE_LINES - 1
        #: More lines came at one step than ``SLOTS_MAX`` ranks print: one series, for good.
        self.flat = False

    def place(self, step: int, values: tuple[float, ...]) -> int | None:
        """The index of the series a line at ``step`` continues; None for a repeat of a line;
        ``UNPLACED`` for a value that cannot be matched (NaN) while several series wait for
        this step: it goes to no series, which stays open for the line that is its own."""
        slots = self.slots
        self.lines += 1
        last_step, last_values, last_index = self.last
        if len(slots) == 1 and step > slots[0].step:
            index = 0
        elif (
            step == last_step
            and last_index < len(slots)
            and self._moved_before_postfix(last_values, values)
        ):
            # A bar redrawn at the count it just moved to, its postfix caught up (Lightning's
            # bar moves, then shows the step's metrics): the same series, not another rank.
            index = last_index
        else:
            open_slots = [index for index, slot in enumerate(slots) if slot.step < step]
            if len(open_slots) > 1 and not math.isfinite(values[0]):
                return UNPLACED
            if open_slots:
                index = min(open_slots, key=lambda at: _distance(values, slots[at].level))
            elif any(slot.step == step and _same(slot.values, values) for slot in slots):
                return None
            elif step in self.recent and self._interleaves():
                if len(slots) >= SLOTS_MAX or self.flat:
                    self.flat = True  # no ranks: one series at the same step, line after line
                    slots[:] = [_Slot(step, values)]
                    index = 0
                else:
                    index = len(slots)
                    slots.append(_Slot(step, values))
                self.back_at = self.lines
            else:  # a resume (near or far behind), not another rank, until it interleaves
                slots[:] = [_Slot(step, values)]
                self.recent.clear()
                index = 0
                self.back_at = self.lines
        slots[index].move(step, values)
        self.before, self.last = last_values, (step, values, index)
        if step not in self.recent:
            self.recent.append(step)
        return index

    def _moved_before_postfix(
        self, last_values: tuple[float, ...], values: tuple[float, ...]
    ) -> bool:
        """Whether the last line showed the values of the line before it at a new step (a
        bar whose count moved with the last step's postfix) and this one shows new ones."""
        before = self.before
        return before is not None and _same(last_values, before) and not _same(values, last_values)

    def rise(
        self,
        steps: list[int],
        values: tuple[float, ...],
        firsts: list[float],
        previous: tuple[float, ...] | None = None,
    ) -> None:
        """``place`` for lines at ``steps``, rising past the step of the stream's one series,
        the last line's values ``values``, each line's first value in ``firsts``, the values
        of the line before the last in ``previous`` (None: the stream's last line was)."""
        if not steps:
            return
        self.before = self.last[1] if previous is None else previous
        self.last = (steps[-1], values, 0)
        self.lines += len(steps)
        slot = self.slots[0]
        slot.step, slot.values = steps[-1], values
        for value in reversed(firsts):
            if math.isfinite(value):
                slot.level = value
                break
        self.recent.extend(steps[-RANK_WINDOW:])

    def _interleaves(self) -> bool:
        """Whether the stream went back, with no series open for its step, a few lines ago
        (another rank's lines, interleaved): once is a resume."""
        return not self.one_writer and self.lines - self.back_at <= INTERLEAVE_LINES


def _distance(values: tuple[float, ...], level: float) -> float:
    """How far a line's first value is from a series' level, in orders of magnitude; a
    value that cannot be compared (non-finite, zero) is as near to every series."""
    a, b = abs(values[0]), abs(level)
    if not (math.isfinite(a) and math.isfinite(b)) or a == 0.0 or b == 0.0:
        return 0.0 if not math.isfinite(a) or a == 0.0 else math.inf
    return abs(math.log(a / b))


def _same(values: tuple[float, ...], other: tuple[float, ...], *, close: bool = False) -> bool:
    """Whether two lines hold the same values: equal, or with ``close`` equal as far as
    a printed value is (``COPY_TOLERANCE``: a CSV's float64 and TensorBoard's float32, or a
    ``%.4g`` print); NaN is NaN."""
    same = _close_value if close else _same_value
    return len(values) == len(other) and all(map(same, values, other))


def _same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _close_value(a: float, b: float) -> bool:
    return _same_value(a, b) or math.isclose(a, b, rel_tol=COPY_TOLERANCE)


class RunSeries:
    """Per line: its rank, and its samples that are new observations (see module doc)."""

    __slots__ = ("_epoch_at", "_last", "_nonfinite", "_recent", "_source_rank", "_streams")

    def __init__(self) -> None:
        # Per (source, stepped metric names): the series of unlabelled lines.
        self._streams: dict[tuple[str, tuple[str, ...]], _Stream] = {}
        # Per (metric, rank): the newest step it was seen at, its value and its source.
        self._last: dict[tuple[str, int | None], tuple[int, float, str]] = {}
        # Per (metric, rank): its last ``RECENT_KEPT`` steps, each with its value and source.
        self._recent: dict[tuple[str, int | None], dict[int, tuple[float, str]]] = {}
        # Per (metric, rank): the steps it was non-finite at, each with its source.
        self._nonfinite: dict[tuple[str, int | None], dict[int, str]] = {}
        # Sources whose values differ from another source's at the same steps: a rank's own
        # file (``metrics_rank1.jsonl``), with the rank its lines are.
        self._source_rank: dict[str, int] = {}
        #: Per source, the step and epoch its last unlabelled line named.
        self._epoch_at: dict[str, tuple[int, float]] = {}

    def restart(self) -> None:
        """A new attempt: its steps start again."""
        self._streams.clear()
        self._epoch_at.clear()
        self._last.clear()
        self._recent.clear()
        self._nonfinite.clear()

    def _epoch_moved(self, stepped: list[Sample], source: str) -> bool:
        """Whether an unlabelled line names the step the source's last line named, at
        another epoch: a count within the epoch, not a rank's step (MindSpore's
        ``epoch: 3 step: 1875, loss is 0.23``, an epoch's bar ending at its ``99it``)."""
        epoch = _epoch_of(stepped)
        if epoch is None:
            return False
        step: int = stepped[0][2]  # type: ignore[assignment]
        before = self._epoch_at.get(source)
        self._epoch_at[source] = (step, epoch)
        return before is not None and before[0] == step and before[1] != epoch

    def admit(self, samples: Iterable[Sample], source: str) -> tuple[list[Sample], int | None]:
        """The samples of one line that are new observations, and the line's rank (None:
        unlabelled, in a stream of one series)."""
        samples = list(samples)
        if not samples:
            return samples, None
        first = samples[0]
        labelled: int | None = first[4] if len(first) > 4 else None
        stepped = [sample for sample in samples if sample[2] is not None and sample[0] != PROGRESS]
        if not stepped:
            return samples, labelled
        rank = labelled if labelled is not None else self._source_rank.get(source)
        # (Kept for every stepped line, so the next is compared with the one just before.)
        moved = self._epoch_moved(stepped, source)
        if rank is None and not moved and not _at_its_epoch(stepped):
            names = tuple([sample[0] for sample in stepped])
            values = tuple([sample[1] for sample in stepped])
            step: int = stepped[0][2]  # type: ignore[assignment]
            key = (source, names)
            stream = self._streams.get(key)
            if stream is None:
                if len(self._streams) >= STREAMS_MAX:
                    self._streams.clear()  # a log of ever new schemas: start over
                self._streams[key] = _Stream(step, values, one_writer=one_writer(source))
            else:
                index = stream.place(step, values)
                if index is None:
                    return [sample for sample in samples if sample not in stepped], None
                if index != UNPLACED and len(stream.slots) > 1:
                    rank = index
        last, recent = self._last, self._recent
        series_rank = rank or None  # rank 0 and unlabelled lines are one series (rank 0's rules)
        kept: list[Sample] = []
        for sample in samples:
            name, value, step_of = sample[0], sample[1], sample[2]
            if step_of is None or name == PROGRESS:
                kept.append(sample)
                continue
            key_of = (name, series_rank)
            seen = last.get(key_of)
            kept_steps = recent.get(key_of)
            if seen is not None and seen[2] != source and step_of <= seen[0]:
                earlier = kept_steps.get(step_of) if kept_steps is not None else None
                if (
                    earlier is not None
                    and earlier[1] != source
                    and not _same(values=(value,), other=(earlier[0],), close=True)
                    and series_rank is None
                    and labelled is None
                    and may_be_a_ranks_file(source)
                    and may_be_a_ranks_file(earlier[1])
                ):
                    # Another series at the same steps, not a copy: a rank's own file.
                    self._source_rank[source] = self._rank_of(source)
                    return self.admit(samples, source)
                if math.isfinite(value) or self._seen_nonfinite(key_of, step_of, source):
                    continue  # the same observation, or a late copy of one
            elif not math.isfinite(value) and self._seen_nonfinite(key_of, step_of, source):
                continue  # the same NaN, read in another file of the run
            if seen is None or step_of >= seen[0] or seen[2] == source:
                last[key_of] = (step_of, value, source)
            if kept_steps is None:
                kept_steps = recent[key_of] = {}
            elif len(kept_steps) >= RECENT_KEPT:
                del kept_steps[next(iter(kept_steps))]
            kept_steps.setdefault(step_of, (value, source))
            kept.append(sample)
        return kept, rank

    def _rank_of(self, source: str) -> int:
        """The rank of a file whose series is its own: the one its name says (``rank1``),
        else the next after those known. Never 0: rank 0's rules have the first series."""
        taken = self._source_rank.values()
        path = PurePath(source)
        named = _RANK_IN_NAME.search(path.name) or _RANK_IN_NAME.search(str(path.parent))
        if named is not None and int(named.group(1)) > 0 and int(named.group(1)) not in taken:
            return int(named.group(1))
        return 1 + max(taken, default=0)

    def _seen_nonfinite(self, key: tuple[str, int | None], step: int, source: str) -> bool:
        """Whether another source had this metric non-finite at ``step``; notes this one."""
        steps = self._nonfinite.get(key)
        if steps is None:
            steps = self._nonfinite[key] = {}
        elif len(steps) >= NONFINITE_KEPT:
            steps.clear()
        first = steps.setdefault(step, source)
        return first != source

    def takes_block(self, block: Block) -> bool:
        """Whether a block of one source's lines (unlabelled, each with its own step) may
        go to the rules whole: its values are finite (a non-finite one is noted, and may be
        another source's, line by line) and its steps rise, past every step its metrics
        were seen at."""
        if block.source in self._source_rank:
            return False  # a rank's own file: its lines go to that rank's rules
        steps = block.steps
        if not all(map(lt, steps, islice(steps, 1, None))):
            return False
        first = steps[0]
        stream = self._streams.get((block.source, block.names))
        if stream is not None and (len(stream.slots) > 1 or stream.slots[0].step >= first):
            return False
        return self._finite_past_seen(block, None)

    def _finite_past_seen(self, block: Block, rank: int | None) -> bool:
        """Whether each of the block's metrics is finite throughout and starts past the
        newest step it was seen at on ``rank`` (None: the run's own series)."""
        first, last = block.steps[0], self._last
        for name in block.names:
            seen = last.get((name, rank))
            if seen is not None and seen[0] >= first:
                return False
            if not math.isfinite(sum(block.columns[name])):
                return False  # a finite sum has no NaN or infinity in it
        return True

    def rank_of(self, source: str) -> int | None:
        """The rank whose own file ``source`` is (above 0), or None."""
        return self._source_rank.get(source)

    def takes_rank_block(self, block: Block, rank: int) -> bool:
        """Whether a block of rank ``rank``'s own file (``rank_of``) may go to that rank's
        rules whole: its values are finite and its steps rise, past every step its metrics
        were seen at on that rank, so ``admit`` would keep every sample as it comes."""
        steps = block.steps
        if not all(map(lt, steps, islice(steps, 1, None))):
            return False
        return self._finite_past_seen(block, rank)

    def took_rank_block(self, block: Block, rank: int) -> None:
        """Move past a block of a rank's own file its rules took whole (``takes_rank_block``),
        as ``admit`` on each line would: the newest step and the recent values of each metric
        on that rank."""
        steps, source = block.steps, block.source
        last, recent = self._last, self._recent
        for name in block.names:
            key = (name, rank)
            values = block.columns[name]
            last[key] = (steps[-1], values[-1], source)
            kept = recent.get(key)
            if kept is None:
                kept = recent[key] = {}
            _keep_recent(kept, steps, values, source)

    def took_block(self, block: Block) -> None:
        """Move past a block the rules took whole (``takes_block``), as ``admit`` on each
        line would: the stream's last line, each metric's newest step and recent values."""
        steps = block.steps
        if not steps:
            return
        step = steps[-1]
        columns = [block.columns[name] for name in block.names]
        values = tuple([column[-1] for column in columns])
        firsts = columns[0] if columns else []
        previous = tuple([column[-2] for column in columns]) if len(steps) > 1 else None
        key = (block.source, block.names)
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= STREAMS_MAX:
                self._streams.clear()  # as admit does
            first = tuple([column[0] for column in columns])
            stream = self._streams[key] = _Stream(
                steps[0], first, one_writer=one_writer(block.source)
            )
            stream.rise(steps[1:], values, firsts[1:], previous)
        else:
            stream.rise(steps, values, firsts, previous)
        last, recent = self._last, self._recent
        for name, value in zip(block.names, values, strict=True):
            last[(name, None)] = (step, value, block.source)
            kept = recent.get((name, None))
            if kept is None:
                kept = recent[(name, None)] = {}
            _keep_recent(kept, steps, block.columns[name], block.source)


def _keep_recent(
    kept: dict[int, tuple[float, str]], steps: list[int], values: list[float], source: str
) -> None:
    """Keep each step's value and source in ``kept``, as ``admit`` does line by line: the
    first value of a step stays, and past ``RECENT_KEPT`` steps the oldest goes first."""
    if not kept.keys().isdisjoint(steps):
        for step, value in zip(steps, values, strict=True):
            if len(kept) >= RECENT_KEPT:
                del kept[next(iter(kept))]
            kept.setdefault(step, (value, source))
        return
    # New steps only: the oldest kept ones go, as many as pass the bound, then the new.
    over = len(kept) + len(steps) - RECENT_KEPT
    if over >= len(kept):
        kept.clear()
        start = len(steps) - RECENT_KEPT if len(steps) > RECENT_KEPT else 0
        kept.update(zip(steps[start:], zip(values[start:], repeat(source)), strict=True))
        return
    if over > 0:
        for step in list(islice(kept, over)):
            del kept[step]
    kept.update(zip(steps, zip(values, repeat(source)), strict=True))


def may_be_a_ranks_file(source: str) -> bool:
    """Whether ``source``, whose values differ from another source's at the same steps, may
    be a rank's own file, or that other one another rank's: a file one logger writes only
    where its path names a rank (``rank_1/events...``). Lightning writes its CSV and
    TensorBoard files from rank 0, and their values differ from the job's progress bar,
    which draws a step's values a redraw late: read as ranks, a one-process job had three
    (its NaN raised on "ranks" 1 and 2), or its output was "rank 1" where the CSV came first."""
    return not one_writer(source) or _RANK_IN_NAME.search(source) is not None


def _epoch_of(stepped: list[Sample]) -> float | None:
    return next((sample[1] for sample in stepped if sample[0] == "epoch"), None)


def _at_its_epoch(stepped: list[Sample]) -> bool:
    """Whether an unlabelled line's step is its own epoch (``BMN training loss(epoch 0):
    tem_loss: ...``, a loop whose epoch is its only counter): many lines of one process
    name it in turn, which is no rank's step. Such lines are one series."""
    step = stepped[0][2]
    return any(sample[0] == "epoch" and sample[1] == step for sample in stepped)


def one_writer(source: str) -> bool:
    """Whether ``source`` is a metrics file one logger writes (Lightning's CSV, TensorBoard
    event files, MLflow's store), whose step logged again is a resume, never another rank;
    a text log or the job's output may hold every rank's lines."""
    path = PurePath(source)
    return path.suffix in (".csv", ".tsv") or "tfevents" in path.name or "mlruns" in path.parts


def rank_rules(detectors: Sequence[BaseDetector]) -> list[BaseDetector]:
    """New rules for one more rank: those of ``detectors`` that judge a metric series (no
    tick, output or exit hook, no progress), each with the same settings. The time- and
    process-based rules (stall, job_crash, gpu_*, cost) stay one per job."""
    return [
        type(detector)(detector.config)
        for detector in detectors
        if not detector.sees_progress and not any(overrides(detector, hook) for hook in _JOB_HOOKS)
    ]


def with_rank(alerts: Sequence[Alert], rank: int) -> list[Alert]:
    """Alerts raised on one rank's series, naming the rank (in the text and ``details``)."""
    return [
        replace(
            alert,
            message=f"rank {rank}: {alert.message}",
            details={**alert.details, "rank": rank},
        )
        for alert in alerts
    ]


__all__ = ["INTERLEAVE_LINES", "RANK_WINDOW", "RunSeries", "rank_rules", "with_rank"]
