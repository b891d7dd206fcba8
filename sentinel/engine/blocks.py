"""The engine's block path: a batch of lines shown to the rules as columns.

``Engine.feed_texts`` hands a batch to its ``BlockFeeder``. A run of JSON lines of
one schema, or a stretch of HF Trainer output replayed before any timestamp,
becomes a ``Block``; each rule it concerns says whether the block is uneventful
for it (``BaseDetector.can_absorb``), and if all say so each takes it in one call
(``absorb``), which leaves exactly the state feeding it line by line leaves.
Otherwise the block is halved, down to a few lines fed one by one (through the
engine's own ``feed_text``), so the lines around an alert cost what they always did.
A block of a rank's own file (``RunSeries.rank_of``) goes the same way to that rank's
rules (``Engine._feed_rank_block``): 64 ranks' files cost what one file of their lines does.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from itertools import accumulate, groupby, repeat

from sentinel.engine.history import History
from sentinel.engine.position import TRAINING_LOG_METRICS, UNCLOCKED, RunPosition
from sentinel.engine.ranks import RunSeries
from sentinel.engine.routes import Routes
from sentinel.model.records import Alert, Block
from sentinel.parsing import LineParser
from sentinel.parsing.columns import Columns, parse_runs
from sentinel.parsing.hf_blocks import BAR, DICT, HfPiece, read_hf
from sentinel.rules import BaseDetector

log = logging.getLogger(__name__)

#: Lines shown to the rules as one block at most, and at least: fewer are fed line by
#: line, where a block was refused or would not parse. With every rule on, a line fed
#: alone costs about 70 us and a block of 4 to 25 lines 150-250 us (warm; bench/RESULTS.md).
BLOCK_MAX_LINES = 4096
BLOCK_MIN_LINES = 4

#: The engine's ``feed_text``: one line of a source read at ``now``, its alerts.
FeedText = Callable[[str, str, float], list[Alert]]
#: The engine's way to take out a rule that raised: the alert that says so.
Disable = Callable[[BaseDetector, Exception, float], Alert]
#: The engine's way to show a block of a rank's own file (the rank, above 0) to that
#: rank's rules whole: the alerts, or None where its lines must go one by one.
FeedRankBlock = Callable[[int, Block], list[Alert] | None]


def first_non_finite(parsed: Columns) -> int | None:
    """The index of the first line holding a NaN or an infinity, if any."""
    first = None
    for values in parsed.columns.values():
        if not math.isfinite(sum(values)):  # a sum of finite values may overflow: a look more
            index = next((i for i, value in enumerate(values) if not math.isfinite(value)), None)
            if index is not None and (first is None or index < first):
                first = index
    return first


class BlockFeeder:
    """Shows the rules batches of lines as blocks, moving the run's position, history and
    parser counts exactly as ``feed_text`` on each line would."""

    def __init__(
        self,
        *,
        parser: LineParser,
        position: RunPosition,
        history: History,
        routes: Routes,
        series: RunSeries | None,
        feed_text: FeedText,
        feed_rank_block: FeedRankBlock,
        disable: Disable,
    ) -> None:
        self.parser = parser
        self.position = position
        self.history = history
        self.routes = routes
        #: The run's series (``engine_ranks``): a block goes whole only past what it has seen.
        self.series = series
        self._feed_text = feed_text
        self._feed_rank_block = feed_rank_block
        self._disable = disable
        #: Lines the rules took as blocks rather than one by one.
        self.lines_absorbed = 0

    def feed(self, source: str, texts: list[str], now: float) -> list[Alert]:
        """Runs of JSON-object lines as blocks; other lines as HF output or one by one."""
        if not self.parser.reads_json_blocks:
            return self._feed_other(source, texts, now)
        if texts[0][:2] == '{"' and "\n".join(texts).count('\n{"') == len(texts) - 1:
            return self._feed_json(source, texts, now)  # the usual metrics file: one pass
        starts = list(map(str.startswith, texts, repeat('{"')))
        alerts: list[Alert] = []
        start = 0
        for is_json, group in groupby(starts):
            stop = start + sum(1 for _ in group)
            part = texts[start:stop]
            if is_json and len(part) >= BLOCK_MIN_LINES:
                alerts += self._feed_json(source, part, now)
            elif is_json:
                alerts += self.feed_each(source, part, now)
            else:
                alerts += self._feed_other(source, part, now)
            start = stop
        return alerts

    def feed_each(self, source: str, texts: list[str], now: float) -> list[Alert]:
        """The lines one by one, through the engine's ``feed_text``."""
        alerts: list[Alert] = []
        feed_text = self._feed_text
        for text in texts:
            found = feed_text(source, text, now)
            if found:
                alerts += found
        return alerts

    def _feed_other(self, source: str, texts: list[str], now: float) -> list[Alert]:
        """Lines that are not JSON objects: in blocks where they are HF Trainer output
        replayed before any timestamp, else one by one."""
        if (
            len(texts) >= BLOCK_MIN_LINES
            and self.position.data_clock
            and self.position.data_time is None
            and self.parser.reads_hf_blocks
        ):
            return self._feed_hf(source, texts, now)
        return self.feed_each(source, texts, now)

    def _feed_hf(self, source: str, texts: list[str], now: float) -> list[Alert]:
        """HF Trainer output, at most ``BLOCK_MAX_LINES`` lines at a time: each stretch of
        bars and dicts of one schema as a block, halved where a line is something else."""
        if len(texts) > BLOCK_MAX_LINES:
            alerts: list[Alert] = []
            for start in range(0, len(texts), BLOCK_MAX_LINES):
                alerts += self._feed_other(source, texts[start : start + BLOCK_MAX_LINES], now)
            return alerts
        pieces = read_hf(texts)
        if pieces is None:
            if len(texts) < 2 * BLOCK_MIN_LINES:
                return self.feed_each(source, texts, now)
            middle = len(texts) // 2
            return self._feed_other(source, texts[:middle], now) + self._feed_other(
                source, texts[middle:], now
            )
        alerts = []
        for piece in pieces:
            part = texts[piece.start : piece.stop] if len(pieces) > 1 else texts
            alerts += self._feed_hf_piece(source, part, piece, now)
        return alerts

    def _feed_hf_piece(
        self, source: str, texts: list[str], piece: HfPiece, now: float
    ) -> list[Alert]:
        """One piece of HF output: absorbed by every rule it concerns, or halved (and read
        again), or fed one by one."""
        if (
            piece.names is None
            or len(texts) < BLOCK_MIN_LINES
            or self.position.data_time is not None  # a line fed one by one started the clock
        ):
            return self.feed_each(source, texts, now)
        parser = self.parser
        known = parser.hf_state()
        made = self._hf_block(source, piece)
        if made is not None:
            block, current, logged = made
            concerned = self.routes.block(block)
            if all(self._accepts(detector, block) for detector in concerned):
                alerts = self._absorb(block, concerned)
                blanks = piece.blanks
                bars = len(piece.kinds) - blanks - len(block)
                stats = self.parser.stats
                stats.lines += bars + blanks
                stats.parsed += bars
                stats.unparsed += blanks
                self.lines_absorbed += bars + blanks
                self.position.current_step = current
                self.position.logged = logged
                return alerts
        parser.restore_hf(known)  # the lines are read again, one by one or in halves
        if len(texts) < 2 * BLOCK_MIN_LINES:
            return self.feed_each(source, texts, now)
        middle = len(texts) // 2
        return self._feed_hf(source, texts[:middle], now) + self._feed_hf(
            source, texts[middle:], now
        )

    def _hf_block(self, source: str, piece: HfPiece) -> tuple[Block, int | None, int] | None:
        """The block of a piece of HF output, with the engine's step and count of logged
        lines after it; None where a dict would have no step.

        What ``feed_text`` does line by line: a bar's step is progress when it passes
        every step before it; a dict gets the step its epoch gives it (``hf_steps``, the
        parser's own logic run over the piece), else ``start_step + n x logging_steps``
        (n counting training dicts) or, without ``logging_steps``, the step the bars
        reached.
        """
        names = piece.names
        assert names is not None
        epochs = piece.columns.get("epoch")
        hf_steps = iter(self.parser.read_hf_block(piece, epochs, "loss" in names))
        position = self.position
        current = position.current_step
        logged = position.logged
        every = position.logging_steps
        start_step = position.start_step
        training = not TRAINING_LOG_METRICS.isdisjoint(names)
        bar_steps = iter(piece.bar_steps)
        seen: list[int] = []
        steps: list[int] = []
        for kind in piece.kinds:
            if kind == BAR:
                step = next(bar_steps)
                if current is None or step > current:
                    current = step
                    seen.append(step)
            elif kind == DICT:
                own = next(hf_steps)
                if own is not None:
                    step = own
                    if every is not None and training:
                        logged = position.logged_at(step, logged)  # count_step's count
                    if current is None or step > current:
                        current = step
                elif every is None:
                    if current is None:
                        return None  # line by line: a step-less sample
                    step = current
                else:
                    if training:
                        logged += 1
                    step = start_step + logged * every
                    if current is None or step > current:
                        current = step
                steps.append(step)
                seen.append(step)
        block = Block(
            source=source,
            texts=piece.dict_texts,
            names=names,
            columns=piece.columns,
            steps=steps,
            times=None,
            clock=[UNCLOCKED] * len(steps),
            start_clock=None,
            ticks=False,
            output=False,
            progress=seen,
            progress_at=UNCLOCKED,
        )
        return block, current, logged

    def _feed_json(self, source: str, texts: list[str], now: float) -> list[Alert]:
        """JSON-object lines in blocks of at most ``BLOCK_MAX_LINES``, each run of one schema
        as columns; halved where they do not decode (a garbled line)."""
        if len(texts) > BLOCK_MAX_LINES:
            alerts: list[Alert] = []
            for start in range(0, len(texts), BLOCK_MAX_LINES):
                alerts += self._feed_json(source, texts[start : start + BLOCK_MAX_LINES], now)
            return alerts
        runs = parse_runs(texts, BLOCK_MIN_LINES)
        if runs is None:
            if len(texts) < 2 * BLOCK_MIN_LINES:
                return self.feed_each(source, texts, now)
            middle = len(texts) // 2
            return self._feed_json(source, texts[:middle], now) + self._feed_json(
                source, texts[middle:], now
            )
        alerts = []
        for start, stop, columns in runs:
            part = texts[start:stop] if stop - start < len(texts) else texts
            if columns is None:
                alerts += self.feed_each(source, part, now)
            else:
                alerts += self._feed_columns(source, part, columns, now)
        return alerts

    def _feed_columns(
        self, source: str, texts: list[str], parsed: Columns, now: float
    ) -> list[Alert]:
        """Parsed lines: absorbed by every rule they concern, or halved, or fed one by one."""
        alerts: list[Alert] = []
        position = self.position
        if position.data_clock and position.data_time is None and parsed.times is not None:
            # The first timestamp starts the data's clock (job_started): line by line.
            alerts = self._feed_text(source, texts[0], now)
            texts, parsed = texts[1:], parsed.slice(1, len(parsed))
        if len(texts) < BLOCK_MIN_LINES:
            return alerts + self.feed_each(source, texts, now)
        block = self._block(source, texts, parsed, now)
        series = self.series
        rank = series.rank_of(source) if series is not None else None
        if rank is not None:
            # A rank's own file: its lines go to that rank's rules, whole where they take them.
            taken = self._feed_rank_block(rank, block)
            if taken is not None:
                self.lines_absorbed += len(block)
                return alerts + taken
        else:
            concerned = self.routes.block(block)
            if (series is None or series.takes_block(block)) and all(
                self._accepts(detector, block) for detector in concerned
            ):
                alerts += self._absorb(block, concerned)
                if series is not None:
                    series.took_block(block)
                position.count_lines(block.names, block.steps)
                return alerts
        middle = first_non_finite(parsed)
        if middle is None or middle < BLOCK_MIN_LINES:
            if len(texts) < 2 * BLOCK_MIN_LINES:
                return alerts + self.feed_each(source, texts, now)
            middle = len(texts) // 2
        # Else cut before the first NaN: the lines before it likely go whole, where halving
        # fed a NaN's batch of 25 lines (a look's) one by one (1.5-2.5 ms before the stop).
        alerts += self._feed_columns(source, texts[:middle], parsed.slice(0, middle), now)
        return alerts + self._feed_columns(
            source, texts[middle:], parsed.slice(middle, len(parsed)), now
        )

    def _block(self, source: str, texts: list[str], parsed: Columns, now: float) -> Block:
        """The block the rules are shown, with the clock each line would be read at."""
        times = parsed.times
        start = self.position.data_time
        if not self.position.data_clock:
            clock, ticks, output = [now] * len(texts), False, True
        elif start is None:
            # No timestamp yet (and none in these lines): no clock, no output hooks.
            clock, ticks, output = [UNCLOCKED] * len(texts), False, False
        else:
            if times is None:
                clock = [start] * len(texts)
            elif times[0] >= start and sorted(times) == times:
                clock = times  # the usual log: each line's time is the clock (shared, read-only)
            else:
                clock = list(accumulate(times, max, initial=start))[1:]
            ticks, output = times is not None, True
        return Block(
            source=source,
            texts=texts,
            names=parsed.names,
            columns=parsed.columns,
            steps=parsed.steps,
            times=times,
            clock=clock,
            start_clock=start,
            ticks=ticks,
            output=output,
        )

    def accepting(self, block: Block) -> list[BaseDetector] | None:
        """The rules ``block`` concerns, if each takes it whole (``can_absorb``); else None."""
        concerned = self.routes.block(block)
        if all(self._accepts(detector, block) for detector in concerned):
            return concerned
        return None

    def absorb(self, block: Block, concerned: list[BaseDetector]) -> list[Alert]:
        """The rules ``accepting`` gave take ``block``; the engine's state moves past it."""
        return self._absorb(block, concerned)

    def _accepts(self, detector: BaseDetector, block: Block) -> bool:
        if block.progress is not None and detector.sees_progress and not detector.absorbs_progress:
            return False  # a rule that would not see the bars' progress in the block
        try:
            return detector.can_absorb(block)
        except Exception:
            # A bug in the fast path must not cost the rule: the block goes line by line.
            log.exception("rule %s failed on a block; fed line by line", detector.rule)
            return False

    def _absorb(self, block: Block, concerned: list[BaseDetector]) -> list[Alert]:
        """Every concerned rule takes the block; the engine's own state moves past it.

        Returns no alert but the one of a rule that failed (and is disabled)."""
        alerts: list[Alert] = []
        for detector in concerned:
            try:
                detector.absorb(block)
            except Exception as error:
                alerts.append(self._disable(detector, error, block.clock[-1]))
        steps = block.steps
        if not steps:
            return alerts  # progress bars alone (HF output): the caller moves the step
        position = self.position
        top = block.step_range()[1]
        current = position.current_step
        if current is None or top > current:
            position.current_step = top
            # Each new step, as feeding line by line notes it: the last healthy value may
            # be any line of the block, and on the data's clock each has its own time.
            clock, note = block.clock, position.note_seen
            for index, step in enumerate(steps):
                if current is None or step > current:
                    current = step
                    note(step, clock[index])
        count = len(steps)
        stats = self.parser.stats
        stats.lines += count
        stats.parsed += count
        if position.data_clock:
            if block.start_clock is not None:
                position.data_time = block.clock[-1]
        elif block.times is not None:
            position.data_time = block.times[-1]
        self.history.extend(block.names, block.columns, steps, block.times)
        self.lines_absorbed += count
        return alerts
