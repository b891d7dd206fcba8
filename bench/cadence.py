r"""Detection at any logging cadence: failure shapes injected into real healthy runs.

Real runs log at every cadence: every step (a LoRA run), every 10 or 100, every 500 (the
HF Trainer's default ``logging_steps``, six values for a 3,000-step fine-tune). A watcher
may see 2 values before the failure, or attach mid-run. This benchmark measures what
sentinel raises at each cadence and each length of history, with the default settings and
no configuration, deterministically (no randomness: the same table every run).

**Inputs.** The healthy real runs of ``tests/corpus/healthy`` and the real every-step run
of ``bench/runs/hf-every-step`` (an HF Trainer run of 10,000 steps logging every step,
made by ``bench/runs/make_every_step_run.py``). Each run is read as sentinel reads it, into
one record per logged step.

**Cadences.** A run is made sparser as frameworks make it: the training losses of each
window of ``cadence`` steps are averaged (the Trainer and Lightning log the mean of the
window), the other metrics (learning rate, grad-norm, loss scale) are the window's last
value, and an evaluation stays at its own step. A run that logs every ``d`` steps gives
cadence ``c`` when ``c >= d``, by windows of ``round(c / d)`` of its records; a finer
cadence than it logs is skipped and counted.

**Shapes**, injected at the step where the window ``pre`` starts (so that exactly ``pre``
logged values come before the onset), into the run's own records before the averaging:

- ``nan``, ``inf``: the loss is non-finite from the onset on;
- ``lr_jump_xK`` (K = 10, 30, 100, 1000): the learning rate is K times the run's from the
  onset on; the loss rises to ``1 + 0.8 log10 K`` times its level over 10 steps and settles
  at ``1 + 0.25 log10 K`` (the measured x120 Trainer run: 2.9x, then 1.5x), the grad-norm
  with it;
- ``shift_xS`` (S = 1.3, 1.5, 2, 3): the loss is S times its own from the onset on, nothing
  else moves;
- ``spike_xS`` (S = 3, 10, 50): the loss of the onset step alone is S times its own;
- ``blowup_x150``, ``blowup_x5000``: from the onset the loss is 150 (5,000) times the
  median of its last 10 values before it and the grad-norm 1,000 (45,000) times its own
  (the fp16 blow-up of issue 29; 150, not 100: a blow-up of "x100 or more" against a
  median taken otherwise than the rule's would sit on the rule's bar); only into runs
  that log a grad-norm (the corroboration);
- ``grad_explosion``: the grad-norm grows 10x every 10 steps from the onset (to 1e8x), the
  loss rises by a fifth;
- ``scale_collapse``: the run logs an fp16 loss scale of 65,536; from the onset it halves
  at every step (every step overflows) down to 1e-4 (fairseq's minimum);
- ``drift``: the loss rises steadily, doubling over 20 logged values.

A shape is injected into runs whose losses are all above 0 (a ratio of a loss at or below
0 means nothing); the others are skipped and counted. ``pre`` is 2, 5, 20 and 200 values
from the start of the run, and ``attached``: the onset after 200 values, with the watcher
attached 5 values before it (it sees only those). After the onset 20 logged values are fed
(fewer when the run ends first); a shape that stays (the LR jump, the shift, the drift)
needs 3 of them, the onset's and two more (that it stays shows only over values; a run
that ends sooner is skipped and counted). A log whose steps start again (Keras'
``CSVLogger(append=True)`` appends each run to one file) is one run per start.

**Per cell** (shape x cadence x pre): cases; recall (a warning or critical at or after the
onset, of a rule that judges more than evaluations: the shapes change no evaluation);
logged values from the onset to the first warning (or critical) and to the first
critical, the median over the cases (0: on the onset's own value); false alarms, alerts
before the onset per 1,000 values fed before it. **Healthy**: each run whole at each
cadence: warnings and criticals (episodes: alerts that open one) per 1,000 logged values.
The targets of issue 29 are checked first: each says met or not, with the cells that
miss it.

    .venv/bin/python bench/cadence.py                 # the tables, Markdown
    .venv/bin/python bench/cadence.py --json out.json # and every cell, for a diff
    .venv/bin/python bench/cadence.py --shapes nan lr_jump_x30 --cadences 1 500
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from sentinel.config import Settings, load_settings
from sentinel.engine.core import Engine, build_detectors
from sentinel.model.records import Alert, Severity
from sentinel.parsing import LineParser
from sentinel.parsing.files import iter_replay_batches, replay_plan
from sentinel.parsing.hf_trainer import read_trainer_state

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus" / "healthy"
EVERY_STEP = ROOT / "bench" / "runs" / "hf-every-step"
NOT_LOGS = {"expected.json", "README.md", "SOURCE.md", "hparams.yaml"}

CADENCES = (1, 10, 100, 500)
PRES: tuple[int | str, ...] = (2, 5, 20, 200, "attached")
#: Logged values fed after the onset.
AFTER = 20
#: ``attached``: the onset after this many values, the watcher attached this many before it.
ATTACHED_AT, ATTACHED_SEES = 200, 5
#: Metrics averaged over a window (the training loss); the others are the window's last.
AVERAGED = ("loss",)

Record = dict[str, float]


@dataclass
class Run:
    """One real run, one record per logged step (name -> value), and its evaluations."""

    name: str
    steps: list[int]
    records: list[Record]
    evals: dict[int, Record] = field(default_factory=dict)

    @property
    def every(self) -> int:
        """The steps between two logged records, the median."""
        gaps = [b - a for a, b in zip(self.steps, self.steps[1:], strict=False) if b > a]
        return max(1, int(statistics.median(gaps))) if gaps else 1

    @property
    def positive(self) -> bool:
        losses = [r["loss"] for r in self.records if "loss" in r]
        return bool(losses) and all(math.isfinite(v) and v > 0 for v in losses)


def read_runs(folder: Path, settings: Settings) -> list[Run]:
    """The runs in ``folder`` as sentinel reads them: their samples grouped by step, one
    run per attempt (a log whose steps start again, as Keras' ``CSVLogger(append=True)``
    appends each run to one file, holds one run per start: grouped by step together, the
    later run's values would overwrite the earlier's at the same steps and make a run
    that never was). Those with no training loss at two steps are left out."""
    paths = sorted(p for p in folder.iterdir() if p.is_file() and p.name not in NOT_LOGS)
    samples = []  # (attempt, sample)
    states = [p for p in paths if p.name == "trainer_state.json"]
    for state in states:
        samples += [(0, sample) for sample in read_trainer_state(state.read_text("utf-8"))]
    logs = [p for p in paths if p not in states]
    if logs:
        parser = LineParser(logging_steps=settings.parsers.logging_steps)
        plan = replay_plan(logs)
        readers = {file.source: file.new_reader() for group in plan for file in group}
        attempts: dict[str, tuple[int, int]] = {}  # source -> (attempt, its last loss step)
        for source, texts in iter_replay_batches(plan):
            reader = readers.get(source)
            for text in texts:
                for sample in parser.parse_with(reader, text) if reader else parser.parse(text):
                    attempt, last = attempts.get(source, (0, -1))
                    if sample.name == "loss" and sample.step is not None:
                        if sample.step < last:
                            attempt += 1  # the steps start again: the next run
                        attempts[source] = attempt, sample.step
                    samples.append((attempt, sample))
    by_step: dict[int, dict[int, Record]] = {}
    evals: dict[int, dict[int, Record]] = {}
    for attempt, sample in samples:
        if sample.step is None:
            continue
        name = sample.name
        if name.startswith("eval_"):
            evals.setdefault(attempt, {}).setdefault(sample.step, {})[name] = sample.value
        elif name in ("loss", "lr", "grad_norm", "loss_scale"):
            by_step.setdefault(attempt, {}).setdefault(sample.step, {})[name] = sample.value
    runs = []
    for attempt, records in sorted(by_step.items()):
        steps = sorted(step for step, record in records.items() if "loss" in record)
        if len(steps) >= 2:
            name = folder.name if len(by_step) == 1 else f"{folder.name}#{attempt + 1}"
            runs.append(Run(name, steps, [records[step] for step in steps], evals.get(attempt, {})))
    return runs


def healthy_runs(settings: Settings) -> tuple[list[Run], list[str]]:
    """The healthy runs, and the folders that gave none (no loss at a step)."""
    folders = sorted(p for p in CORPUS.iterdir() if p.is_dir())
    if EVERY_STEP.is_dir():
        folders.append(EVERY_STEP)
    runs, unread = [], []
    for folder in folders:
        found = read_runs(folder, settings)
        if not found:
            unread.append(folder.name)
        runs += found
    return runs, unread


# -- shapes: (records, steps, onset index) -> records, the run's own records changed ----

Shape = Callable[[list[Record], list[int], int], list[Record]]


def _scaled(
    records: list[Record], onset: int, scale: Callable[[int, Record], Record]
) -> list[Record]:
    return [dict(r) if i < onset else scale(i - onset, dict(r)) for i, r in enumerate(records)]


def _non_finite(value: float) -> Shape:
    def shape(records: list[Record], steps: list[int], onset: int) -> list[Record]:
        def change(_: int, r: Record) -> Record:
            r["loss"] = value
            return r

        return _scaled(records, onset, change)

    return shape


def _lr_jump(factor: float) -> Shape:
    peak = 1 + 0.8 * math.log10(factor)
    settle = 1 + 0.25 * math.log10(factor)

    def shape(records: list[Record], steps: list[int], onset: int) -> list[Record]:
        start = steps[onset]

        def change(_: int, r: Record, step: int) -> Record:
            t = step - start
            level = 1 + (peak - 1) * min(1.0, (t + 1) / 10)
            if t >= 10:
                level = settle + (peak - settle) * math.exp(-(t - 10) / 20)
            r["loss"] *= level
            if "lr" in r:
                r["lr"] *= factor
            if "grad_norm" in r:
                r["grad_norm"] *= 1 + 4 * (level - 1)
            return r

        return [
            dict(r) if i < onset else change(i - onset, dict(r), steps[i])
            for i, r in enumerate(records)
        ]

    return shape


def _shift(factor: float) -> Shape:
    def shape(records: list[Record], steps: list[int], onset: int) -> list[Record]:
        def change(_: int, r: Record) -> Record:
            r["loss"] *= factor
            return r

        return _scaled(records, onset, change)

    return shape


def _spike(factor: float) -> Shape:
    def shape(records: list[Record], steps: list[int], onset: int) -> list[Record]:
        def change(index: int, r: Record) -> Record:
            if index == 0:
                r["loss"] *= factor
            return r

        return _scaled(records, onset, change)

    return shape


def _blowup(loss: float, grad: float) -> Shape:
    def shape(records: list[Record], steps: list[int], onset: int) -> list[Record]:
        # x ``loss`` the median of the run's last 10 losses before the onset (as the issue's
        # fp16 blow-up was measured), following the run's own wobble from there.
        before = [r["loss"] for r in records[max(0, onset - 10) : onset]] or [records[0]["loss"]]
        level, first = statistics.median(before), records[onset]["loss"]
        grads = [r["grad_norm"] for r in records[max(0, onset - 10) : onset] if "grad_norm" in r]
        grad_level = statistics.median(grads) if grads else 1.0

        def change(_: int, r: Record) -> Record:
            r["loss"] = loss * level * r["loss"] / first
            r["grad_norm"] = grad * grad_level * r.get("grad_norm", grad_level) / grad_level
            return r

        return _scaled(records, onset, change)

    return shape


def _grad_explosion(records: list[Record], steps: list[int], onset: int) -> list[Record]:
    start = steps[onset]

    def change(r: Record, step: int) -> Record:
        r["grad_norm"] = r.get("grad_norm", 1.0) * 10 ** min(8.0, (step - start) / 10 + 1)
        r["loss"] *= 1.2
        return r

    return [dict(r) if i < onset else change(dict(r), steps[i]) for i, r in enumerate(records)]


def _scale_collapse(records: list[Record], steps: list[int], onset: int) -> list[Record]:
    start = steps[onset]
    out = []
    for i, r in enumerate(records):
        r = dict(r)
        halvings = 0 if i < onset else steps[i] - start + 1
        r["loss_scale"] = max(1e-4, 65536.0 / 2.0 ** min(halvings, 40))
        out.append(r)
    return out


def _drift(steps_per_value: int) -> Shape:
    """The loss doubles over ``AFTER`` logged values of ``steps_per_value`` steps each."""

    def shape(records: list[Record], steps: list[int], onset: int) -> list[Record]:
        start = steps[onset]

        def change(r: Record, step: int) -> Record:
            r["loss"] *= 1 + (step - start + 1) / (AFTER * steps_per_value)
            return r

        return [dict(r) if i < onset else change(dict(r), steps[i]) for i, r in enumerate(records)]

    return shape


def _fixed(shape: Shape) -> Callable[[int], Shape]:
    return lambda _steps_per_value: shape


#: Each shape, made for the steps a logged value spans (only the drift's rate needs it).
SHAPES: dict[str, Callable[[int], Shape]] = {
    "nan": _fixed(_non_finite(math.nan)),
    "inf": _fixed(_non_finite(math.inf)),
    **{f"lr_jump_x{k}": _fixed(_lr_jump(k)) for k in (10, 30, 100, 1000)},
    **{f"shift_x{s:g}": _fixed(_shift(s)) for s in (1.3, 1.5, 2, 3)},
    **{f"spike_x{s}": _fixed(_spike(s)) for s in (3, 10, 50)},
    "blowup_x150": _fixed(_blowup(150, 1000)),
    "blowup_x5000": _fixed(_blowup(5000, 45000)),
    "grad_explosion": _fixed(_grad_explosion),
    "scale_collapse": _fixed(_scale_collapse),
    "drift": _drift,
}


# -- cadence: averaged windows ----------------------------------------------------------


@dataclass
class Logged:
    """A run at one cadence: its logged records (step, record) and evaluations."""

    steps: list[int]
    records: list[Record]
    #: Evaluations, each at the index of the logged record it comes after.
    evals: dict[int, list[tuple[int, Record]]]


def at_cadence(run: Run, records: list[Record], per_window: int) -> Logged:
    """``records`` (the run's, maybe changed) averaged by windows of ``per_window``."""
    steps, out = [], []
    for start in range(0, len(records) - per_window + 1, per_window):
        window = records[start : start + per_window]
        record: Record = dict(window[-1])
        for name in AVERAGED:
            values = [r[name] for r in window if name in r]
            if values:
                record[name] = math.fsum(values) / len(values)
        steps.append(run.steps[start + per_window - 1])
        out.append(record)
    evals: dict[int, list[tuple[int, Record]]] = {}
    index = 0
    for step in sorted(run.evals):
        while index < len(steps) and steps[index] < step:
            index += 1
        evals.setdefault(index - 1, []).append((step, run.evals[step]))
    return Logged(steps, out, evals)


def lines(logged: Logged, first: int, last: int) -> list[str]:
    """JSON lines for the logged records ``first`` to ``last`` (exclusive) and the
    evaluations among them, as a script that logs a dict per step writes them."""
    out = []
    for index in range(first, last):
        record = {"step": logged.steps[index], **logged.records[index]}
        out.append(json.dumps(_named(record)))
        for step, values in logged.evals.get(index, []):
            out.append(json.dumps({"step": step, **values}))
    return out


def _named(record: Record) -> dict[str, Any]:
    named: dict[str, Any] = {}
    for name, value in record.items():
        named["learning_rate" if name == "lr" else name] = value
    return named


# -- replay ------------------------------------------------------------------------------


#: Rules that judge only evaluations: the shapes change none, so their alerts in a shape's
#: case are the base run's own (a real eval-loss rise), not a detection.
EVAL_ONLY = frozenset({"eval_loss_rise"})


def feed(texts: list[str], settings: Settings) -> list[tuple[int, Alert]]:
    """(index of the line, alert) for each alert that opens or escalates, fed line by line
    to a fresh engine with the data's own clock."""
    engine = Engine(build_detectors(settings), LineParser(), data_clock=True)
    engine.facts = settings.run_facts()
    found = []
    for index, text in enumerate(texts):
        for alert in engine.feed_texts("train.log", [text], 0.0):
            if not alert.resolves and alert.severity >= Severity.WARNING:
                found.append((index, alert))
    return found


@dataclass
class Cell:
    shape: str
    cadence: int
    pre: int | str
    cases: int = 0
    found: int = 0
    to_warning: list[int] = field(default_factory=list)
    to_critical: list[int] = field(default_factory=list)
    criticals: int = 0
    early_alerts: int = 0
    early_values: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    rules: dict[str, int] = field(default_factory=dict)
    #: Cases whose failure stands apart from the run before it (``stands_apart``), and
    #: how many of them were found.
    apart: int = 0
    apart_found: int = 0
    #: Cases whose first record after the onset is a corroborated blow-up of x100 or more
    #: as the log shows it (``blows_up``), and how many of them were critical on it.
    blowups: int = 0
    blowups_first: int = 0

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    @property
    def recall(self) -> float | None:
        return self.found / self.cases if self.cases else None

    @property
    def false_per_1000(self) -> float | None:
        return 1000 * self.early_alerts / self.early_values if self.early_values else None


def run_cell(cell: Cell, runs: Sequence[Run], settings: Settings) -> Cell:
    for run in runs:
        if cell.cadence < run.every:
            cell.skip("logs less often")
            continue
        if not run.positive:
            cell.skip("loss <= 0")
            continue
        if cell.shape.startswith("blowup") and not any("grad_norm" in r for r in run.records):
            cell.skip("no grad-norm")
            continue
        per_window = max(1, round(cell.cadence / run.every))
        windows = len(run.records) // per_window
        before = ATTACHED_AT if cell.pre == "attached" else int(cell.pre)
        if windows < before + 1:
            cell.skip("too short")
            continue
        if cell.shape.startswith(STAYING) and windows < before + STAYS:
            cell.skip("too short to stay")
            continue
        onset = before * per_window  # the first record of window ``before``
        shape = SHAPES[cell.shape](per_window * run.every)
        changed = shape(run.records, run.steps, onset)
        logged = at_cadence(run, changed, per_window)
        first = before - ATTACHED_SEES if cell.pre == "attached" else 0
        last = min(len(logged.steps), before + AFTER)
        texts = lines(logged, first, last)
        onset_line = len(lines(logged, first, before))
        alerts = feed(texts, settings)
        cell.cases += 1
        apart = stands_apart(logged.records[first:before], logged.records[before:last])
        cell.apart += apart
        cell.early_values += before - first
        cell.early_alerts += sum(1 for index, _ in alerts if index < onset_line)
        late = [
            (index, alert)
            for index, alert in alerts
            if index >= onset_line and alert.rule not in EVAL_ONLY
        ]
        if late:
            cell.found += 1
            cell.apart_found += apart
            values = _values_between(texts, onset_line, late[0][0])
            cell.to_warning.append(values)
            rule = late[0][1].rule
            cell.rules[rule] = cell.rules.get(rule, 0) + 1
        critical = [index for index, alert in late if alert.severity == Severity.CRITICAL]
        if critical:
            cell.criticals += 1
            cell.to_critical.append(_values_between(texts, onset_line, critical[0]))
        if blows_up(logged.records[first:before], logged.records[before:last]):
            cell.blowups += 1
            cell.blowups_first += bool(critical) and cell.to_critical[-1] == 0
    return cell


#: Shapes that stay (the learning rate's jump, the shift, the drift), and the logged values
#: from the onset on a case of them needs: that a loss stays up shows only over values (one
#: is a spike's, and two are one's that the averaging split over two windows); a run that
#: ends sooner is skipped and counted ("too short to stay").
STAYING = ("lr_jump", "shift", "drift")
STAYS = 3

#: Training losses after the onset whose median ``stands_apart`` compares...
APART_VALUES = 5
#: ...and the least ratio of it to the level before that is a change of the run's course
#: (divergence's default ``rise``: a loss 1.07x its level is within any run's wobble).
APART_RISE = 1.3


def stands_apart(before: Sequence[Record], after: Sequence[Record]) -> bool:
    """Whether a failure shows in the log as a change of the run's course: two training
    losses or more after the onset, the median of the first ``APART_VALUES`` of them above
    every loss logged before it past the run's first descent (``past_descent``: a descent is
    the run learning, not its range), by a ratio to the level before it (the median of the
    last 3) of ``APART_RISE`` or more and more than any rise the run made from one logged
    value to the next past that descent. Where it stays under (a loss still falling fast
    early in a run: x2 of a loss that fell 4x in the values before is still under them), or
    within the run's own swings (a BERT-tiny classifier's logged loss went 0.0018 -> 0.0433
    on its own: a x2 shift of it looks as it does), or one value is all there is (a spike
    and a shift look alike), no rule can tell it from a healthy run with the values it has."""
    losses_before, losses_after = _losses(before), _losses(after)[:APART_VALUES]
    if not losses_before or len(losses_after) < 2 or min(losses_before) <= 0:
        return False
    past = past_descent(losses_before)
    now = statistics.median(losses_after)
    level = statistics.median(losses_before[-3:])
    swing = max((b / a for a, b in pairwise(past)), default=1.0)
    return now > max(past) and now / level >= max(APART_RISE, swing)


def past_descent(losses: Sequence[float]) -> list[float]:
    """``losses`` from the trough of the descent they open with (the last value before the
    first that rises; the last value when none does)."""
    trough = next((i for i, (a, b) in enumerate(pairwise(losses)) if b > a), len(losses) - 1)
    return list(losses[trough:])


#: A blow-up's size, as ``blows_up`` measures it: the first loss after the onset against
#: the least of the last ``BLOWUP_LEVEL`` logged before it, floored at ``SCALE_FLOOR`` of
#: where the log began (the median of its first ``BLOWUP_LEVEL``); the corroboration: the
#: grad-norm on its record ``BLOWUP_GRAD`` times the median of those logged before it.
BLOWUP_FACTOR, BLOWUP_GRAD, BLOWUP_LEVEL, SCALE_FLOOR = 100.0, 10.0, 3, 0.01


def blows_up(before: Sequence[Record], after: Sequence[Record]) -> bool:
    """Whether the first record after the onset is a corroborated blow-up of x100 or more
    as the log shows it: its loss ``BLOWUP_FACTOR`` times the level before it, that level
    floored at ``SCALE_FLOOR`` of where the log began, and above every loss logged before
    it (the floor of scale issue 29 asks for: a real healthy BERT-tiny classifier whose
    loss fell 1,000x had hard batches 179x its level, a fifth of where it began, its
    grad-norm 24x with them; a watcher that attached after the fall knows no start), its
    grad-norm ``BLOWUP_GRAD`` times theirs. A x150 injected into a run that fell fast,
    averaged over a window that holds the fall, can be much less once logged."""
    losses, grads = _losses(before), [r["grad_norm"] for r in before if "grad_norm" in r]
    if not losses or not grads or not after or "loss" not in after[0]:
        return False
    level = max(min(losses[-BLOWUP_LEVEL:]), SCALE_FLOOR * statistics.median(losses[:BLOWUP_LEVEL]))
    grad, loss = after[0].get("grad_norm", 0.0), after[0]["loss"]
    return (
        level > 0
        and loss >= BLOWUP_FACTOR * level
        and loss > max(losses)
        and grad >= BLOWUP_GRAD * statistics.median(grads)
    )


def _losses(records: Sequence[Record]) -> list[float]:
    """The training losses of ``records``, in order."""
    return [r["loss"] for r in records if "loss" in r]


def _values_between(texts: list[str], onset_line: int, line: int) -> int:
    """Logged training values from the onset's (0) to the one on ``line``."""
    return sum(1 for text in texts[onset_line:line] if '"loss"' in text)


@dataclass
class Healthy:
    cadence: int
    runs: int = 0
    values: int = 0
    warnings: int = 0
    criticals: int = 0
    rules: dict[str, int] = field(default_factory=dict)
    skipped: int = 0


def run_healthy(cadence: int, runs: Sequence[Run], settings: Settings) -> Healthy:
    row = Healthy(cadence)
    for run in runs:
        if cadence < run.every:
            row.skipped += 1
            continue
        per_window = max(1, round(cadence / run.every))
        logged = at_cadence(run, run.records, per_window)
        if len(logged.steps) < 2:
            row.skipped += 1
            continue
        texts = lines(logged, 0, len(logged.steps))
        row.runs += 1
        row.values += len(logged.steps)
        for _, alert in feed(texts, settings):
            key = f"{alert.rule} ({run.name})"
            row.rules[key] = row.rules.get(key, 0) + 1
            if alert.severity == Severity.CRITICAL:
                row.criticals += 1
            else:
                row.warnings += 1
    return row


# -- the report --------------------------------------------------------------------------


def _median(values: list[int]) -> str:
    return "-" if not values else f"{statistics.median(values):g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def markdown(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(out)


def cell_rows(cells: Sequence[Cell]) -> list[list[object]]:
    rows = []
    for c in cells:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(c.skipped.items())) or "-"
        rules = ", ".join(f"{rule} {n}" for rule, n in sorted(c.rules.items())) or "-"
        early = c.false_per_1000
        rows.append([
            c.shape, c.cadence, c.pre, c.cases, _pct(c.recall), _median(c.to_warning),
            f"{c.criticals}/{c.cases}" if c.cases else "-", _median(c.to_critical),
            "-" if early is None else f"{early:.1f}", f"{c.apart_found}/{c.apart}", rules,
            skipped,
        ])  # fmt: skip
    return rows


def matrix(cells: Sequence[Cell], pres: Sequence[int | str] = (2, 5, 20)) -> list[list[object]]:
    """Rows of shape x pre, a column per cadence: recall / share critical."""
    by = {(c.shape, c.pre, c.cadence): c for c in cells}
    cadences = sorted({c.cadence for c in cells})
    rows: list[list[object]] = []
    for shape in dict.fromkeys(c.shape for c in cells):
        for pre in pres:
            row: list[object] = [shape, pre]
            for cadence in cadences:
                cell = by.get((shape, pre, cadence))
                if cell is None or not cell.cases:
                    row.append("-")
                else:
                    row.append(f"{_pct(cell.recall)} / {_pct(cell.criticals / cell.cases)}")
            rows.append(row)
    return rows


def targets(cells: Sequence[Cell], healthy: Sequence[Healthy], every_step: str) -> list[str]:
    """Issue 29's targets, each met or not, with the cells that miss it."""

    def check(name: str, misses: list[str]) -> str:
        return f"- {'met' if not misses else 'NOT met'}: {name}" + (
            f" (misses: {'; '.join(misses)})" if misses else ""
        )

    def where(c: Cell) -> str:
        return f"{c.shape} @{c.cadence} pre {c.pre}"

    out = []
    out.append(check(
        "NaN/Inf found at every cadence, on its first value",
        [where(c) for c in cells if c.shape in ("nan", "inf") and c.cases
         and (c.found < c.cases or any(v > 0 for v in c.to_warning))],
    ))  # fmt: skip
    big_jumps = ("lr_jump_x30", "lr_jump_x100", "lr_jump_x1000")
    shifts = ("shift_x1.5", "shift_x2", "shift_x3")
    staying = [c for c in cells if c.shape in big_jumps + shifts and c.pre == 5 and c.cases]
    out.append(check(
        "LR jumps of x30 or more and shifts of x1.5 or more found with 5 values before them,"
        " where the log shows them (the median of the first"
        f" {APART_VALUES} losses after the onset, 2 or more, above every loss logged before it"
        f" past the run's first descent, {APART_RISE:g}x or more its level before and more"
        " than the run's own rises from one value to the next)",
        [f"{where(c)}: {c.apart_found} of {c.apart}" for c in staying
         if c.apart_found < c.apart],
    ))  # fmt: skip
    out.append(_as_injected(
        "the same, as injected", sum(c.found for c in staying), sum(c.cases for c in staying),
        "the others stay within the run's own course (a loss still falling fast, or"
        " swinging more than the shift): a healthy run's log looks the same",
    ))  # fmt: skip
    blowups = [c for c in cells if c.shape.startswith("blowup") and c.cases]
    out.append(check(
        "a corroborated blow-up of x100 or more critical on its first value, as the log"
        f" shows it (its loss {BLOWUP_FACTOR:g}x the least of the {BLOWUP_LEVEL} logged"
        f" before it, floored at {SCALE_FLOOR:.0%} of where the log began, and above every"
        f" loss logged before it; its grad-norm {BLOWUP_GRAD:g}x their median)",
        [f"{where(c)}: {c.blowups_first} of {c.blowups}" for c in blowups
         if c.blowups_first < c.blowups],
    ))  # fmt: skip
    out.append(_as_injected(
        "the same, as injected (x150 and x5,000 the median of the last 10 steps)",
        sum(c.to_critical.count(0) for c in blowups),
        sum(c.cases for c in blowups),
        "the others are under x100 of the floored level once averaged and logged, or under"
        " a loss the run logged before, as a healthy run's hard batch can be",
    ))  # fmt: skip
    out.append(check(
        "a spike under x100 that recovers never critical",
        [where(c) for c in cells if c.shape.startswith("spike") and c.criticals],
    ))  # fmt: skip
    out.append(check(
        "no critical on any healthy run at any cadence",
        [f"@{h.cadence}: {h.criticals}" for h in healthy if h.criticals],
    ))  # fmt: skip
    dense = [h for h in healthy if h.cadence == 1]
    misses = []
    for h in dense:
        mine = sum(n for key, n in h.rules.items() if key.endswith(f"({every_step})"))
        if mine > 1:
            misses.append(f"{mine} warnings")
    out.append(check(
        "at most 1 warning per 10,000 logged values of the healthy every-step run", misses
    ))  # fmt: skip
    return out


def _as_injected(name: str, found: int, cases: int, others: str) -> str:
    """A line of figures beside a target: what sentinel did with every injected case."""
    rest = f"; {others}" if found < cases else ""
    return f"- {name}: {found} of {cases}{rest}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--cadences", nargs="*", type=int, default=list(CADENCES))
    parser.add_argument("--pres", nargs="*", default=[str(p) for p in PRES])
    parser.add_argument("--json", type=Path, help="also write every cell here")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    settings = load_settings(None, environ={})
    began = time.perf_counter()
    runs, unread = healthy_runs(settings)
    pres: list[int | str] = [p if p == "attached" else int(p) for p in args.pres]
    cells = [
        run_cell(Cell(shape, cadence, pre), runs, settings)
        for shape in args.shapes
        for cadence in args.cadences
        for pre in pres
    ]
    healthy = [run_healthy(cadence, runs, settings) for cadence in args.cadences]
    took = time.perf_counter() - began

    print(f"# Detection by cadence ({len(runs)} healthy real runs; {took:.0f} s)\n")
    if unread:
        print(f"Runs with no training loss at a step, not used: {', '.join(unread)}\n")
    print("## Targets\n")
    print("\n".join(targets(cells, healthy, EVERY_STEP.name)) + "\n")
    print("## Healthy runs alone\n")
    print(markdown(
        ["cadence", "runs", "logged values", "warnings", "criticals", "per 1,000 values",
         "skipped (logs less often)", "by rule (run)"],
        [[h.cadence, h.runs, h.values, h.warnings, h.criticals,
          f"{1000 * (h.warnings + h.criticals) / h.values:.2f}" if h.values else "-",
          h.skipped, ", ".join(f"{k} {n}" for k, n in sorted(h.rules.items())) or "-"]
         for h in healthy],
    ))  # fmt: skip
    print("\n## Recall by cadence, with 2, 5 and 20 values before the onset\n")
    print(
        "Each cell: the share of cases raised (warning or critical) / the share critical;"
        " '-' where no run is long enough.\n"
    )
    print(markdown(["shape", "pre", *[f"every {c}" for c in args.cadences]], matrix(cells)))
    print("\n## Failure shapes\n")
    print(
        "Values to warning and to critical: logged values from the onset's (0) to the"
        " first alert, the median over the cases. False alarms: alerts before the onset"
        " per 1,000 values fed before it. Found / stands apart: of the cases the log shows"
        " (``stands_apart``: the median of the first"
        f" {APART_VALUES} losses after the onset, 2 or more, above every loss logged before"
        f" it past the run's first descent, {APART_RISE:g}x or more its level before and more"
        " than the run's own rises from one value to the next), how many were found: the"
        " others stay within the run's own course (a loss still falling fast, or swinging"
        " more than the shift), and no rule can tell them from a healthy run.\n"
    )
    print(markdown(
        ["shape", "cadence", "pre", "cases", "recall", "values to warning", "critical",
         "values to critical", "false /1,000", "found / stands apart", "first rule",
         "skipped"],
        cell_rows(cells),
    ))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(
            {"cells": [vars(c) for c in cells], "healthy": [vars(h) for h in healthy]},
            indent=1, default=str,
        ))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
