"""The step of each HF Trainer dict printed to stdout, from the best evidence the output holds.

The Trainer prints ``{'loss': '2.31', ..., 'epoch': '0.1667'}`` with no step. In order:

1. a ``step`` field (a callback's own dict): the parsers already read it;
2. ``trainer_state.json``'s log history (``learn_trainer_state``), or a known
   number of steps per epoch: the step is ``epoch x steps_per_epoch``;
3. steps per epoch learned from the output itself: with stdout unbuffered, the
   bar tqdm redraws right after ``tqdm.write`` prints a dict shows that dict's
   step, so two such (epoch, step) pairs that agree give steps per epoch;
4. none of these: no step here, and the engine gives the dict the step of the
   bar or of its logging cadence (``parsers.logging_steps``), as before.

Step 2 and 3 read the epoch as printed: 5.x rounds it to four significant
digits, so past a thousand steps it names a few candidate steps, and the one
nearest the training bar's count is taken. The bar alone is one to ten steps
early (tqdm skips redraws; 5.x prints a dict after the bar drew the step before)
and, with stdout buffered, a whole burst of dicts late.
"""

from __future__ import annotations

import json
import logging
import math
import re

from sentinel.records import PROGRESS, Sample

logger = logging.getLogger(__name__)

_new_sample = tuple.__new__
#: A bar tqdm drew with no description, right after a ``\\r`` or at the line's start.
_PLAIN_BAR = re.compile(r"(?:^|\r)[ \t]*\d{1,3}%\|[^|\r]*\|[ \t]*(\d+)/(\d+) \[")
#: Two (epoch, step) pairs agree on steps per epoch within this relative error.
_AGREE = 2e-3


class HfSteps:
    """Gives HF Trainer dicts the step their epoch implies, once steps per epoch are known."""

    __slots__ = ("_bar", "_candidate", "_pending", "_total", "steps_per_epoch")

    def __init__(self, steps_per_epoch: float | None = None) -> None:
        #: Optimizer steps per epoch (a float: HF's epoch counts batches, so with gradient
        #: accumulation it need not be whole); None until known.
        self.steps_per_epoch = steps_per_epoch
        self._total: int | None = None  # the training bar's total: its first plain bar's
        self._bar: int | None = None  # the training bar's last count
        self._pending: float | None = None  # a dict's epoch, printed on a cleared bar
        self._candidate: float | None = None  # steps per epoch by the last (epoch, bar) pair

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
                return True
        return False

    def process(self, text: str, samples: list[Sample]) -> list[Sample]:
        """One line's samples in order: its bars move the bar, an HF dict gets its step."""
        if "%|" in text:
            if self._pending is None and self._total is not None:
                # Only the count is needed now: the bar's own sample, no regex.
                for sample in samples:
                    if sample.name == PROGRESS:
                        self._bar = sample.step
            else:
                self._bars(text)
        if "{'" not in text:
            return samples
        epoch: float | None = None
        for sample in samples:
            if sample.name == "epoch":
                epoch = sample.value
            if sample.step is not None and sample.name != PROGRESS:
                return samples  # a step of its own: the best evidence
        if epoch is None or not 0 < epoch < math.inf:
            return samples
        step = self._step(epoch, text)
        if step is None:
            return samples
        return [
            sample
            if sample.name == PROGRESS
            else _new_sample(Sample, (sample[0], sample[1], step, *sample[3:]))
            for sample in samples
        ]

    def _bars(self, text: str) -> None:
        """Follow the training bar through the plain bars of one line."""
        for count_text, total_text in _PLAIN_BAR.findall(text):
            total = int(total_text)
            if self._total is None:
                self._total = total
            if total != self._total:
                continue  # an evaluation's bar
            count = int(count_text)
            self._bar = count
            if self._pending is not None:
                self._learn(self._pending, count)

    def _learn(self, epoch: float, count: int) -> None:
        """The first training bar after a dict printed on a cleared bar shows its step."""
        self._pending = None
        if count <= 0:
            return
        per_epoch = count / epoch
        earlier = self._candidate
        self._candidate = per_epoch
        if earlier is not None and abs(per_epoch - earlier) <= _AGREE * per_epoch:
            self.steps_per_epoch = per_epoch
            logger.info("HF Trainer output: %.4g steps per epoch, by its progress bar", per_epoch)

    def _step(self, epoch: float, text: str) -> int | None:
        """The step of a dict at ``epoch``; None while steps per epoch are unknown."""
        per_epoch = self.steps_per_epoch
        if per_epoch is None:
            if "\r" in text[: text.find("{'")]:
                self._pending = epoch  # unbuffered: the redraw after it shows its step
            return None
        exact = epoch * per_epoch
        bar = self._bar
        if bar is None or float(format(epoch, ".4g")) != epoch:
            return round(exact)
        # Printed to four significant digits: any step whose epoch prints the same.
        half = 0.5 * 10.0 ** (math.floor(math.log10(epoch)) - 3)
        low = math.ceil((epoch - half) * per_epoch - 1e-6)
        high = math.floor((epoch + half) * per_epoch + 1e-6)
        if high <= low:
            return round(exact)
        return min(max(bar, low), high)
