r"""Detection quality: every fixture with known truth, replayed as ``sentinel replay`` does.

Two kinds of case, each replayed with the default settings and no configuration:

- the generated runs, ``tests/fixtures/*/expected.json`` (written by the
  generators beside them from the framework's own records): each log file of
  a fixture is one case (``train.log``, ``train.unbuffered.log`` and
  ``trainer_state.json`` are three captures of one run). The truth is read from
  the expected.json: ``first_nonfinite_step`` (rule ``nan_inf``),
  ``spike_steps`` (``loss_spike``, the first spike), ``jump_step``
  (``divergence``), the first eval after ``eval_min_step`` that is above the
  minimum (``eval_loss_rise``), ``nan_from_step`` (``nan_inf``); a fixture with
  none of these, whose scenario is ``healthy`` or whose ``incident`` is null, is
  a healthy run;
- the real published runs, ``tests/corpus/{healthy,failed}/*/expected.json``:
  each folder is one run, its files replayed together.

Two tables come out. **Detection**, one row per failed case: the first bad step
the truth names, the step and rule of the first alert that caught it (the
expected rule, or else any critical), and the lead of the first alert of any
rule before the bad step, in steps and in logged steps (how many of the run's
logged steps lie between). **False alarms**, over the healthy cases: runs,
warnings and criticals (episodes: an alert that opened one), how many the
corpus lists as expected (a real eval-loss rise), and the same per rule.

Nothing is compared with a stored number: every figure comes from the replay.

    .venv/bin/python bench/detection.py                   # both tables, Markdown
    .venv/bin/python bench/detection.py --case hf/nan/trainer_state.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentinel.config import Settings, load_settings
from sentinel.engine.replay import replay
from sentinel.model.records import Alert, Severity
from sentinel.parsing import LineParser
from sentinel.parsing.files import iter_replay_batches, replay_plan
from sentinel.parsing.hf_trainer import read_trainer_state

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CORPUS = ROOT / "tests" / "corpus"
#: Beside a fixture's logs, not logs themselves.
NOT_LOGS = {"expected.json", "README.md", "SOURCE.md", "hparams.yaml"}


@dataclass
class Case:
    name: str
    paths: list[Path]
    #: None for a healthy run.
    bad_step: int | None = None
    rule: str | None = None
    #: Rules whose warnings this healthy run is expected to raise (a real rise).
    expected_warnings: set[str] = field(default_factory=set)


@dataclass
class Outcome:
    case: Case
    alerts: list[Alert]
    samples: int
    logged: list[int]

    @property
    def detection(self) -> Alert | None:
        """The first alert of the expected rule, or else the first critical."""
        for alert in self.alerts:
            if alert.rule == self.case.rule or alert.severity == Severity.CRITICAL:
                return alert
        return None

    @property
    def first_alert(self) -> Alert | None:
        return self.alerts[0] if self.alerts else None

    def lead(self) -> tuple[int | None, int | None]:
        """Steps and logged steps from the first alert to the bad step (None: no lead)."""
        first, bad = self.first_alert, self.case.bad_step
        if first is None or first.step is None or bad is None or first.step > bad:
            return None, None
        return bad - first.step, sum(1 for step in self.logged if first.step <= step < bad)

    def episodes(self, severity: Severity) -> Counter[str]:
        """Per rule, the alerts that opened an episode whose worst was ``severity``."""
        worst: dict[str, list[Severity]] = {}
        for alert in self.alerts:
            worst.setdefault(alert.rule, []).append(alert.severity)
        return Counter(
            {rule: 1 for rule, seen in worst.items() if max(seen, key=lambda s: s.rank) == severity}
        )


def _truth(data: dict[str, Any]) -> tuple[int | None, str | None] | None:
    """(first bad step, rule) from a generated fixture's expected.json; (None, None) when
    healthy; None when it holds no truth about the run's health."""
    if isinstance(data.get("first_nonfinite_step"), int):
        return data["first_nonfinite_step"], "nan_inf"
    if data.get("spike_steps"):
        return int(data["spike_steps"][0]), "loss_spike"
    if isinstance(data.get("jump_step"), int):
        return data["jump_step"], "divergence"
    if isinstance(data.get("eval_min_step"), int):
        after = [s for s, v in data["eval_losses"] if s > data["eval_min_step"]]
        above = [s for s, v in data["eval_losses"] if s in after and v > data["eval_min_value"]]
        return (above[0] if above else None), "eval_loss_rise"
    if isinstance(data.get("nan_from_step"), int):
        return data["nan_from_step"], "nan_inf"
    if data.get("scenario") == "healthy" or ("incident" in data and data["incident"] is None):
        return None, None
    return None


def fixture_cases(root: Path = FIXTURES) -> list[Case]:
    found = []
    for expected in sorted(root.glob("**/expected.json")):
        folder = expected.parent
        if CORPUS in expected.parents:
            continue
        truth = _truth(json.loads(expected.read_text(encoding="utf-8")))
        if truth is None:
            continue
        for path in sorted(folder.iterdir()):
            if path.name in NOT_LOGS or path.suffix == ".py" or path.name.endswith("expected.json"):
                continue
            name = str(path.relative_to(root))
            found.append(Case(name, [path], bad_step=truth[0], rule=truth[1]))
    return found


def corpus_cases(root: Path = CORPUS) -> list[Case]:
    found = []
    for expected in sorted(root.glob("*/*/expected.json")):
        data = json.loads(expected.read_text(encoding="utf-8"))
        folder = expected.parent
        paths = [folder / file for file in data["files"]]
        name = str(folder.relative_to(root))
        if data["kind"] == "failed":
            found.append(Case(name, paths, bad_step=data["first_bad_step"], rule=data["rule"]))
        else:
            allowed = {entry["rule"] for entry in data.get("expected_warnings", [])}
            found.append(Case(name, paths, expected_warnings=allowed))
    return found


def logged_steps(paths: Sequence[Path], settings: Settings) -> list[int]:
    """The distinct steps the run logged a value at, read as replay reads them (the
    steps a line names; a line without one adds none)."""
    steps: set[int] = set()
    parser = LineParser(
        regexes=settings.parsers.regexes, logging_steps=settings.parsers.logging_steps
    )
    states = [p for p in paths if p.name == "trainer_state.json"]
    for state in states:
        steps.update(s.step for s in read_trainer_state(state.read_text("utf-8")) if s.step)
    plan = replay_plan([p for p in paths if p not in states])
    readers = {file.source: file.new_reader() for group in plan for file in group}
    for source, texts in iter_replay_batches(plan):
        reader = readers.get(source)
        for text in texts:
            samples = parser.parse_with(reader, text) if reader else parser.parse(text)
            steps.update(sample.step for sample in samples if sample.step is not None)
    return sorted(steps)


def evaluate(case: Case, settings: Settings | None = None) -> Outcome:
    settings = settings or load_settings(None, environ={})
    result = replay(case.paths, settings)
    alerts = [alert for alert in result.alerts if not alert.resolves]
    try:
        logged = logged_steps(case.paths, settings)
    except (OSError, ValueError):  # the lead in logged steps is then left out
        logged = []
    return Outcome(case, alerts, result.samples, logged)


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def detection_rows(outcomes: Iterable[Outcome]) -> list[list[str]]:
    rows = []
    for outcome in outcomes:
        case = outcome.case
        if case.rule is None:
            continue
        hit = outcome.detection
        if hit is None:
            verdict = "missed"
        elif case.bad_step is None:
            verdict = "caught (the log names no step)"
        elif hit.step == case.bad_step:
            verdict = "at its step"
        elif hit.step is None:
            verdict = "no step"
        else:
            verdict = f"{hit.step - case.bad_step:+d} steps"
        steps, logged = outcome.lead()
        first = outcome.first_alert
        rows.append(
            [
                case.name,
                _cell(case.bad_step),
                _cell(case.rule),
                _cell(hit.step if hit else None),
                f"{hit.rule} ({hit.severity})" if hit else "-",
                verdict,
                f"{first.rule} @ {_cell(first.step)}" if first else "-",
                _cell(steps),
                _cell(logged if outcome.logged else None),
                _diagnosis(hit),
            ]
        )
    return rows


def _diagnosis(alert: Alert | None, width: int = 70) -> str:
    """The cause the detecting alert's incident was diagnosed with, cut to ``width``."""
    cause = str((alert.details.get("diagnosis") or {}).get("cause", "")) if alert else ""
    return (cause[: width - 3] + "...") if len(cause) > width else (cause or "-")


def false_alarm_rows(outcomes: Iterable[Outcome]) -> tuple[list[list[str]], list[list[str]]]:
    """The totals row and the per-rule rows over the healthy cases."""
    healthy = [o for o in outcomes if o.case.rule is None]
    warnings: Counter[str] = Counter()
    criticals: Counter[str] = Counter()
    expected: Counter[str] = Counter()
    runs_hit: Counter[str] = Counter()
    for outcome in healthy:
        warned, critical = outcome.episodes(Severity.WARNING), outcome.episodes(Severity.CRITICAL)
        warnings.update(warned)
        criticals.update(critical)
        expected.update({r: n for r, n in warned.items() if r in outcome.case.expected_warnings})
        runs_hit.update({rule: 1 for rule in set(warned) | set(critical)})
    total = [
        [
            str(len(healthy)),
            str(sum(1 for o in healthy if o.alerts)),
            str(sum(warnings.values())),
            str(sum(expected.values())),
            str(sum(warnings.values()) - sum(expected.values())),
            str(sum(criticals.values())),
        ]
    ]
    per_rule = [
        [
            rule,
            str(warnings[rule]),
            str(expected[rule]),
            str(criticals[rule]),
            str(runs_hit[rule]),
        ]
        for rule in sorted(set(warnings) | set(criticals))
    ]
    return total, per_rule


def alarm_rows(outcomes: Iterable[Outcome]) -> list[list[str]]:
    """Each healthy run that raised something: its first alert of each rule."""
    rows = []
    for outcome in outcomes:
        if outcome.case.rule is not None:
            continue
        seen: set[str] = set()
        for alert in outcome.alerts:
            if alert.rule in seen:
                continue
            seen.add(alert.rule)
            expected = "yes" if alert.rule in outcome.case.expected_warnings else "no"
            rows.append(
                [outcome.case.name, alert.rule, str(alert.severity), _cell(alert.step), expected]
            )
    return rows


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


DETECTION = (
    "case",
    "first bad step",
    "expected rule",
    "detected at",
    "by",
    "verdict",
    "first alert",
    "lead (steps)",
    "lead (logged steps)",
    "diagnosis",
)
TOTALS = ("healthy runs", "runs with alerts", "warnings", "expected", "unexpected", "criticals")
PER_RULE = ("rule", "warnings", "of them expected", "criticals", "runs")
ALARMS = ("healthy run", "rule", "severity", "first at step", "expected")


def report(outcomes: list[Outcome]) -> str:
    total, per_rule = false_alarm_rows(outcomes)
    return "\n\n".join(
        [
            "Detection (failed runs)",
            markdown(DETECTION, detection_rows(outcomes)),
            "False alarms (healthy runs)",
            markdown(TOTALS, total),
            markdown(PER_RULE, per_rule) if per_rule else "(no rule fired)",
            markdown(ALARMS, alarm_rows(outcomes)) if per_rule else "",
        ]
    )


def all_cases() -> list[Case]:
    return fixture_cases() + [
        Case("corpus/" + c.name, c.paths, c.bad_step, c.rule, c.expected_warnings)
        for c in corpus_cases()
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="only these cases (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    cases = all_cases()
    if args.case:
        cases = [case for case in cases if case.name in set(args.case)]
    sys.stdout.write(report([evaluate(case) for case in cases]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
