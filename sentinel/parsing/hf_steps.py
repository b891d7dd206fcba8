"""The step of each HF Trainer dict printed to stdout, from the best evidence the output holds.

The Trainer prints ``{'loss': '2.31', ..., 'epoch': '0.1667'}`` with no step. In order:

1. a ``step`` field (a callback's own dict): the parsers already read it;
2. ``trainer_state.json``'s log history (``learn_trainer_state``), or a known
   number of steps per epoch: the step is ``epoch x steps_per_epoch``;
3. steps per epoch learned from the output itself: with the bar and the dicts in
   one stream, unbuffered, the bar tqdm redraws right after ``tqdm.write`` prints
   a dict shows that dict's step (live, where ``\\r`` ends a line and the cleared
   bar is dropped as blank, it is the next bar line). Each (epoch, step) pair
   bounds steps per epoch as far as the printed epoch is exact; two or more pairs
   in a row whose bounds meet teach it: exactly, where the bounds hold the
   training bar's total over one whole number of epochs (``max_steps`` is
   ``epochs x steps per epoch`` unless set), else where they agree within
   ``_AGREE``. What the bars taught is checked on every dict after: two dicts in
   a row whose redrawn bar is not their step (the bars and the dicts reach
   sentinel in no sure order, from two pipes) and it is forgotten;
4. none of these: no step here, and the engine gives the dict the step of the
   bar or of its logging cadence (``parsers.logging_steps``), as before.

Step 2 and 3 read the epoch as printed: 5.x rounds it to four significant
digits and 4.x may round it to two decimals, so far into a run it names a few
candidate steps: a training dict takes the one on its logging interval (learned
from the dicts before it, which are that many steps apart) nearest the training
bar's count, else the one nearest the bar. The bar alone is one to ten steps
early (tqdm skips redraws; 5.x prints a dict after the bar drew the step before)
and, with stdout buffered, a whole burst of dicts late.
"""

from __future__ import annotations

import json
import logging
import math
import re

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing.hf_blocks import HfPiece

logger = logging.getLogger(__name__)

_new_sample = tuple.__new__
#: In a dict whose values are strings (5.x), its epoch printed to four significant digits.
_QUOTED = "'epoch': '"
#: A bar tqdm drew with no description, right after a ``\\r`` or at the line's start.
_PLAIN_BAR = re.compile(r"(?:^|\r)[ \t]*\d{1,3}%\|[^|\r]*\|[ \t]*(\d+)/(\d+) \[")
#: Two (epoch, step) pairs agree on steps per epoch within this relative error.
_AGREE = 2e-3
#: The most epochs a training bar's total is divided by to find steps per epoch.
_EPOCHS_MAX = 1000
#: Bounds on steps per epoch this narrow (relative) may pick the bar's total over a whole
#: number of epochs; a pair whose epoch is rounded wider than this is not used.
_WHOLE_SPAN = 0.02
#: Dicts in a row whose redrawn bar is not their step, past which what the bars taught
#: is forgotten.
_MISSES = 2


class HfSteps:
    """Gives HF Trainer dicts the step their epoch implies, once steps per epoch are known."""

    __slots__ = (
        "_bar",
        "_bars_teach",
        "_bounds",
        "_gap",
        "_interval",
        "_last_training",
        "_misses",
        "_pending",
        "_taught",
        "_total",
        "steps_per_epoch",
    )

    def __init__(self, steps_per_epoch: float | None = None, *, bars_teach: bool = True) -> None:
        #: Optimizer steps per epoch (a float: HF's epoch counts batches, so with gradient
        #: accumulation it need not be whole); None until known.
        self.steps_per_epoch = steps_per_epoch
        #: Whether the bars may teach it (not where the run's logging cadence is set:
        #: the engine counts the dicts' steps then, and a dict's own step would stop it).
        self._bars_teach = bars_teach
        self._total: int | None = None  # the training bar's total: its first plain bar's
        self._bar: int | None = None  # the training bar's last count
        # A dict's epoch, how far it was rounded, and the step it was given (None: none
        # yet), whose step the next training bar shows.
        self._pending: tuple[float, float, int | None] | None = None
        # Steps per epoch as the (epoch, bar) pairs in a row bound it, and how many pairs.
        self._bounds: tuple[float, float, int] | None = None
        # Whether steps per epoch came from the bars (checked, forgotten when they
        # disagree), and how many dicts in a row they disagreed on.
        self._taught = False
        self._misses = 0
        # Training dicts: the last one's step, the gap before it, and the logging interval
        # (the gap twice in a row).
        self._last_training: int | None = None
        self._gap: int | None = None
        self._interval: int | None = None

    @property
    def taught(self) -> bool:
        """Whether steps per epoch came from the output's own bars (not given, nor read
        from ``trainer_state.json``)."""
        return self._taught

    def learn_trainer_state(self, text: str) -> bool:
        """Steps per epoch from a ``trainer_state.json``'s log history; whether it held them."""
        try:
            history = json.loads(text).get("log_history")
        except (ValueError, AttributeError, RecursionError):
            return False
        if not isinstance(history, list):
            return False
        for entry in reversed(history):  # the latest entry: the most digits
            if not isinstance(entry, dict):
                continue
            step, epoch = entry.get("step"), entry.get("epoch")
            if type(step) is int and step > 0 and type(epoch) is float and 0 < epoch < math.inf:
                self.steps_per_epoch = step / epoch
                self._taught = False
                return True
        return False

    def process(self, text: str, samples: list[Sample]) -> list[Sample]:
        """One line's samples in order: its bars move the bar, an HF dict gets its step."""
        if "%|" in text:
            if self._pending is None and self._total is not None:
                # Only the count is needed now: the bar's own sample, no regex. An
                # evaluation's bar counts from 0 again, below the training bar.
                bar = self._bar
                for sample in samples:
                    step = sample.step
                    if (
                        sample.name == PROGRESS
                        and step is not None
                        and (bar is None or step >= bar)
                    ):
                        bar = step
                self._bar = bar
            else:
                self._bars(text)
        if "{'" not in text:
            return samples
        epoch: float | None = None
        training = False
        for sample in samples:
            name = sample.name
            if name == "epoch":
                epoch = sample.value
            elif name == "loss":
                training = True
            if sample.step is not None and name != PROGRESS:
                return samples  # a step of its own: the best evidence
        if epoch is None or not 0 < epoch < math.inf:
            return samples
        step = self._dict(epoch, _half_unit(epoch, quoted=_QUOTED in text), training)
        if step is None:
            return samples
        return [
            sample
            if sample.name == PROGRESS
            else _new_sample(Sample, (sample[0], sample[1], step, *sample[3:]))
            for sample in samples
        ]

    def read_block(
        self, piece: HfPiece, epochs: list[float] | None, training: bool
    ) -> list[int | None]:
        """``process`` over a piece of HF output read as a block (``hf_blocks``: each bar
        plain and alone on its line, each dict with no step of its own): the step each
        dict's epoch gives it (None: none), the state moved as line by line. ``epochs``:
        the dicts' epochs (None: they print none); ``training``: they print a loss."""
        counts, totals = piece.bar_steps, piece.bar_totals
        if epochs is None or (self.steps_per_epoch is None and not self._bars_teach):
            # No dict takes a step or pairs with a bar: the bars alone, as one run.
            self._bar_run(counts, totals, 0, len(counts))
            return [None] * len(piece.dict_texts)
        steps: list[int | None] = []
        start = 0
        for text, stop, epoch in zip(piece.dict_texts, piece.dict_bars, epochs, strict=True):
            self._bar_run(counts, totals, start, stop)
            start = stop
            if 0 < epoch < math.inf:
                steps.append(self._dict(epoch, _half_unit(epoch, quoted=_QUOTED in text), training))
            else:
                steps.append(None)
        self._bar_run(counts, totals, start, len(counts))
        return steps

    def _bar_run(self, counts: list[int], totals: list[int], start: int, stop: int) -> None:
        """Bars ``start`` to ``stop``, each alone on its line, as ``process`` reads them: one
        by one while a dict waits for its bar (or before the training bar's total is
        known), then only forward, the most of them at once."""
        while start < stop and (self._pending is not None or self._total is None):
            self._plain_bar(counts[start], totals[start])
            start += 1
        if start < stop:
            top = max(counts[start:stop])
            if self._bar is None or top >= self._bar:
                self._bar = top

    def state(self) -> tuple[object, ...]:
        """All it knows, to ``restore`` after a block the rules refused."""
        return tuple(getattr(self, name) for name in self.__slots__)

    def restore(self, state: tuple[object, ...]) -> None:
        for name, value in zip(self.__slots__, state, strict=True):
            setattr(self, name, value)

    def _bars(self, text: str) -> None:
        """Follow the training bar through the plain bars of one line."""
        for count_text, total_text in _PLAIN_BAR.findall(text):
            self._plain_bar(int(count_text), int(total_text))

    def _plain_bar(self, count: int, total: int) -> None:
        """One plain bar: the training bar's (its first total) moves it and shows the step
        of the dict before it."""
        if self._total is None:
            self._total = total
        if total != self._total:
            return  # an evaluation's bar
        self._bar = count
        pending = self._pending
        if pending is not None:
            self._pending = None
            epoch, half, step = pending
            if step is None:
                self._learn(epoch, half, count)
            else:
                self._check(step, count)

    def _dict(self, epoch: float, half: float, training: bool) -> int | None:
        """A step-less dict at ``epoch`` (printed to within ``half``): its step, None while
        steps per epoch are unknown; while the bars may teach, the next training bar is
        paired with it."""
        step = self._step(epoch, half, training)
        if self._bars_teach and (self.steps_per_epoch is None or self._taught):
            self._pending = (epoch, half, step)  # the next training bar shows its step
        return step

    def _learn(self, epoch: float, half: float, count: int) -> None:
        """The first training bar after a dict shows its step (one stream, unbuffered):
        steps per epoch lie between ``count / (epoch + half)`` and ``count / (epoch - half)``."""
        if count <= 0 or 2.0 * half > _WHOLE_SPAN * epoch:
            return  # an epoch rounded that far (0.17 of two decimals) bounds too little
        low, high = count / (epoch + half), count / (epoch - half)
        pairs = 1
        bounds = self._bounds
        if bounds is not None and max(low, bounds[0]) <= min(high, bounds[1]):
            low, high, pairs = max(low, bounds[0]), min(high, bounds[1]), bounds[2] + 1
        self._bounds = (low, high, pairs)
        if pairs < 2:
            return  # one pair may be another step's bar: wait for one that agrees
        per_epoch = self._whole_epochs(low, high)
        if per_epoch is None and high - low <= _AGREE * high:
            per_epoch = 0.5 * (low + high)
        if per_epoch is not None:
            self.steps_per_epoch = per_epoch
            self._taught = True
            logger.info("HF Trainer output: %.6g steps per epoch, by its progress bar", per_epoch)

    def _check(self, step: int, count: int) -> None:
        """What the bars taught, against a dict's redrawn bar: forgotten when two dicts in
        a row are not at the bar redrawn after them, and the bars teach no more (output
        whose bars and dicts interleave out of order would teach and unteach at every dict,
        and say so each time)."""
        if count == step:
            self._misses = 0
            return
        self._misses += 1
        if self._misses >= _MISSES:
            logger.info(
                "HF Trainer output: its bars no longer show the dicts' steps (stdout and"
                " stderr interleave out of order); its dicts are read at the bars' steps"
            )
            self.steps_per_epoch = None
            self._taught = False
            self._misses = 0
            self._bounds = None
            self._bars_teach = False

    def _whole_epochs(self, low: float, high: float) -> float | None:
        """The training bar's total over a whole number of epochs, where exactly one such
        lies between ``low`` and ``high`` (within a few percent: a rounded epoch's bounds
        hold none by chance then)."""
        total = self._total
        if total is None or high - low > _WHOLE_SPAN * high:
            return None
        fewest, most = math.ceil(total / high - 1e-9), math.floor(total / low + 1e-9)
        if fewest != most or not 1 <= fewest <= _EPOCHS_MAX:
            return None
        return total / fewest

    def _step(self, epoch: float, half: float, training: bool) -> int | None:
        """The step of a dict at ``epoch`` printed to within ``half``; None while steps per
        epoch are unknown. A training dict takes a step on its logging interval."""
        per_epoch = self.steps_per_epoch
        if per_epoch is None:
            return None
        exact = epoch * per_epoch
        low = math.ceil((epoch - half) * per_epoch - 1e-6)
        high = math.floor((epoch + half) * per_epoch + 1e-6)
        bar = self._bar
        if high <= low:
            step = round(exact)
        else:
            near = round(exact) if bar is None else bar
            step = min(max(near, low), high)
            interval = self._interval if training else None
            if interval is not None:
                step = _on_interval(near, low, high, interval, step)
        if training:
            self._note_training(step)
        return step

    def _note_training(self, step: int) -> None:
        """Learn the logging interval: the same gap between three training dicts in a row."""
        last = self._last_training
        self._last_training = step
        if last is None or step <= last:
            self._gap = None
            return
        gap = step - last
        if gap == self._gap:
            self._interval = gap
        self._gap = gap


def _on_interval(near: int, low: int, high: int, interval: int, otherwise: int) -> int:
    """The multiple of ``interval`` from ``low`` to ``high`` nearest ``near`` (the lower of
    two as near); ``otherwise`` where there is none."""
    first, last = -(-low // interval), high // interval
    if first > last:
        return otherwise
    k = near // interval  # k x interval <= near < (k + 1) x interval
    if (k + 1) * interval - near < near - k * interval:
        k += 1
    return min(max(k, first), last) * interval


def _half_unit(epoch: float, *, quoted: bool) -> float:
    """How far a printed epoch may be from the true one: 5.x (a quoted string) prints four
    significant digits; 4.x prints the float, which its releases round to two decimals
    (``0.5`` is 0.50) and others print whole (``0.16666666666666666``)."""
    if quoted:
        return 0.5 * 10.0 ** (math.floor(math.log10(epoch)) - 3)
    text = repr(epoch)
    if "e" in text or "." not in text:
        return 0.0
    return 0.5 * 10.0 ** -max(len(text) - text.index(".") - 1, 2)
