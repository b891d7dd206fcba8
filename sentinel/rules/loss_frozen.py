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

A loss at chance is the same failure seen through its last digits: a uniform guess over K
classes has loss ln K, and a model stuck there logs values that differ only past the fourth
digit (a FractalNet on CIFAR-10 at 2.3028-2.3030 = ln 10 for every epoch shown; a DINO run
collapsed to 11.0903 = ln 65536, its output's size, for 200 epochs). ``repeats`` values in a
row, each within ``LN_TOLERANCE`` of the same ln K, warn too (``"chance"``), where K can be
told from its neighbours at that precision: up to ``CHANCE_CLASSES`` classes, or a power of 2
or of 10 (an output layer's usual sizes; ln K of a large K other than those is near any
value).

``details``: ``kind`` (``"frozen"`` or ``"chance"``), ``repeats``, ``since`` (the step of the
first), ``classes`` (K where the value is ln K, else None).
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
GRAD_NORM = "grad_norm"
#: Logged grad-norms of exactly 0 in a row that are no gradient reaching the weights.
ZERO_GRADS = 3
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


#: Classes up to which ln K is told from ln (K +- 1) at ``LN_TOLERANCE``: K ln K < 1 / (2 x
#: the tolerance).
CHANCE_CLASSES = 190
#: Powers of 2 and of 10 up to which ln K counts as a chance level too.
CHANCE_POWERS = frozenset({*(2**n for n in range(1, 21)), *(10**n for n in range(1, 7))})
#: Significant digits a value must show, as logged, to be read as at a chance level.
CHANCE_DIGITS = 4
#: Above this no loss is ln K of a K in ``CHANCE_POWERS``'s range (ln 2**20 is 13.9).
CHANCE_TOP = 14.0


def chance_classes(value: float) -> int | None:
    """K where ``value`` is at the chance level ln K (``classes_of``) and K can be told at
    that precision (``CHANCE_CLASSES``, ``CHANCE_POWERS``); else None."""
    classes = classes_of(value)
    if classes is None:
        return None
    if classes <= CHANCE_CLASSES:
        return classes
    for power in (2 ** round(math.log2(classes)), 10 ** round(math.log10(classes))):
        if power in CHANCE_POWERS and abs(math.log(power) - value) <= LN_TOLERANCE * value:
            return int(power)
    return None


def chance_level(value: float) -> int | None:
    """``chance_classes`` of a value logged with ``CHANCE_DIGITS`` or more; None for any
    other (most values: the first test, ln K of a near-integer K, costs one ``exp``)."""
    if not 0.5 < value < CHANCE_TOP:  # NaN too
        return None
    guess = math.exp(value)
    if abs(guess - round(guess)) > LN_TOLERANCE * value * guess:
        return None
    classes = chance_classes(value)
    return classes if classes is not None and significant_digits(value) >= CHANCE_DIGITS else None


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
    watches = frozenset({METRIC, GRAD_NORM})

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        if alert.details.get("kind") == "no_gradient":
            return (
                "no gradient reaches the weights: the grad-norm is exactly 0",
                "check that parameters train (requires_grad; a LoRA or adapter that wraps no"
                " module; a frozen base with nothing left to train), that the loss is not"
                " detached from the graph, and that not every label is masked (-100)",
                alert.metric,
            )
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
        #: Logged grad-norms of exactly 0 in a row, the step of the first, and whether its
        #: warning is open.
        self._zeros = 0
        self._zeros_since: int | None = None
        self._zeros_open = False
        #: The chance level ln K the last values sat at (K), how many in a row, the step of
        #: the first, and whether its warning is open.
        self._chance: int | None = None
        self._chance_count = 0
        self._chance_since: int | None = None
        self._chance_open = False

    def job_started(self, now: float) -> None:
        self._reset()

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        time = sample.time if sample.time is not None else now
        if sample.name == GRAD_NORM:
            return self._grad_norm(sample, source, time)
        if sample.name != METRIC:
            return []
        alerts = self._equal(sample, source, time)
        return alerts + self._at_chance(sample, source, time)

    def _equal(self, sample: Sample, source: str, time: float) -> list[Alert]:
        """The run of equal values: a warning when it reaches ``repeats``."""
        value, step = sample.value, sample.step
        alerts: list[Alert] = []
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
        if self._open:
            self._open = False
            alerts.append(
                self._resolved(sample, f"loss moves again: {value:g} at step {step}", source, time)
            )
        if self._last is not None and self._count >= CREEP_RUN:
            self._runs.append(self._last)
        self._last = value if math.isfinite(value) else None
        self._count = 1
        self._since = step
        return alerts

    def _grad_norm(self, sample: Sample, source: str, time: float) -> list[Alert]:
        """A grad-norm of exactly 0, ``ZERO_GRADS`` logged in a row: no gradient reaches the
        weights (a DPO run's loss at ln 2 beside ``'grad_norm': 0.0`` on every line, its
        rewards all 0); resolved by the first that is not."""
        if sample.value == 0.0:
            if self._zeros == 0:
                self._zeros_since = sample.step
            self._zeros += 1
            if self._zeros == ZERO_GRADS and not self._zeros_open:
                self._zeros_open = True
                return [self._no_gradient(sample, source, time)]
            return []
        self._zeros = 0
        if not self._zeros_open:
            return []
        self._zeros_open = False
        message = f"grad_norm is {sample.value:g} at step {sample.step}: gradients flow"
        return [self._resolved(sample, message, source, time)]

    def _no_gradient(self, sample: Sample, source: str, time: float) -> Alert:
        message = (
            f"grad_norm has been exactly 0 for {self._zeros} logged values in a row (since step"
            f" {self._zeros_since}): no gradient reaches the weights, so nothing trains"
        )
        run = ("no_gradient", self._zeros, self._zeros_since, None)
        return self._warning(sample, run, message, source, time)

    def _warning(
        self,
        sample: Sample,
        run: tuple[str, int, int | None, int | None],
        message: str,
        source: str,
        time: float,
    ) -> Alert:
        """The rule's warning on ``sample``: ``run`` is its kind, the values in the run,
        the step of the first (the onset) and K where the loss sits at ln K."""
        kind, repeats, since, classes = run
        details: dict[str, Any] = {
            "kind": kind,
            "repeats": repeats,
            "since": since,
            "classes": classes,
        }
        return self.sample_alert(
            sample,
            severity=self.settings.severity,
            message=message,
            time=time,
            source=source,
            onset_step=since,
            details=details,
        )

    def _resolved(self, sample: Sample, message: str, source: str, time: float) -> Alert:
        return self.sample_alert(
            sample, severity=Severity.INFO, message=message, time=time, source=source, resolves=True
        )

    def _at_chance(self, sample: Sample, source: str, time: float) -> list[Alert]:
        """The run of values at one chance level (``chance_classes``): a warning when it
        reaches ``repeats`` (unless the loss is frozen already), resolved when it leaves."""
        value = sample.value
        classes = chance_level(value)
        if classes is not None and classes == self._chance:
            self._chance_count += 1
            if self._chance_count == self.settings.repeats and not self._open:
                self._chance_open = True
                return [self._stuck(sample, classes, source, time)]
            return []
        alerts = []
        if self._chance_open:
            self._chance_open = False
            message = f"loss left its chance level: {value:g} at step {sample.step}"
            alerts.append(self._resolved(sample, message, source, time))
        self._chance, self._chance_count, self._chance_since = classes, 1, sample.step
        return alerts

    def _stuck(self, sample: Sample, classes: int, source: str, time: float) -> Alert:
        message = (
            f"loss has stayed at {sample.value:g} = ln {classes} for {self._chance_count} logged"
            f" values (since step {self._chance_since}): a uniform guess over {classes}"
            " classes, the model predicts no better than chance"
        )
        run = ("chance", self._chance_count, self._chance_since, classes)
        return self._warning(sample, run, message, source, time)

    def _frozen(self, sample: Sample, source: str, time: float) -> Alert:
        value = sample.value
        classes = classes_of(value)
        chance = f", ln {classes}: a uniform guess over {classes} classes" if classes else ""
        message = (
            f"loss has been exactly {value!r} for {self._count} logged values in a row (since"
            f" step {self._since}{chance}): a loss on changing batches moves in its last digits;"
            " this one no longer depends on its input"
        )
        return self._warning(
            sample, ("frozen", self._count, self._since, classes), message, source, time
        )

    def _chance_runs(
        self, column: list[float], steps: list[int]
    ) -> tuple[bool, int | None, int, int | None]:
        """Line by line over a block's losses, the chance level's run (``_at_chance``):
        whether it reaches ``repeats`` in the block, and the run it leaves (K, count,
        step of the first), in one pass."""
        chance, count, since = self._chance, self._chance_count, self._chance_since
        repeats = self.settings.repeats
        reached = False
        for value, step in zip(column, steps, strict=True):
            classes = chance_level(value)
            if classes is not None and classes == chance:
                count += 1
                reached = reached or count >= repeats
            else:
                chance, count, since = classes, 1, step
        return reached, chance, count, since

    def can_absorb(self, block: Block) -> bool:
        """Uneventful: no episode open, no run of equal values in the block (with the
        one it continues) reaching ``repeats`` on a value precise enough to be judged, and
        no run at one chance level reaching it (``_chance_runs``)."""
        if self._open or self._chance_open or self._zeros_open:
            return False
        grads = block.columns.get(GRAD_NORM)
        if grads is not None and 0.0 in grads:
            return False  # a zero grad-norm: line by line (rare)
        column = block.columns.get(METRIC)
        if column is None:
            return True
        if self._chance_runs(column, block.steps)[0]:
            return False
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
        if GRAD_NORM in block.columns:
            self._zeros = 0  # no zero in the block (``can_absorb``)
        column = block.columns.get(METRIC)
        if not column:
            return
        _, self._chance, self._chance_count, self._chance_since = self._chance_runs(
            column, block.steps
        )
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
