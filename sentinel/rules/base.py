"""What every rule is: the ``Detector`` contract, ``BaseDetector`` and the settings each rule has.

A rule module imports this, never the package (whose ``__init__`` loads the registry).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Protocol

from pydantic import BeforeValidator, Field, model_validator
from pydantic_settings import NoDecode

from sentinel.model.bounds import SettingsTable
from sentinel.model.facts import RunFacts
from sentinel.model.records import PROGRESS, Alert, Block, Line, Sample, Severity

if TYPE_CHECKING:
    from sentinel.model.incidents import Incident

#: What an incident suggests: (cause, advice, the metric to draw around the onset).
Reading = tuple[str, str, str | None]
#: The last samples of each metric before an incident (``sentinel.engine.history``).
Recent = Mapping[str, Sequence[Sample]]

#: The release in which renamed config keys stop being accepted.
REMOVED_IN = "0.3"


def _one_or_more_names(value: object) -> object:
    """Let one name stand for a list of one: ``"eval_loss"``; a JSON list is a list."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"not a valid JSON list of names: {error.msg}") from None
        return [text] if text else []
    return value


#: Metric names: a list, or one name as a plain string (in a file or a variable).
MetricNames = Annotated[list[str], NoDecode, BeforeValidator(_one_or_more_names)]


#: A step a message names of a sample at no step: `` at step None``, `` since step None``.
_NO_STEP = re.compile(r" (?:at|since|from) step None\b")


class RuleConfig(SettingsTable):
    """Settings every rule has (and the bounds of every setting: ``sentinel.model.bounds``)."""

    #: Old key -> the key that replaced it, accepted until ``REMOVED_IN``. The config
    #: loader renames them (and warns, naming where each came from) before validating.
    renamed: ClassVar[Mapping[str, str]] = {}

    enabled: bool = True
    #: What sentinel does when this rule raises a critical alert during ``run``:
    #: notify only, stop the job, or stop it, roll back and restart it.
    on_critical: Literal["notify", "stop", "restart"] = "restart"

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """Take an old key built into code (``LossSpikeConfig(persist_steps=4)``) as its new one."""
        if not isinstance(data, dict):
            return data
        for old, new in cls.renamed.items():
            if old not in data:
                continue
            if new in data:
                raise ValueError(f"{old} is the old name of {new}: give only {new}")
            warnings.warn(
                f"{cls.__name__}: {old} is deprecated, use {new} (the old name goes in"
                f" {REMOVED_IN})",
                DeprecationWarning,
                stacklevel=2,
            )
            data = {**data, new: data[old]}
            del data[old]
        return data


class MetricRuleConfig(RuleConfig):
    """Settings of the rules that judge a metric against its own recent history."""

    #: Severity of the alert the rule raises.
    severity: Severity = Severity.WARNING
    #: Steps at the start of each attempt judged only for growth by orders of magnitude.
    #: Besides these, the learning-rate warmup is found by itself when the job logs
    #: ``lr``: while the logged rate still rises the rule relaxes (it learns, and warns only
    #: on a loss or grad-norm far above the least seen: ``warmup_factor``), never switches off.
    warmup_steps: int = Field(default=0, ge=0)


class Detector(Protocol):
    """The contract of a rule. Every hook returns the alerts it raises (often none)."""

    rule: ClassVar[str]
    #: The metric names ``observe`` is called for; None means every metric.
    watches: frozenset[str] | None

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        """A metric value arrived (its step already filled in by the engine)."""
        ...

    def output(self, line: Line) -> list[Alert]:
        """Any line of output arrived, metric or not (progress, warnings, tracebacks)."""
        ...

    def output_text(self, text: str, source: str, now: float) -> list[Alert]:
        """``output`` for the line ``Line(source, text, now)``, without making it."""
        ...

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """The samples of one line, in order: ``observe`` for each one the rule is shown.

        Returns (index in ``samples``, alert) pairs in order.
        """
        ...

    def tick(self, now: float) -> list[Alert]:
        """Time passed; time-based rules decide here."""
        ...

    def job_started(self, now: float) -> None:
        """A new attempt of the job began: forget the previous attempt's episode."""
        ...

    def job_exited(self, exit_code: int | None, now: float, *, expected: bool) -> list[Alert]:
        """The job exited; ``expected`` when sentinel itself stopped it; ``exit_code`` None
        when it cannot be known (a job sentinel did not start)."""
        ...

    def log_ended(self, now: float, tail: Sequence[str]) -> list[Alert]:
        """A replayed log has no more lines, ``tail`` its last: what its end says
        (``sentinel replay``)."""
        ...


class BaseDetector:
    """A detector whose hooks do nothing; subclasses override what they need."""

    rule: ClassVar[str]
    config_model: ClassVar[type[RuleConfig]] = RuleConfig
    #: The metric names ``observe`` is called for (canonical names, see
    #: ``sentinel.parsing.ALIASES``); None means every metric. The engine routes
    #: samples by it, so a rule pays nothing for metrics it ignores.
    watches: frozenset[str] | None = None
    #: Whether ``observe`` is also shown progress-bar samples (name ``PROGRESS``, "step")
    #: when they advance the step; other rules see only metrics.
    sees_progress: ClassVar[bool] = False
    #: Whether a rule that sees progress reads a block's ``progress`` (the bars among HF
    #: Trainer output) in ``can_absorb``; the engine shows such blocks to no other.
    absorbs_progress: ClassVar[bool] = False
    #: What is known about the run (batch size, total steps, GPUs, price), shared with
    #: the engine, which sets it; plain data, read-only to the rules.
    facts: RunFacts

    # What the rest of sentinel asks a rule, instead of matching its id.

    #: Whether a stop for this rule first takes the evidence of what the live job was doing
    #: (its stacks, its threads, the GPUs: ``sentinel.evidence.capture``); a NaN's stop
    #: waits for none of it.
    evidence_before_stop: ClassVar[bool] = False
    #: Whether a critical of this rule is the node's fault, not the run's: the verdict says
    #: "retry elsewhere" (92) and the job is not restarted here.
    node_fault: ClassVar[bool] = False
    #: The story the rule's alerts tell with other rules' (a grad-norm run, a loss spike,
    #: then a NaN are one blow-up): the episodes of one story share an incident. None: the
    #: rule's episodes are incidents of their own.
    story: ClassVar[str | None] = None
    #: Whether an alert of this rule is the loss or grad-norm rising: a jump or a warmup of
    #: the logged learning rate before it is then the likely cause.
    divergent: ClassVar[bool] = False
    #: Whether this rule's alert is the failure that the others' warnings lead up to
    #: (``replay`` reports each rule's lead before it).
    failure_point: ClassVar[bool] = False
    #: Where this rule's reading of a whole incident comes among the other readings (lower
    #: first); None: it reads only incidents whose worst alert is its own (``read_alert``).
    incident_reading: ClassVar[int | None] = None

    @classmethod
    def read_incident(
        cls,
        incident: Incident,
        recent: Recent,
        lr: tuple[str, str] | None,
        divergent: frozenset[str],
    ) -> Reading | None:
        """What an incident this rule is part of suggests, whatever its worst alert: asked
        in ``incident_reading`` order, the first answer is the diagnosis. ``lr`` is what the
        logged learning rate did before it (``sentinel.rules.lr_jumps.lr_evidence``),
        ``divergent`` the incident's rules whose alerts are the loss or grad-norm rising."""
        return None

    @classmethod
    def read_alert(cls, alert: Alert, recent: Recent) -> Reading | None:
        """What an incident whose worst alert is ``alert`` (this rule's) suggests, when no
        rule read the whole incident; None: the alert's own ``advice``."""
        return None

    def start_notes(self) -> list[str]:
        """What to tell the user once, at start, about this rule's settings (a budget with
        no price to count it in). The facts are set by then."""
        return []

    def __init__(self, config: RuleConfig) -> None:
        self.config = config
        self.facts = RunFacts()

    def sample_alert(
        self,
        sample: Sample,
        *,
        severity: Severity,
        message: str,
        time: float,
        source: str,
        **fields: Any,
    ) -> Alert:
        """An alert of this rule about ``sample``: its step, metric and value; ``fields``
        (``onset_step``, ``resolves``, ``details``) for the rest. Keyword arguments only, so
        every rule builds its alerts the one way. A sample at no step (a log that names none:
        apex's overflow lines, HF dicts with no progress bar) has its message name none."""
        if sample.step is None and "step None" in message:
            message = _NO_STEP.sub("", message)
        return Alert(
            rule=self.rule,
            severity=severity,
            message=message,
            time=time,
            source=source,
            step=sample.step,
            metric=sample.name,
            value=sample.value,
            **fields,
        )

    def observe(self, sample: Sample, source: str, now: float) -> list[Alert]:
        return []

    def observe_samples(
        self, samples: list[Sample], source: str, now: float
    ) -> list[tuple[int, Alert]]:
        """The samples of one line (their steps filled in), in order; (index, alert) pairs.

        Exactly ``observe`` on each sample the rule is shown: a metric it ``watches``,
        a progress sample when it ``sees_progress``. The engine calls this once a line
        instead of ``observe`` once a sample; a rule overrides it where one pass over
        the line is much cheaper (replay feeds millions of lines).
        """
        found: list[tuple[int, Alert]] = []
        watches = self.watches
        for index, sample in enumerate(samples):
            name = sample.name
            if name == PROGRESS:
                if not self.sees_progress:
                    continue
            elif watches is not None and name not in watches:
                continue
            for alert in self.observe(sample, source, now):
                found.append((index, alert))
        return found

    def can_absorb(self, block: Block) -> bool:
        """Whether ``block`` is uneventful for this rule: fed line by line, it would
        raise no alert, and ``absorb`` can leave exactly the state that feeding would.

        The engine asks only the rules a block concerns: those that watch one of its
        metrics, those that watch output when ``block.output``, those with a ``tick``
        when ``block.ticks``; a rule answers for all of those hooks. It must change
        nothing (the engine may then feed the block line by line after all), and
        should cost a few C-level passes over the columns (``max``, ``sum``), not a
        Python loop per line: it is replay's hot path. When unsure, say False: the
        block is then split and, in the end, fed line by line, which is always right.
        """
        return False

    def absorb(self, block: Block) -> None:
        """Take a block ``can_absorb`` accepted: the state feeding it line by line leaves,
        bit for bit (the same floats, the same deques)."""
        raise NotImplementedError(f"{self.rule} accepts no block")

    def output(self, line: Line) -> list[Alert]:
        return []

    def output_text(self, text: str, source: str, now: float) -> list[Alert]:
        """``output(Line(source, text, now))``; a rule overrides it to skip making the
        ``Line`` (the engine calls it for every line of output)."""
        return self.output(Line(source, text, now))

    def tick(self, now: float) -> list[Alert]:
        return []

    def job_started(self, now: float) -> None:
        return None

    def job_exited(self, exit_code: int | None, now: float, *, expected: bool) -> list[Alert]:
        return []

    def log_ended(self, now: float, tail: Sequence[str]) -> list[Alert]:
        return []

    def memory(self, now: float) -> dict[str, Any] | None:
        """What the rule knows of the whole run, as JSON, kept across restarts of sentinel
        (cost_overrun: the spend so far); None when it keeps nothing."""
        return None

    def remember(self, memory: dict[str, Any], *, same_job: bool) -> None:
        """Take back what ``memory`` saved, after ``job_started``; ``same_job`` when the
        attempt is the one it was saved in (sentinel restarted beside a running job)."""
        return None
