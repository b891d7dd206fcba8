"""eval_loss_rise: eval loss rising while train loss falls (overfitting)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate, compress, count, islice, repeat
from operator import gt, le, lt, sub
from typing import ClassVar

from pydantic import Field, model_validator

from sentinel.model.records import Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricNames, MetricRuleConfig, Reading, Recent
from sentinel.rules.noise import MAD_TO_SIGMA
from sentinel.rules.series import LazyRolling, Warmup, sorted_median

#: Evaluations since the best kept as evidence for the alert's details.
KEPT_EVALS = 32
#: Task metrics an evaluation may log beside its loss, by the direction that is better
#: (``eval_`` before each): a run judged by one (its ``metric_for_best_model``) that still
#: improves is not overfitting by what it is trained for, whatever its loss does (a Whisper
#: fine-tune's eval loss rises 0.31 -> 0.47 as its WER falls 34.6 -> 32.0: the usual curve).
LOWER_BETTER = ("wer", "cer", "ter", "mer", "error_rate")
HIGHER_BETTER = (
    "accuracy",
    "acc",
    "f1",
    "bleu",
    "sacrebleu",
    "chrf",
    "rouge1",
    "rouge2",
    "rougel",
    "rougelsum",
    "meteor",
    "map",
    "exact_match",
    "auc",
    "roc_auc",
    "precision",
    "recall",
    "matthews_correlation",
    "pearson",
    "spearmanr",
)
TASK_METRICS: dict[str, bool] = {
    **{f"eval_{name}": False for name in LOWER_BETTER},
    **{f"eval_{name}": True for name in HIGHER_BETTER},
}
#: Values of each task metric kept, with their steps.
TASK_KEPT = 64

#: Excursions above the best that came back, kept as the run's tail: the last few, so that
#: a first epoch's chaos does not hide an overfit a hundred epochs on.
TAILS_KEPT = 3


class EvalLossRiseConfig(MetricRuleConfig):
    """``[rules.eval_loss_rise]``.

    The runbooks' defaults: "rising for 3 evals, or > 5-10% above its minimum"; the margin
    takes the top of that range, since eval loss is noisy when the eval set is small.
    """

    renamed: ClassVar[Mapping[str, str]] = {"metric": "metrics"}

    #: The eval metric judged (canonical name): one name, as a string or a list of one.
    metrics: MetricNames = Field(default_factory=lambda: ["eval_loss"])
    #: The train metric that must be falling for a rise to be overfitting; a job that
    #: never logs it is judged on the eval metric alone.
    train_metric: str = Field(default="loss", min_length=1)
    #: Consecutive evaluations, each higher than the one before, that make a rise.
    rises: int = Field(default=3, ge=1)
    #: An eval this fraction above the best one (0.1: 10%) is a rise however it got there...
    margin: float = Field(default=0.1, gt=0, le=10)
    #: ...once this many evaluations in a row are above it: on a small eval set one
    #: evaluation 2-4x the one before comes and goes (a crystal-graph regression's 58 between
    #: 16 and 21 warned 22 times in a healthy run of 300 epochs); overfitting stays.
    margin_evals: int = Field(default=2, ge=1)
    #: Train values whose median is the train level at an evaluation (around the best
    #: one, and now).
    train_window: int = Field(default=10, ge=1)
    #: The margin test also needs the eval above its best by this many times its own
    #: noise: the robust spread of the changes between the last ``noise_evals`` evaluations.
    noise_sigmas: float = Field(default=2.0, ge=0)
    #: Evaluations the eval metric's noise is taken over.
    noise_evals: int = Field(default=10, ge=3, le=1000)

    @model_validator(mode="after")
    def _distinct_metrics(self) -> EvalLossRiseConfig:
        if len(self.metrics) != 1:
            raise ValueError(f"metrics must name one eval metric, not {len(self.metrics)}")
        if not self.metrics[0]:
            raise ValueError("metrics: the eval metric's name is empty")
        if self.eval_metric == self.train_metric:
            raise ValueError("metrics and train_metric must differ")
        return self

    @property
    def eval_metric(self) -> str:
        """The one eval metric judged."""
        return self.metrics[0]


#: Whether an evaluation rose: above the one before it (``value > before``: ``operator.gt``
#: itself, so the block path applies it to a column at C speed).
is_rise: Callable[[float, float], bool] = gt
#: Whether an evaluation is a new best: under the best so far (``operator.lt``).
is_new_best: Callable[[float, float], bool] = lt


def margin_bar(best: float, margin: float) -> float:
    """The level an evaluation must pass to be a rise however it got there: ``margin``
    (a fraction) above the best."""
    return best + margin * abs(best)


def eval_noise(evals: deque[float]) -> float:
    """The eval metric's own wobble: 1.4826 x the median absolute change between
    consecutive evaluations, over sqrt(2) (a change holds two draws' noise); 0 before four
    (two changes say nothing of a spread)."""
    if len(evals) < 4:
        return 0.0
    later = islice(evals, 1, None)
    changes = sorted(abs(after - before) for before, after in zip(evals, later, strict=False))
    return MAD_TO_SIGMA * sorted_median(changes) / math.sqrt(2)


def train_falling(train_now: float | None, train_at_best: float | None) -> bool:
    """Whether the train level fell since the best evaluation (so a rise of the eval
    metric is overfitting): known at both, and lower now."""
    return train_now is not None and train_at_best is not None and train_now < train_at_best


class EvalLossRiseDetector(BaseDetector):
    """Warns once when eval loss climbs away from its best while train loss keeps falling.

    The train level is the median of the last ``train_window`` train values, taken at
    each evaluation; it is falling when its level now is below its level at the best
    evaluation. The episode ends when an evaluation beats the best. Evaluations
    and train values logged in warmup are ignored: the best is a post-warmup one. An
    evaluation at an earlier step than the last one starts the rule again: a new run in
    the same log, whose evaluations are not compared with the previous run's best.
    """

    rule = "eval_loss_rise"
    config_model = EvalLossRiseConfig

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        best = alert.details.get("best_step")
        keep = f"keep the checkpoint at step {best}; " if best is not None else ""
        return (
            "overfitting: eval loss rises while train loss falls",
            f"{keep}stop early, add regularisation (dropout, weight decay) or more data",
            alert.metric,
        )

    def __init__(self, config: EvalLossRiseConfig) -> None:
        super().__init__(config)
        self.settings = config
        self.watches = frozenset({config.eval_metric, config.train_metric, "lr", *TASK_METRICS})
        self._warmup = Warmup(config.warmup_steps)
        self._train_label = "train loss" if config.train_metric == "loss" else config.train_metric
        self._reset()

    def _reset(self) -> None:
        self._warmup.reset()
        self._forget()

    def _forget(self) -> None:
        """What the evaluations and train values so far taught: none of it."""
        # Its median is asked for at evaluations only: sorted then, not on every train value.
        self._train = LazyRolling(self.settings.train_window)
        self._train_seen = False
        self._best: tuple[int | None, float] | None = None
        #: Train level at the best evaluation (or at the first one after it that had one).
        self._train_at_best: float | None = None
        self._after_best: deque[tuple[int | None, float]] = deque(maxlen=KEPT_EVALS)
        self._first_after_best: int | None = None
        self._last_eval: tuple[int | None, float] | None = None
        #: The latest evaluations, whose changes are the metric's own noise.
        self._evals: deque[float] = deque(maxlen=self.settings.noise_evals)
        #: (step, value) of each task metric the evaluations logged (``TASK_METRICS``).
        self._tasks: dict[str, deque[tuple[int | None, float]]] = {}
        self._rise_run = 0
        #: Where the evaluations were read (the log an alert at its end names).
        self._source = ""
        #: Consecutive evaluations above the bar (``_bar``) of the best before each.
        self._above_run = 0
        #: The highest evaluation since the best (None: none since).
        self._peak: float | None = None
        #: How far above its best (a fraction of it) each of the last excursions went that
        #: came back to a new best before it warned: the run's own tail, which a rise must
        #: pass.
        self._came_back: deque[float] = deque(maxlen=TAILS_KEPT)
        self._open = False

    def job_started(self, now: float) -> None:
        self._reset()

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        if sample.name == "lr":
            known = self._warmup.lr_rising
            self._warmup.observe(sample)
            if known is None and self._warmup.lr_rising and not self._open:
                # The rate rises from its first values on: what came with the first was in
                # warmup too (a YOLOv8 run's epoch-1 evaluation stood as "the best" for
                # 55 epochs of a 34-epoch warmup).
                self._forget()
        if not math.isfinite(sample.value) or self._warmup.active(sample.step):
            return []
        if sample.name == self.settings.train_metric:
            self._train.add(sample.value)
            self._train_seen = True
            return []
        if sample.name in TASK_METRICS and sample.name != self.settings.eval_metric:
            self._task(sample.name).append((sample.step, sample.value))
            return []
        if sample.name != self.settings.eval_metric:
            return []
        return self._evaluation(sample, source, now)

    def can_absorb(self, block: Block) -> bool:
        """Whether the block is train values only, or evaluations that provably raise nothing.

        Train values only fill the train window. A block of evaluations raises nothing
        when, within an episode, none beats the best (that resolves); outside one, when
        train loss cannot be falling at them, or else when no evaluation rises ``rises``
        times in a row nor passes the margin above the best before it. The learning rate
        must not be warming up in the block.
        """
        judged = self._judged(block)
        return judged is not None and (
            judged[0] != self.settings.eval_metric or self._calm(*judged[1:])
        )

    def absorb(self, block: Block) -> None:
        """The state the block's lines leave, one by one."""
        judged = self._judged(block)
        assert judged is not None
        name, values, steps = judged
        for task in TASK_METRICS.keys() & block.columns.keys():
            if task != self.settings.eval_metric:
                finite = [
                    (step, value)
                    for step, value in zip(block.steps, block.columns[task], strict=True)
                    if math.isfinite(value) and not self._warmup.active(step)
                ]
                self._task(task).extend(finite)
        if not values:
            return
        if name == self.settings.train_metric:
            train = self._train
            for value in values[-self.settings.train_window :]:
                train.add(value)
            self._train_seen = True
            return
        train_now = self._train.median() if len(self._train) else None
        self._source = block.source
        for step, value in zip(steps, values, strict=True):
            self._note(step, value, train_now)

    def _judged(self, block: Block) -> tuple[str, list[float], list[int]] | None:
        """The judged metric of the block (train or eval), with the values and steps the
        lines hand on; None when the warmup may end inside the block or both metrics come."""
        names = block.names
        warmup = self._warmup
        if warmup.lr_rising is not False and "lr" in names:
            return None
        train_metric, metric = self.settings.train_metric, self.settings.eval_metric
        if train_metric in names:
            if metric in names:
                return None  # train values between evaluations: line by line
            name = train_metric
        elif metric in names:
            name = metric
        else:
            return "", [], []
        if warmup.lr_rising:
            return name, [], []
        values, steps = block.columns[name], block.steps
        first = warmup.warmup_steps
        if first and min(steps) < first:
            keep = list(map(first.__le__, steps))
            values, steps = list(compress(values, keep)), list(compress(steps, keep))
        if not math.isfinite(sum(values)):
            keep = list(map(math.isfinite, values))
            values, steps = list(compress(values, keep)), list(compress(steps, keep))
        return name, values, steps

    def _calm(self, values: list[float], steps: list[int]) -> bool:
        """Whether these evaluations, each at a new step, raise nothing."""
        if not values:
            return True
        last = self._last_eval
        if not all(map(lt, steps, islice(steps, 1, None))) or (
            last is not None and last[0] is not None and steps[0] <= last[0]
        ):
            return False  # an evaluation again: line by line skips it
        best = self._best
        best_before = list(accumulate(values, min, initial=best[1] if best else math.inf))
        if self._open:
            return not any(map(is_new_best, values, best_before))  # a new best resolves
        train = self._train
        train_now = sorted_median(sorted(train.values)) if len(train) else None
        at_best = self._train_at_best
        # Seen and not falling now, train loss cannot fall before a new best, and after one
        # it is compared with itself.
        if self._train_seen and not train_falling(train_now, at_best):
            return True
        bars = map(margin_bar, best_before, repeat(self.settings.margin))
        if not all(map(le, values, bars)):
            return False
        before = [last[1] if last is not None else math.inf, *values[:-1]]
        rising = list(compress(count(), map(is_rise, values, before)))
        rises = self.settings.rises
        if rising and rising[0] == 0 and self._rise_run:
            need = rises - self._rise_run
            if need <= 0 or (len(rising) >= need and rising[need - 1] == need - 1):
                return False
        return not (
            len(rising) >= rises
            and (rises - 1) in map(sub, islice(rising, rises - 1, None), rising)
        )

    def _evaluation(self, sample: Sample, source: str, now: float) -> list[Alert]:
        step, value = sample.step, sample.value
        self._source = source
        last = self._last_eval
        if last is not None and step is not None and last[0] is not None and step <= last[0]:
            if step == last[0]:
                return []  # the same evaluation again (a log line and trainer_state.json)
            # An earlier step: the run started again in the same log (Keras' CSVLogger
            # appending each run, a job re-run from its start), judged from its own best.
            self._reset()
            last = None
        best = self._best
        train_now = self._train.median() if len(self._train) else None
        self._note(step, value, train_now)
        time = sample.time if sample.time is not None else now
        if best is None or is_new_best(value, best[1]):
            alerts = [self._resolve(sample, source, time, best)] if self._open else []
            self._open = False
            return alerts
        if self._open:
            return []
        best_value = best[1]
        # Either way, the eval above its best by more than its own wobble: three small
        # rises of a noisy validation set (0.634 -> 0.637 -> 0.658 -> 0.678, where it
        # was at 0.687 four epochs before) are its noise.
        beyond_noise = value - best_value > self.settings.noise_sigmas * eval_noise(self._evals)
        by_rises = (
            self._rise_run >= self.settings.rises
            and value > self._tail_bar(best_value)
            and beyond_noise
        )
        if not by_rises and (self._above_run < self.settings.margin_evals or not beyond_noise):
            return []
        if self._train_seen and not train_falling(train_now, self._train_at_best):
            return []  # train loss not falling: divergence or a data problem, not overfitting
        if self._task_improved(best[0], step):
            return []  # the metric the run is judged by still improves: no overfit of it
        self._open = True
        return [
            self._overfit_alert(
                sample,
                source=source,
                time=time,
                best=best,
                train_now=train_now,
                by_rises=by_rises,
            )
        ]

    def _task(self, name: str) -> deque[tuple[int | None, float]]:
        found = self._tasks.get(name)
        if found is None:
            found = self._tasks[name] = deque(maxlen=TASK_KEPT)
        return found

    def _task_improved(self, best: int | None, now: int | None) -> bool:
        """Whether the task metric the evaluations log (the first of ``TASK_METRICS`` known
        at both: the WER before the accuracy, the accuracy before the F1) is better at the
        evaluation ``now`` than at the ``best`` one's: the metric the run is judged by."""
        if best is None or now is None:
            return False
        for name, higher in TASK_METRICS.items():
            values = self._tasks.get(name)
            if not values:
                continue
            then = next((v for s, v in reversed(values) if s is not None and s <= best), None)
            later = next((v for s, v in reversed(values) if s is not None and s <= now), None)
            if then is None or later is None:
                continue
            return later > then if higher else later < then
        return False

    def _note(self, step: int | None, value: float, train_now: float | None) -> None:
        """What one evaluation (after the previous, at a later step) changes, alerts aside:
        the runs of rises and of evaluations above the bar, the best, the excursion since."""
        last, best = self._last_eval, self._best
        self._rise_run = self._rise_run + 1 if last is not None and is_rise(value, last[1]) else 0
        above = best is not None and value > self._bar(best[1])
        self._above_run = self._above_run + 1 if above else 0
        self._last_eval = (step, value)
        self._evals.append(value)
        if best is None or is_new_best(value, best[1]):
            peak = self._peak
            if best is not None and peak is not None and peak > best[1] > 0 and not self._open:
                # Came back before it warned: the run's own wobble, not an overfit it mended.
                self._came_back.append(peak / best[1] - 1.0)
            self._peak = None
            self._best = (step, value)
            self._train_at_best = train_now
            self._after_best.clear()
            self._first_after_best = None
            return
        self._peak = value if self._peak is None else max(self._peak, value)
        if not self._after_best:
            self._first_after_best = step
        self._after_best.append((step, value))
        if self._train_at_best is None:
            self._train_at_best = train_now

    def _tail_bar(self, best: float) -> float:
        """The least a rise above ``best`` must reach: past the farthest of the last
        excursions the run came back from (``_came_back``)."""
        return best + max(self._came_back, default=0.0) * abs(best)

    def _bar(self, best: float) -> float:
        """What an evaluation above ``best`` must pass to count towards a rise however it
        got there: the margin, and the run's own tail."""
        return max(margin_bar(best, self.settings.margin), self._tail_bar(best))

    def log_ended(self, now: float, tail: Sequence[str]) -> list[Alert]:
        """A replayed log whose last evaluation is past the bar (``_bar``) of its best and
        its own noise, the train loss falling and the task metric no better: a warning,
        though no second evaluation came to confirm it. A 3-epoch fine-tune's last
        evaluation 12% above its best, its accuracy down, is the commonest overfit, and the
        last word of its log."""
        del tail
        last, best = self._last_eval, self._best
        if self._open or last is None or best is None or self._above_run < 1:
            return []
        step, value = last
        if value - best[1] <= self.settings.noise_sigmas * eval_noise(self._evals):
            return []
        train_now = self._train.median() if len(self._train) else None
        if self._train_seen and not train_falling(train_now, self._train_at_best):
            return []
        if self._task_improved(best[0], step):
            return []
        self._open = True
        sample = Sample(self.settings.eval_metric, value, step)
        alert = self._overfit_alert(
            sample,
            source=self._source,
            time=now,
            best=best,
            train_now=train_now,
            by_rises=False,
            note=" (at the log's last evaluation)",
        )
        return [alert]

    def _overfit_alert(
        self,
        sample: Sample,
        *,
        source: str,
        time: float,
        best: tuple[int | None, float],
        train_now: float | None,
        by_rises: bool,
        note: str = "",
    ) -> Alert:
        """The episode's warning: the eval metric above its ``best`` (step, value)."""
        best_step, best_value = best
        name, value = self.settings.eval_metric, sample.value
        above = (value - best_value) / abs(best_value) if best_value else math.inf
        at = f" at step {best_step}" if best_step is not None else ""
        if by_rises:
            what = f"{name} rose {self._rise_run} evaluations in a row to {value:.4g}, {above:.0%}"
        else:
            what = f"{name} at {value:.4g} is {above:.0%}"
        if train_now is not None and self._train_at_best is not None:
            train = (
                f", while {self._train_label} fell from {self._train_at_best:.4g}"
                f" to {train_now:.4g}"
            )
        else:
            train = f" (no {self._train_label} logged to compare)"
        keep = f"; the best checkpoint is the one{at}" if best_step is not None else ""
        return Alert(
            rule=self.rule,
            severity=self.settings.severity,
            message=f"{what} above its best {best_value:.4g}{at}{train}: overfitting{keep}{note}",
            time=time,
            source=source,
            step=sample.step,
            metric=name,
            value=value,
            onset_step=self._first_after_best,
            details={
                "kind": "rises" if by_rises else "margin",
                "best_step": best_step,
                "best_value": best_value,
                "above_best": above,
                "rises": self._rise_run,
                "train_at_best": self._train_at_best,
                "train_now": train_now,
                "steps": [best_step] + [step for step, _ in self._after_best],
                "values": [best_value] + [v for _, v in self._after_best],
            },
        )

    def _resolve(
        self, sample: Sample, source: str, time: float, best: tuple[int | None, float] | None
    ) -> Alert:
        before = f" (was {best[1]:.4g} at step {best[0]})" if best is not None else ""
        return Alert(
            rule=self.rule,
            severity=Severity.INFO,
            message=f"{self.settings.eval_metric} at a new best {sample.value:.4g}{before}",
            time=time,
            source=source,
            step=sample.step,
            metric=self.settings.eval_metric,
            value=sample.value,
            resolves=True,
        )
