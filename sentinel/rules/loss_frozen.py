"""loss_frozen: the training loss logs the very same value, to its last digit, again and again.

A loss computed on changing batches moves in its last digits from one logged value to the
next, however flat the run. One that logs the same value ``repeats`` (10) times in a row has
stopped depending on its input: the model predicts a constant (a binary classifier stuck at
ln 2 = 0.6931, one over K classes at ln K: activations that died, an output layer that
collapsed, labels all alike or all masked), or what is logged is stale. A loss logged with few
significant digits repeats on a plateau by rounding (``0.0002`` at four decimals), and a loss
of exactly 0 is ``nan_inf``'s: only a value of ``min_digits`` (3) significant digits or more,
as logged, is judged.

A warning (``severity``) once the run of equal values reaches ``repeats``, its onset the first
of them; it resolves when the loss moves. The message names ln K where the value is one.

``details``: ``kind`` (``"frozen"``), ``repeats``, ``since`` (the step of the first),
``classes`` (K where the value is ln K, else None).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from itertools import islice
from operator import eq
from typing import Any

from pydantic import Field

from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, Reading, Recent, RuleConfig

METRIC = "loss"
#: ln K is named for K up to this many classes (a vocabulary's ln 50257 too).
MAX_CLASSES = 1_000_000
#: How close (relative) a value is to ln K to be named as it.
LN_TOLERANCE = 5e-4


class LossFrozenConfig(RuleConfig):
    """``[rules.loss_frozen]``."""

    #: Severity of the alert: the job may still be saved by a look, not by a restart.
    severity: Severity = Severity.WARNING
    #: Logged values in a row, all equal, that are a frozen loss.
    repeats: int = Field(default=10, ge=3, le=100_000)
    #: Significant digits a value must show, as logged, to be judged.
    min_digits: int = Field(default=3, ge=1, le=17)


def significant_digits(value: float) -> int:
    """The significant digits of ``value`` as logged, up to 7 (``0.6931``: 4, ``0.0002``: 1,
    ``100.0``: 1, ``0.0``: 0): rounded to 7 first, so that the noise of a value a reader
    computed (a sum of logged terms, ``0.30000000000000004``) is no precision."""
    mantissa = format(abs(value), ".6e").split("e")[0].replace(".", "")
    return len(mantissa.strip("0"))


#: A run of this many equal values, or more, is remembered (``LossFrozenDetector._runs``).
CREEP_RUN = 3
#: Runs remembered: a new run at one of their values, or a printed digit from it, creeps.
RUNS_KEPT = 4


def quantum(value: float) -> float:
    """The place of the last significant digit of ``value`` as logged (``0.0379``: 1e-4)."""
    mantissa, exponent = format(abs(value), ".6e").split("e")
    digits = len(mantissa.replace(".", "").rstrip("0"))
    return 10.0 ** (int(exponent) - max(digits - 1, 0))


def creeps(value: float, runs: Iterable[float]) -> bool:
    """Whether a run of ``value`` comes after an earlier run (of ``CREEP_RUN`` or more) one
    printed digit from it: a loss still moving under the precision it is printed at. A
    converged full-batch run printed to 4 decimals logged 0.0379 ten times, then 0.0378 ten
    times, 0.0377...: frozen to the eye, not to the optimizer. A frozen loss comes back to
    its very value (ln 10 again after a blip): that is no creep."""
    for before in runs:
        step = min(quantum(value), quantum(before))
        if math.isclose(abs(value - before), step, rel_tol=1e-6):
            return True
    return False


def classes_of(value: float) -> int | None:
    """K where ``value`` is ln K (2 or more), within ``LN_TOLERANCE``; else None."""
    if not 0.5 < value < math.log(MAX_CLASSES):
        return None
    classes = round(math.exp(value))
    if classes >= 2 and abs(math.log(classes) - value) <= LN_TOLERANCE * value:
        return classes
    return None


class LossFrozenDetector(BaseDetector):
    """Warns on a training loss that logs the same value ``repeats`` times in a row."""

    rule = "loss_frozen"
    config_model = LossFrozenConfig
    watches = frozenset({METRIC})

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        classes = alert.details.get("classes")
        chance = f" (ln {classes}: a uniform guess over {classes} classes)" if classes else ""
        return (
            f"the loss is frozen at {alert.value:g}{chance}: the model predicts a constant",
            "look for activations that died (a learning rate too high for the first steps),"
            " an output layer that collapsed, labels all alike or all masked (-100), frozen"
            " parameters (requires_grad), or a loss computed on something constant",
            alert.metric,
        )

    def __init__(self, config: LossFrozenConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._reset()

    def _reset(self) -> None:
        #: The last value, how many times in a row it was logged, and the step of the first.
        self._last: float | None = None
        self._count = 0
        self._since: int | None = None
        #: The values of the last ``RUNS_KEPT`` runs of ``CREEP_RUN`` or more, ended.
        self._runs: deque[float] = deque(maxlen=RUNS_KEPT)
        #: Whether the warning for the current run of values is open.
        self._open = False

    def job_started(self, now: float) -> None:
        self._reset()

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        name, value, step, stamp = sample[:4]
        if name != METRIC:
            return []
        time = stamp if stamp is not None else now
        if value == self._last:
            self._count += 1
            settings = self.settings
            if (
                self._count == settings.repeats
                and not self._open
                and significant_digits(value) >= settings.min_digits
                and not creeps(value, self._runs)
            ):
                self._open = True
                return [self._frozen(sample, source, time)]
            return []
        alerts = []
        if self._open:
            self._open = False
            alerts.append(
                self.sample_alert(
                    sample,
                    severity=Severity.INFO,
                    message=f"loss moves again: {value:g} at step {step}",
                    time=time,
                    source=source,
                    resolves=True,
                )
            )
        if self._last is not None and self._count >= CREEP_RUN:
            self._runs.append(self._last)
        self._last = value if math.isfinite(value) else None
        self._count = 1
        self._since = step
        return alerts

    def _frozen(self, sample: Sample, source: str, time: float) -> Alert:
        value = sample.value
        classes = classes_of(value)
        chance = f", ln {classes}: a uniform guess over {classes} classes" if classes else ""
        message = (
            f"loss has been exactly {value!r} for {self._count} logged values in a row (since"
            f" step {self._since}{chance}): a loss on changing batches moves in its last digits;"
            " this one no longer depends on its input"
        )
        details: dict[str, Any] = {
            "kind": "frozen",
            "repeats": self._count,
            "since": self._since,
            "classes": classes,
        }
        return self.sample_alert(
            sample,
            severity=self.settings.severity,
            message=message,
            time=time,
            source=source,
            onset_step=self._since,
            details=details,
        )

    def can_absorb(self, block: Block) -> bool:
        """Uneventful: no episode open, and no run of equal values in the block (with the
        one it continues) reaches ``repeats`` on a value precise enough to be judged."""
        if self._open:
            return False
        column = block.columns.get(METRIC)
        if column is None:
            return True
        if not any(map(eq, column, islice(column, 1, None))) and column[0] != self._last:
            return True  # no two equal values in a row: no run longer than one
        last, count = self._last, self._count
        repeats, min_digits = self.settings.repeats, self.settings.min_digits
        for value in column:
            count = count + 1 if value == last else 1
            last = value
            if count >= repeats and significant_digits(value) >= min_digits:
                return False
        return True

    def absorb(self, block: Block) -> None:
        column = block.columns.get(METRIC)
        if not column:
            return
        value = column[-1]
        run = 1
        while run < len(column) and column[-run - 1] == value:
            run += 1
        if run == len(column) and value == self._last:
            self._count += run  # the run goes on from before the block
            return
        # The runs the block ended, as line by line: the one going on from before it first.
        last, count = self._last, self._count
        for item in column[: len(column) - run]:
            if item == last:
                count += 1
                continue
            if last is not None and count >= CREEP_RUN:
                self._runs.append(last)
            last, count = (item if math.isfinite(item) else None), 1
        if last is not None and count >= CREEP_RUN:
            self._runs.append(last)
        self._last = value if math.isfinite(value) else None
        self._count = run
        self._since = block.steps[-run]
