"""nan_inf: a non-finite loss stops the job, a grad-norm when it is no skipped fp16 step.

Which non-finite values stop the job (the manual (docs/), "Non-finite values"):

- a loss (training or evaluation: ``loss``, ``eval_loss``, ``lm_loss``..., or a loss
  function's name: ``SmoothL1``, ``CrossEntropy``, ``logloss``), a perplexity
  (``ppl``, ``eval_perplexity``: the loss's exponent) and any metric named in
  ``stop_metrics``: critical at once;
- the grad-norm: under dynamic loss scaling an overflowing step logs a non-finite grad-norm
  with a finite loss and the scaler skips it, so alone among healthy values it is counted
  (``skipped_steps``), and a cluster of them warns. But HF's ``logging_nan_inf_filter``
  hides a NaN loss behind the running average, so a non-finite grad-norm is also how a real
  NaN shows: it is critical at once when something corroborates a failure (the grad-norm or
  the loss climbing before it, the loss scale at its minimum, a run that trains without loss
  scaling, a loss of exactly 0.0 on consecutive values, which is what the filter leaves of an
  interval of NaN steps), else when it persists for ``persist`` logged values. The incident
  names the first non-finite step;
- a training loss that falls to exactly 0 from a clear level (the value before it at least
  ``ZERO_FROM``, the last 5 at least ``ZERO_FLOOR``): the HF Trainer's nan filter logs 0.0
  for an interval whose every step's loss was NaN or Inf (an fp16 overflow that never let
  go), and a loss that underflowed or whose every label was masked is 0 too. A warning on
  the first such value, critical when the next logged value is 0 as well (its onset the
  first). A run whose first 0 came after a loss near 0, or whose 0 came back up, has a
  loss that may be 0 (a margin loss, an RL objective): its zeros are not judged;
- any other metric (BLEU, accuracy, a best-so-far tracker, a setting): a warning naming it,
  and none for a metric that has been non-finite since its first value; but when
  ``together`` or more of them that were finite before turn non-finite on the same line,
  that is the run's objective going, whatever its names (``avg_rd: nan | cur_rd: nan |
  avg_mse: nan``, a compression model's): critical, as a loss would be.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from collections.abc import Sequence
from itertools import pairwise, repeat
from typing import Any, Literal

from pydantic import Field

from sentinel.model.incidents import Incident
from sentinel.model.records import PROGRESS, Alert, Block, Sample, Severity
from sentinel.rules.base import BaseDetector, MetricNames, Reading, Recent, RuleConfig

#: Words that make a name with "loss" in it a tracker or a setting, not a loss.
_NOT_A_LOSS = frozenset({"best", "min", "max", "lowest", "highest", "scale", "scaler", "weight"})
_WORDS = re.compile(r"[a-z0-9]+")
#: Loss functions a log names a loss by, without the word (GluonCV's SSD logs
#: ``CrossEntropy=12.25, SmoothL1=nan``; a boosting library its ``logloss``).
_LOSS_FUNCTIONS = frozenset(
    {
        "crossentropy",
        "xent",
        "nll",
        "bce",
        "smoothl1",
        "l1",
        "l2",
        "mse",
        "rmse",
        "logloss",
        "mlogloss",
        "huber",
        "kld",
    }
)
#: A perplexity is its loss's exponent (``exp(loss)``): non-finite when the loss is, or
#: when the loss overflowed it. A log that gives only a perplexity (OpenNMT's ``PPL nan``,
#: MXNet's ``Train-Perplexity``) has no other loss to stop on.
_PERPLEXITY = frozenset({"ppl", "perplexity"})
#: From this logged epoch, or this step, on, a run is long past the start, where a loss
#: scaler calibrates (its first few dozen steps: 2**16 halved down to a scale that fits).
CALIBRATED_EPOCH = 1.0
CALIBRATED_STEP = 1000
#: Finite values of the train loss and the grad-norm kept to tell a climb.
KEPT = 20
#: A last grad-norm this many times the median before it is a climb. Far above the noise:
#: a real fp16 run's loss at a skipped step was 2.3x its median, and acting kills the job.
GRAD_CLIMB = 10.0
#: A last loss this many times the median before it (and above every value) is a climb.
LOSS_CLIMB = 10.0
#: A last grad-norm this many times the run's first values is a runaway, however long ago
#: it began (the window's median has long since climbed with it).
GRAD_RUNAWAY = 100.0
#: Finite grad-norms at the start whose least is the run's first level (a run can blow up
#: at its second step).
EARLY = 3
#: A training loss of exactly 0 is judged where the value before it was at least
#: ``ZERO_FROM`` and the last ``ZERO_LAST`` at least ``ZERO_FLOOR``: a loss that nears 0
#: rounds to 0 (``0.0001`` -> ``0.0``) from values far below these.
ZERO_FROM = 0.05
ZERO_FLOOR = 0.01
ZERO_LAST = 5
#: Training losses of exactly 0 from the first one on that warn: a loss that starts at 0
#: and stays there trains nothing (an MMSegmentation run's ``loss: 0.0000, acc_seg:
#: 100.0000`` from its first line, its labels all ignored).
START_ZEROS = 3
#: What a training loss of exactly 0 means, as its alerts say it.
_ZERO_WHY = (
    "a trainer that drops a non-finite loss logs 0 for it (the HF Trainer for an interval"
    " whose every step's loss was NaN or Inf, deepspeech.pytorch's 'received a nan loss,"
    " setting loss value to 0'), else the loss underflowed or every label is masked"
)

Kind = Literal["loss", "perplexity", "grad_norm", "loss_scale", "other"]

#: A job's own count of the iterations its loss scaler skipped (Megatron's, per interval).
#: Metrics that were finite before and turn non-finite on one line: the objective went.
TOGETHER = 2
SKIP_COUNTERS = frozenset({"skipped_iterations", "number_of_skipped_iterations"})


def kind_of(name: str, stop_metrics: frozenset[str]) -> Kind:
    """What a non-finite value of metric ``name`` means (see the module docstring)."""
    if name in stop_metrics:
        return "loss"
    if name == "grad_norm":
        return "grad_norm"
    if name == "loss_scale":
        return "loss_scale"
    words = _WORDS.findall(name)
    if not _NOT_A_LOSS.isdisjoint(words):
        return "other"
    if any(word.endswith("loss") or word in _LOSS_FUNCTIONS for word in words):
        return "loss"
    return "perplexity" if not _PERPLEXITY.isdisjoint(words) else "other"


class NanInfConfig(RuleConfig):
    """``[rules.nan_inf]``."""

    #: Metrics to watch; empty means every metric the job logs. Watching all of
    #: them matters: the HF Trainer's default ``logging_nan_inf_filter=True``
    #: hides a NaN loss but not the NaN grad-norm beside it.
    metrics: MetricNames = Field(default_factory=list)
    #: Metrics never watched, e.g. a loss-scale that is legitimately inf at times.
    ignore: MetricNames = Field(default_factory=list)
    #: Metrics whose non-finite value stops the job, besides every loss (only a warning
    #: by default: eval scores, perplexities, best-so-far trackers, settings).
    stop_metrics: MetricNames = Field(default_factory=list)
    #: ``none``: the run trains without loss scaling (bf16, fp32), so a non-finite
    #: grad-norm is never a skipped step; ``auto``: it may be one.
    loss_scaling: Literal["auto", "none"] = "auto"
    #: Consecutive logged non-finite grad-norms (with a finite loss) that are a failure.
    persist: int = Field(default=3, ge=1)
    #: The same before the first finite grad-norm: the scaler calibrating at the start
    #: halves its scale (65536) on each overflow.
    calibration: int = Field(default=20, ge=1)
    #: A logged loss scale at or below this is at its minimum (fairseq runs healthily at
    #: 0.5 and calibrates down to 0.004; its floor is 1e-4), as ``[rules.loss_scale]``.
    min_loss_scale: float = Field(default=1e-3, ge=0)
    #: Skipped steps among the last ``skip_window`` logged grad-norms that warn.
    skip_cluster: int = Field(default=5, ge=1)
    skip_window: int = Field(default=50, ge=1)
    #: Consecutive finite values of every offending metric that end the episode.
    resolve_after: int = Field(default=10, ge=1)


def climbed(values: deque[float], factor: float, *, last: int, above_all: bool = False) -> bool:
    """Whether the ``last`` newest values top ``factor`` times the median of those before
    (and, ``above_all``, every one of them)."""
    if len(values) < last + 4:
        return False
    kept = list(values)
    earlier, newest = kept[:-last], max(kept[-last:])
    baseline = statistics.median(earlier)
    if above_all and newest <= max(earlier):
        return False
    return baseline > 0 and newest > factor * baseline


__all__ = ["NanInfConfig", "NanInfDetector", "kind_of"]


class NanInfDetector(BaseDetector):
    """Critical on a non-finite loss or a failing grad-norm; warns on other metrics."""

    rule = "nan_inf"
    config_model = NanInfConfig
    story = "blow_up"
    failure_point = True
    incident_reading = 0  # a NaN in an incident is what its reading is about

    @classmethod
    def read_incident(
        cls,
        incident: Incident,
        recent: Recent,
        lr: tuple[str, str] | None,
        divergent: frozenset[str],
    ) -> Reading | None:
        return nan_reading(incident, recent, lr, divergent)

    def __init__(self, config: NanInfConfig) -> None:
        super().__init__(config)
        self.settings = config
        self._watched = frozenset(config.metrics)
        self._ignored = frozenset(config.ignore)
        self._stop = frozenset(config.stop_metrics)
        self._kinds: dict[str, Kind | None] = {}  # None: not watched
        #: Steps the loss scaler skipped (a lone non-finite grad-norm), this attempt.
        self.skipped_steps = 0
        self._reset()

    def _reset(self) -> None:
        # The critical episode, and the warning one: metric -> finite values seen since.
        self._offending: dict[str, int] = {}
        self._warned: dict[str, int] = {}
        self._seen_finite: set[str] = set()
        self._losses: deque[float] = deque(maxlen=KEPT)
        self._grads: deque[float] = deque(maxlen=KEPT)
        self._early_grads: list[float] = []
        self._last_loss: tuple[int | None, float] | None = None
        # Finite values of the loss and of the grad-norm this attempt (the healthy stretch).
        self._healthy = {"loss": 0, "grad_norm": 0}
        self._loss_scale: float | None = None
        # The current run of non-finite grad-norms: its first step and length.
        self._run_start: int | None = None
        self._run = 0
        # After calibration (a finite grad-norm seen): whether each logged one was skipped.
        self._calibrated = False
        #: The last epoch the job logged: far past its start, no scaler is calibrating.
        self._epoch: float | None = None
        self._skips: deque[bool] = deque(maxlen=self.settings.skip_window)
        # A training loss at exactly 0: whether it is in a row of zeros, the step of the
        # first (None: a line with no step), and whether this run's loss may be 0 (its first
        # 0 came from near 0, or came back).
        self._in_zeros = False
        self._zero_start: int | None = None
        self._zeros_normal = False
        #: Training losses of exactly 0 since the first (None: one was not).
        self._start_zeros: int | None = 0

    def job_started(self, now: float) -> None:
        self.skipped_steps = 0
        self._reset()

    def _kind(self, name: str) -> Kind | None:
        kinds = self._kinds
        if name in kinds:
            return kinds[name]
        kind: Kind | None = None
        if name not in self._ignored and (not self._watched or name in self._watched):
            kind = kind_of(name, self._stop)
        kinds[name] = kind
        return kind

    # -- feeding -------------------------------------------------------------------

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        return [alert for _, alert in self.observe_samples([sample], source, now)]

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """The line's samples, its grad-norm judged last, beside the line's own loss."""
        found: list[tuple[int, Alert]] = []
        grads: list[int] = []
        others: list[int] = []
        unseen: int | None = None  # a metric NaN before it was ever finite
        perplexity: int | None = None  # the first non-finite perplexity
        loss_went = False  # a non-finite loss on the line
        line_loss: tuple[int | None, float] | None = None
        # A training loss of exactly 0, judged after the line's grad-norm (a non-finite one
        # beside it says more): its index, and the losses before it.
        zero: tuple[int, list[float]] | None = None
        skipped_none = False
        kind_of_name = self._kind
        for index, sample in enumerate(samples):
            name, value, step = sample[0], sample[1], sample[2]
            if name == PROGRESS:
                continue
            if name == "epoch":
                self._epoch = value
            kind = kind_of_name(name)
            if kind is None:
                continue
            if kind == "grad_norm":
                grads.append(index)
                continue
            if name == "loss":
                line_loss = (step, value)
                if value == 0.0 and not self._zeros_normal:
                    zero = (index, list(self._losses)[-ZERO_LAST:])
            elif name in SKIP_COUNTERS and value == 0:
                skipped_none = True
            if math.isfinite(value):
                found += [(index, alert) for alert in self._finite(sample, kind, source, now)]
            elif kind == "loss":
                found += [(index, alert) for alert in self._critical(sample, source, now)]
                loss_went = True
            elif kind == "perplexity":
                perplexity = index if perplexity is None else perplexity
            elif kind == "other" and name in self._seen_finite:
                others.append(index)
            elif kind == "other" and math.isnan(value) and unseen is None:
                # NaN from its first value on: no tracker starts there (a best-so-far starts
                # at inf). A real DPO run's eight rewards, log-probs and logits were NaN
                # from its first line and raised nothing.
                unseen = index
        if perplexity is not None and not loss_went:
            # Its loss's exponent: critical as the loss, named by it where the line has one.
            sample = samples[perplexity]
            found += [(perplexity, alert) for alert in self._critical(sample, source, now)]
        if unseen is not None and not others:
            found += [(unseen, alert) for alert in self._warn_metric(samples[unseen], source, now)]
        if len(others) >= TOGETHER:
            found += [(others[0], alert) for alert in self._together(samples, others, source, now)]
        else:
            for index in others:
                found += [
                    (index, alert) for alert in self._warn_metric(samples[index], source, now)
                ]
        for index in grads:
            sample = samples[index]
            loss = line_loss
            if loss is None and self._last_loss is not None and self._last_loss[0] == sample[2]:
                loss = self._last_loss
            found += [
                (index, alert)
                for alert in self._grad_norm(sample, loss, source, now, skipped_none=skipped_none)
            ]
        if zero is not None:
            at, before = zero
            found += [(at, alert) for alert in self._zero_loss(samples[at], before, source, now)]
        return found

    def _finite(self, sample: Sample, kind: Kind, source: str, now: float) -> list[Alert]:
        name, value = sample[0], sample[1]
        self._seen_finite.add(name)
        if name == "loss":
            if value != 0.0:
                self._start_zeros = None
            if value != 0.0 and self._in_zeros:
                self._in_zeros, self._zero_start = False, None  # back above 0: it may be 0
                self._zeros_normal = True
            self._losses.append(value)
            self._last_loss = (sample[2], value)
            self._healthy["loss"] += 1
        elif kind == "loss_scale":
            self._loss_scale = value
        return self._count_finite(sample, source, now)

    def _count_finite(self, sample: Sample, source: str, now: float) -> list[Alert]:
        """A finite value towards the end of the episode its metric is in, if any."""
        name = sample[0]
        for episode in (self._offending, self._warned):
            if name not in episode:
                continue
            episode[name] += 1
            if min(episode.values()) >= self.settings.resolve_after:
                episode.clear()
                return [self._resolved(sample, source, now)]
        return []

    def _zero_loss(
        self, sample: Sample, before: list[float], source: str, now: float
    ) -> list[Alert]:
        """A training loss of exactly 0 (see the module docstring), ``before`` the last
        values before it: the first after a clear level warns, the next in a row is
        critical."""
        step = sample[2]
        if self._offending:
            return []
        if self._in_zeros:
            onset = self._zero_start
            since = "twice in a row" if onset is None else f"since step {onset}"
            message = (
                f"loss has been exactly 0 {since}: a loss that is 0 trains nothing ({_ZERO_WHY})"
            )
            return self._critical(sample, source, now, onset_step=onset, message=message)
        if self._start_zeros is not None:
            return self._zero_from_start(sample, source, now)
        if not before or before[-1] < ZERO_FROM or min(before) < ZERO_FLOOR:
            self._zeros_normal = True  # a loss that neared 0, or one that starts at it
            return []
        self._in_zeros, self._zero_start = True, step
        self._warned["loss"] = 0
        at = "" if step is None else f" at step {step}"
        return [
            self.sample_alert(
                sample,
                severity=Severity.WARNING,
                message=(
                    f"loss is exactly 0{at} after {before[-1]:.4g}: {_ZERO_WHY};"
                    " critical if the next value is 0 too"
                ),
                time=_time(sample, now),
                source=source,
                onset_step=step,
                details=self._details("zero_loss"),
            )
        ]

    def _zero_from_start(self, sample: Sample, source: str, now: float) -> list[Alert]:
        """A training loss exactly 0 from its first value on: a warning at the
        ``START_ZEROS``th (no loss starts at 0 and stays there: every label masked, an empty
        target, a loss term left out), and no more; a loss that moves from 0 may be 0."""
        assert self._start_zeros is not None
        self._start_zeros += 1
        if self._start_zeros < START_ZEROS:
            return []
        count, self._start_zeros, self._zeros_normal = self._start_zeros, None, True
        return [
            self.sample_alert(
                sample,
                severity=Severity.WARNING,
                message=(
                    f"loss has been exactly 0 since its first value ({count} values): a loss"
                    " that is 0 trains nothing (every label masked or ignored, an empty"
                    " target, the loss term left out of the sum)"
                ),
                time=_time(sample, now),
                source=source,
                details=self._details("zero_from_start"),
            )
        ]

    # -- the grad-norm -----------------------------------------------------------------

    def _grad_norm(
        self,
        sample: Sample,
        loss: tuple[int | None, float] | None,
        source: str,
        now: float,
        *,
        skipped_none: bool = False,
    ) -> list[Alert]:
        value, step = sample[1], sample[2]
        if math.isfinite(value):
            self._seen_finite.add("grad_norm")
            self._healthy["grad_norm"] += 1
            self._grads.append(value)
            if len(self._early_grads) < EARLY:
                self._early_grads.append(value)
            self._run = 0
            self._calibrated = True
            self._skips.append(False)
            return self._count_finite(sample, source, now)
        if self._offending:
            self._offending["grad_norm"] = 0
            return []
        if self._run == 0:
            self._run_start = step
        self._run += 1
        if loss is not None and not math.isfinite(loss[1]):
            return []  # the loss itself said so
        reasons = self._corroboration(loss, step)
        if skipped_none:
            reasons.append("the job counts no skipped iteration beside it")
        if reasons:
            return self._critical(sample, source, now, onset_step=self._run_start, reasons=reasons)
        self.skipped_steps += 1
        if not self._calibrated:
            return []  # the scaler calibrating: counted, not alarmed
        self._skips.append(True)
        if "grad_norm" in self._warned:
            self._warned["grad_norm"] = 0
            return []
        skipped = sum(self._skips)
        if skipped < self.settings.skip_cluster:
            return []
        self._warned["grad_norm"] = 0
        return [
            self.sample_alert(
                sample,
                severity=Severity.WARNING,
                message=(
                    f"the fp16 loss scaler skipped {skipped} of the last {len(self._skips)}"
                    f" logged steps (grad_norm {value} with a finite loss, last at step"
                    f" {step}); {self.skipped_steps} skipped this attempt"
                ),
                time=_time(sample, now),
                source=source,
                details=self._details("skip_cluster"),
            )
        ]

    def _corroboration(self, loss: tuple[int | None, float] | None, step: int | None) -> list[str]:
        """What says a non-finite grad-norm (with a finite loss) is a failure, not a skip."""
        settings = self.settings
        reasons = []
        if settings.loss_scaling == "none":
            reasons.append("the run trains without loss scaling")
        scale = self._loss_scale
        if scale is not None and scale <= settings.min_loss_scale:
            reasons.append(f"the loss scale is at its minimum ({scale:g})")
        if loss is not None and loss[1] == 0.0 and self._run >= 2:
            reasons.append(
                "the loss is exactly 0.0 with a non-finite grad-norm on consecutive values"
                " (what HF's nan filter leaves of an interval of NaN steps)"
            )
        if climbed(self._grads, GRAD_CLIMB, last=2):
            reasons.append(f"the grad-norm climbed to {self._grads[-1]:.4g} before it")
        early = self._early_grads
        if len(early) == EARLY and len(self._grads) > EARLY:
            newest, first = max(list(self._grads)[-2:]), min(early)
            if first > 0 and newest > GRAD_RUNAWAY * first:
                reasons.append(
                    f"the grad-norm ran away to {newest:.4g} from {first:.4g} at the start"
                )
        if climbed(self._losses, LOSS_CLIMB, last=2, above_all=True):
            reasons.append(f"the loss climbed to {max(list(self._losses)[-2:]):.4g} before it")
        past_start = self._past_start(step)
        limit = settings.persist if self._calibrated or past_start else settings.calibration
        if self._run >= limit:
            where = "" if self._calibrated or not past_start else f", {past_start}"
            reasons.append(f"it persisted for {self._run} logged values{where}")
        return reasons

    def _past_start(self, step: int | None) -> str:
        """Why the run is far past its start, where no finite grad-norm was seen (an excerpt
        of a run whose every grad-norm went NaN long ago): no loss scaler calibrates there
        (it does in its first few dozen steps); "" where nothing says so."""
        if self._epoch is not None and self._epoch >= CALIBRATED_EPOCH:
            return f"at epoch {self._epoch:g}, long past the start, when a loss scaler calibrates"
        if step is not None and step >= CALIBRATED_STEP:
            return f"at step {step}, long past the start, when a loss scaler calibrates"
        return ""

    # -- alerts --------------------------------------------------------------------

    def _critical(
        self,
        sample: Sample,
        source: str,
        now: float,
        *,
        onset_step: int | None = None,
        reasons: list[str] | None = None,
        together: str | None = None,
        message: str | None = None,
    ) -> list[Alert]:
        """Open the critical episode (or join it); a warning open is closed first, so the
        incident's onset is this failure's, not the warning's. ``reasons``: what makes a
        non-finite grad-norm a failure; ``together``: the metrics that went with it."""
        name, value, step = sample[0], sample[1], sample[2]
        first = not self._offending
        self._offending[name] = 0
        if not first:
            return []
        alerts = []
        if self._warned:
            self._warned.clear()
            alerts.append(self._resolved(sample, source, now, superseded=True))
        if onset_step is None:
            # A loss that follows a run of non-finite grad-norms: the run is the onset.
            onset_step = self._run_start if self._run and self._run_start is not None else step
        onset = onset_step
        kind = "together" if together else "grad_norm" if reasons else "loss"
        if message is not None:
            kind = "zero_loss"
        elif together:
            message = f"{name} is {value} at step {step}: {together}"
        elif reasons:
            since = f" (non-finite since step {onset})" if onset != step else ""
            message = (
                f"{name} is {value} at step {step}{since} with a finite loss: a failure,"
                f" not a skipped fp16 step: {'; '.join(reasons)}"
            )
        else:
            message = f"{name} is {value} at step {step}"
        alerts.append(
            self.sample_alert(
                sample,
                severity=Severity.CRITICAL,
                message=message,
                time=_time(sample, now),
                source=source,
                onset_step=onset,
                details=self._details(kind, [together] if together else reasons),
            )
        )
        return alerts

    def _together(
        self, samples: list[Sample], others: list[int], source: str, now: float
    ) -> list[Alert]:
        """Metrics that were finite turned non-finite together: critical, as a loss."""
        names = [samples[index][0] for index in others]
        together = (
            f"{len(names)} metrics that were finite turned non-finite together"
            f" ({', '.join(names)}): the run's objective, whatever its name, as a loss would"
        )
        alerts = self._critical(samples[others[0]], source, now, together=together)
        for name in names[1:]:
            self._offending[name] = 0
        return alerts

    def _warn_metric(self, sample: Sample, source: str, now: float) -> list[Alert]:
        name = sample[0]
        if name in self._warned or self._offending:
            if name in self._warned:
                self._warned[name] = 0
            return []
        self._warned[name] = 0
        return [
            self.sample_alert(
                sample,
                severity=Severity.WARNING,
                message=(
                    f"{name} is {sample[1]} at step {sample[2]}: a warning, not a stop"
                    " (only a loss, a failing grad-norm or [rules.nan_inf] stop_metrics"
                    " stop the job)"
                ),
                time=_time(sample, now),
                source=source,
                details=self._details("metric"),
            )
        ]

    def _resolved(
        self, sample: Sample, source: str, now: float, *, superseded: bool = False
    ) -> Alert:
        if superseded:
            message = f"the warning gives way to a failure: {sample[0]} is {sample[1]}"
        else:
            message = (
                f"every metric finite again for {self.settings.resolve_after} values"
                f" (last: {sample[0]}={sample[1]:g} at step {sample[2]})"
            )
        return self.sample_alert(
            sample,
            severity=Severity.INFO,
            message=message,
            time=_time(sample, now),
            source=source,
            resolves=True,
        )

    def _details(self, kind: str, reasons: list[str] | None = None) -> dict[str, Any]:
        details: dict[str, Any] = {
            "kind": kind,
            "skipped_steps": self.skipped_steps,
            "finite_before": max(self._healthy.values()),
        }
        if reasons:
            details["evidence"] = reasons
            details["first_nonfinite_step"] = self._run_start
        return details

    # -- replay blocks -------------------------------------------------------------

    def can_absorb(self, block: Block) -> bool:
        """Outside an episode, a block of finite values raises nothing (nor does a loss
        of exactly 0 in it, where this run's zeros are judged)."""
        if self._offending or self._warned:
            return False
        if not self._zeros_normal and 0.0 in block.columns.get("loss", ()):
            return False
        kind_of_name = self._kind
        for name in block.names:
            if kind_of_name(name) is None:
                continue
            # The sum of finite values is finite unless it overflows: then line by line.
            if not math.isfinite(sum(block.columns[name])):
                return False
        return True

    def absorb(self, block: Block) -> None:
        """What feeding the block's finite values line by line leaves."""
        columns = block.columns
        epochs = columns.get("epoch")
        if epochs:
            self._epoch = epochs[-1]
        for name in block.names:
            kind = self._kind(name)
            if kind is None:
                continue
            self._seen_finite.add(name)
            column = columns[name]
            if name == "loss":
                if any(value != 0.0 for value in column):
                    self._start_zeros = None
                self._losses.extend(column[-KEPT:])
                self._last_loss = (block.steps[-1], column[-1])
                self._healthy["loss"] += len(column)
            elif kind == "loss_scale":
                self._loss_scale = column[-1]
            elif kind == "grad_norm":
                self._grads.extend(column[-KEPT:])
                self._healthy["grad_norm"] += len(column)
                self._early_grads.extend(column[: EARLY - len(self._early_grads)])
                self._run = 0
                self._calibrated = True
                self._skips.extend(repeat(False, min(len(column), self.settings.skip_window)))


def _time(sample: Sample, now: float) -> float:
    stamp = sample[3]
    return stamp if stamp is not None else now


# What a non-finite value says, by what came before it (the diagnosis's reading of an
# incident with a NaN in it).

#: A NaN with at most this many finite values of its metric before it is "in the first steps".
FIRST_STEPS = 5
#: A logged epoch at most this far in is the first steps (when no step is known).
EARLY_EPOCH = 0.05
#: A last grad-norm this many times its earlier median before a NaN is a blow-up.
BLOW_UP_FACTOR = 5.0


def nan_reading(
    incident: Incident,
    recent: Recent,
    lr: tuple[str, str] | None,
    divergent: frozenset[str],
) -> Reading:
    """What a non-finite value says, by what came before it: a learning-rate jump or a
    warmup, a blow-up, a collapsed loss scale, the first steps (the data), or nothing (a
    bad batch, an fp16 overflow or a numerics edge case at that step)."""
    nan_alert = next(alert for alert in incident.alerts if alert.rule == NanInfDetector.rule)
    metric, step = nan_alert.metric, nan_alert.step
    if nan_alert.details.get("kind") == "zero_loss":
        at = f" at step {nan_alert.onset_step}" if nan_alert.onset_step is not None else ""
        return (
            f"the loss fell to exactly 0{at}: what a trainer that drops a non-finite loss logs"
            " for it (the HF Trainer's nan filter, deepspeech.pytorch's), or a loss that"
            " underflowed, or labels all masked",
            "under fp16, train in bf16 or lower the learning rate and clip gradients at 1.0;"
            " check that the batches still have labels (not all -100)",
            metric,
        )
    # The rule counts the train loss's and the grad-norm's finite values; another metric's
    # (Dreamer's ``model_loss``) are the ones the diagnosis reads.
    told = nan_alert.details.get("finite_before")
    shown = len(_finite_before(recent.get(metric or "", ()), step))
    before = max(told, shown) if isinstance(told, int) else shown
    grad = _grad_norm_rise(recent, step)
    climbed = _loss_climbed(recent, step)
    diverged = bool(divergent) or grad is not None or climbed
    drawn = "grad_norm" if "grad_norm" in recent else metric
    beside = f"; {grad}" if grad else ""
    if lr is not None and lr[0].startswith("the logged learning rate jumped"):
        return (f"optimisation blow-up after {lr[0]}{beside}", lr[1], drawn)
    if lr is not None and diverged:
        return (f"divergence during warmup: {lr[0]}{beside}", lr[1], drawn)
    if diverged:
        # What the log showed: a run with no grad-norm was told its grad-norm rose.
        rose = "grad-norm rose" if grad else "the loss climbed" if climbed else "the run diverged"
        return (
            f"optimisation blow-up ({rose} before the NaN){beside}",
            "lower the learning rate, add or lengthen warmup, clip gradients at 1.0,"
            " use bf16 rather than fp16",
            drawn,
        )
    where = _position(step, recent.get(metric or "", ()), recent)
    evidence = nan_alert.details.get("evidence") or []
    unscaled = _no_loss_scaling(recent, step)
    at_minimum = any("loss scale" in str(item) for item in evidence)
    if not unscaled and (at_minimum or _scale_fell(recent, step)):
        return (
            "fp16 overflow: the loss scale is at its minimum and the gradients still overflow"
            if at_minimum
            else "fp16 overflow: the loss scale fell overflow after overflow before the NaN",
            "train in bf16, or lower the learning rate and clip gradients; roll back to the"
            " last checkpoint before the overflows began",
            drawn,
        )
    if before <= FIRST_STEPS and _early(step, recent.get(metric or "", ()), recent):
        return (
            f"{metric} non-finite in the first steps",
            "look at the data: empty sequences, labels out of range, inf or NaN in the"
            " inputs, a bad tokenizer pad id",
            metric,
        )
    flat = (
        "NaN with a flat grad-norm before it"
        if _finite_before(recent.get("grad_norm", ()), step)
        else "NaN"
    )
    data = _consumed(step, recent)
    epoch = _last_epoch(recent)
    placed = step is not None or (epoch is not None and epoch > EARLY_EPOCH)
    if before > FIRST_STEPS:
        seen = f"after a healthy stretch ({before} finite values seen)"
    elif placed:
        seen = (
            "after a healthy stretch (long past the start, though the log shows only"
            f" {before} finite values before it)"
        )
    else:  # an excerpt that names no step and no epoch past the start: nothing says healthy
        seen = f"with only {before} finite values before it in the log (too few to judge the run)"
    opening = f"{flat}, out of the blue{where} {seen}"
    if before == 0 and placed:
        # The log's first value, long past the start (an excerpt that begins at the
        # failure): it said "after a healthy stretch" of none.
        opening = f"{flat}{where}, the first {metric} the log shows (nothing before it to judge by)"
    if unscaled:
        return (
            f"{opening}: a bad batch or"
            " a numerics edge case; the loss scale is 1.0 throughout, so the run has no"
            " dynamic loss scaling (bf16 or fp32): not an fp16 overflow",
            f"inspect the batch{where}{data} (the samples below); rerun that step under"
            " torch.autograd.detect_anomaly() to find the layer; if the batch is fine, look"
            " for a log(0), a division by zero or an overflow in a custom kernel",
            metric,
        )
    return (
        f"{opening}: a bad batch, an fp16 overflow or a numerics edge case",
        f"inspect the batch{where}{data} (the samples below); rerun that step under"
        " torch.autograd.detect_anomaly() to find the layer; if the batch is fine, suspect an"
        " fp16 overflow (bf16, or a lower initial loss scale) or a log(0) or division by zero",
        metric,
    )


def _position(step: int | None, samples: Sequence[Sample], recent: Recent) -> str:
    """Where the log says the NaN came: " at step N", else " at epoch E", else nothing.

    With no step, the epoch is the one logged beside the first non-finite value of
    ``samples`` where the two series line up from their ends (one line logs both: HF's
    dicts, ``epoch: 3451 loss: nan``), else the last logged epoch."""
    if step is not None:
        return f" at step {step}"
    epochs = [sample.value for sample in recent.get("epoch", ()) if math.isfinite(sample.value)]
    if not epochs:
        return ""
    first_bad = next(
        (index for index, sample in enumerate(samples) if not math.isfinite(sample.value)), None
    )
    at = None if first_bad is None else len(epochs) - len(samples) + first_bad
    epoch = epochs[at] if at is not None and 0 <= at < len(epochs) else epochs[-1]
    return f" at epoch {epoch:g}"


def _consumed(step: int | None, recent: Recent) -> str:
    """The data position the job logged for ``step``: Megatron's consumed samples after it
    (with its global batch size, the batch's own samples), else nothing."""
    if step is None:
        return ""
    consumed = [
        sample.value for sample in recent.get("consumed_samples", ()) if sample.step == step
    ]
    batch = [sample.value for sample in recent.get("global_batch_size", ()) if sample.step == step]
    if not consumed or not math.isfinite(consumed[0]):
        return ""
    after = int(consumed[0])
    if batch and math.isfinite(batch[0]) and 0 < batch[0] <= after:
        return f", consumed samples {after - int(batch[0])}-{after - 1}"
    return f", the batch before consumed sample {after}"


def _last_epoch(recent: Recent) -> float | None:
    epochs = [sample.value for sample in recent.get("epoch", ()) if math.isfinite(sample.value)]
    return epochs[-1] if epochs else None


def _no_loss_scaling(recent: Recent, step: int | None) -> bool:
    """Whether the logged loss scale says the run has no dynamic loss scaling: 1.0 on every
    value up to ``step`` (Megatron logs 1.0 under bf16 and fp32; a dynamic fp16 scaler
    starts at 2**16 and moves)."""
    scales = [
        sample.value
        for sample in recent.get("loss_scale", ())
        if step is None or sample.step is None or sample.step <= step
    ]
    return bool(scales) and all(scale == 1.0 for scale in scales)


#: A logged loss scale this many times under its first by the NaN's step: the scaler halved
#: it at overflow after overflow (a dynamic fp16 scaler halves at each one, and doubles
#: only after a long clean stretch).
SCALE_FELL = 8.0


def _scale_fell(recent: Recent, step: int | None) -> bool:
    """Whether the logged loss scale fell ``SCALE_FELL`` times or more up to ``step``: a
    run's 32768 -> 785 -> 1.0 beside its first NaN is fp16 overflowing, not the data."""
    scales = [
        sample.value
        for sample in recent.get("loss_scale", ())
        if math.isfinite(sample.value)
        and (step is None or sample.step is None or sample.step <= step)
    ]
    return len(scales) >= 2 and scales[0] > 0 and scales[-1] * SCALE_FELL <= scales[0]


def _finite_before(samples: Sequence[Sample], step: int | None) -> list[float]:
    """The finite values logged before ``step``."""
    return [
        sample.value
        for sample in samples
        if math.isfinite(sample.value)
        and (step is None or sample.step is None or sample.step < step)
    ]


def _early(step: int | None, samples: Sequence[Sample], recent: Recent) -> bool:
    """Whether ``step`` is among the run's first logged steps: at most ``FIRST_STEPS`` + 1
    logging intervals from the start, and no logged epoch past the start. A log that begins
    late (an excerpt, a resumed run) shows few values before a NaN at step 1655, which is
    no first step. With no step, the logged epoch tells (its first 5%); with neither,
    nothing says it came first."""
    epoch = _last_epoch(recent)
    # A fraction (HF's 0.02); a whole number counts epochs (0 is all of the first one, and
    # 1 may be too: a count from 1), so only one past that is surely no start.
    if step is None:
        return epoch is not None and epoch <= EARLY_EPOCH and not epoch.is_integer()
    if epoch is not None and (epoch >= 2 or (epoch > EARLY_EPOCH and not epoch.is_integer())):
        return False
    steps = sorted({sample.step for sample in samples if sample.step is not None})
    gaps = [later - earlier for earlier, later in pairwise(steps)]
    interval = statistics.median(gaps) if gaps else 1
    return step <= (FIRST_STEPS + 1) * max(interval, 1)


def _grad_norm_rise(recent: Recent, step: int | None) -> str | None:
    """The grad-norm evidence before ``step``: "grad-norm rose to X, N times its median"."""
    values = _finite_before(recent.get("grad_norm", ()), step)
    if len(values) < 3:
        return None
    baseline = statistics.median(values[:-2])
    top = max(values[-2:])
    if not (baseline > 0 and top > BLOW_UP_FACTOR * baseline):
        return None
    return f"the grad-norm rose to {top:.4g}, {top / baseline:.3g}x its median {baseline:.4g}"


def _loss_climbed(recent: Recent, step: int | None) -> bool:
    """Whether the loss climbed before ``step``: its last value ``BLOW_UP_FACTOR`` times the
    first kept, or above every earlier one by half again."""
    values = _finite_before(recent.get("loss", ()), step)
    if len(values) < 3 or values[0] <= 0:
        return False
    return values[-1] > BLOW_UP_FACTOR * values[0] or values[-1] > 1.5 * max(values[:-1])
