"""After sentinel stopped a job: restart it from a clean checkpoint, or give up and say why.

The decision is made in one place, data in and a decision out, so that the loop
only carries it out. It gives up (exit 90, docs/watch.md, "Verdicts") on the same failure at the
same step twice, when restarts are spent, when nothing clean is left to resume
from (unless ``[job] restart_without_checkpoint = "scratch"``), and when the
rollback could not set the poisoned checkpoints aside: resuming over them would
resume the poison.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sentinel.checkpoints.keep import FolderKeepers
from sentinel.checkpoints.quarantine import fresh_label
from sentinel.checkpoints.rollback import apply_rollback, plan_rollback, pointer_note
from sentinel.checkpoints.scan import EmptyDir, Onset, elsewhere, scan
from sentinel.config import ConfigError, JobConfig, KeepConfig, Settings, resume
from sentinel.model.facts import Resumed
from sentinel.model.incidents import Incident
from sentinel.model.untrusted import json_value
from sentinel.service.http import parse_http_address
from sentinel.store import verdict
from sentinel.store.verdict import (
    EXIT_GIVE_UP as EXIT_GIVE_UP,  # run gives up (the manual (docs/), "Verdicts")
)
from sentinel.supervisor.stop_journal import StopJournal

#: Before a rollback, how long to wait for versions the keeper is still copying.
KEEP_FLUSH_S = 30.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resume:
    """Where the next attempt starts: a clean checkpoint, or from scratch ("" and None)."""

    checkpoint: str = ""
    step: int | None = None


@dataclass
class Decision:
    """What to do with a job sentinel stopped: restart it, stop for good, or give up."""

    #: Where to restart from; None: no restart.
    resume: Resume | None = None
    #: Why sentinel gives up (exit 90); None when it restarts or simply stops.
    give_up: str | None = None
    backoff_s: float = 0.0
    #: What was done on the way, for the incident's timeline.
    notes: list[str] = field(default_factory=list)


#: A process's start time is known to its clock tick (10 ms): one that began this much
#: before a rollback began before it (a relaunch after the verdict begins after it).
EARLY_MARGIN_S = 0.1


class Restarts:
    """Counts restarts and decides each one (Supervisor's BACKOFF, with a cap)."""

    def __init__(
        self,
        job: JobConfig,
        checkpoints: Path | None,
        keep: KeepConfig | None = None,
        *,
        relaunches: bool = True,
        state_dir: Path | None = None,
        verdict_file: Path | None = None,
        journal: StopJournal | None = None,
    ) -> None:
        self.job = job
        #: The stop under way, written down as it goes (None: not recorded, as in tests of
        #: the decision alone).
        self.journal = journal
        #: Where the verdict goes (None: nowhere, as in tests of the decision alone).
        self.state_dir = state_dir
        self.verdict_file = verdict_file
        #: Whether sentinel starts the next attempt itself (run), or someone else (watch).
        self.relaunches = relaunches
        self.checkpoints = checkpoints
        keep = keep or KeepConfig()
        #: A checkpoint folder that stays empty while one beside it fills: a typo.
        self.empty = None if checkpoints is None else EmptyDir(checkpoints)
        #: Clean versions of the files the job rewrites in place (``ckpt.pt``).
        self.keeper = (
            None
            if checkpoints is None or keep.max_bytes == 0
            else FolderKeepers(
                checkpoints,
                max_bytes=keep.max_bytes,
                versions=keep.versions,
                settle_s=keep.settle_s,
            )
        )
        self.count = 0
        self._last_failure: tuple[str, int | None] | None = None
        #: The failure a rollback went further back for, once: it recurred at its step.
        self._further_for: tuple[str, int | None] | None = None
        #: ``decide``'s ``first_logged``, for the rollback it plans.
        self._first_logged = False
        #: Where the latest restart resumes from.
        self.resume = Resume()
        #: The failure the latest restart rolled back from: its rule and onset step.
        self.rolled_back_from: tuple[str, int | None] | None = None
        #: When the latest rollback was decided (epoch seconds; None: none yet).
        self.rolled_back_at: float | None = None
        #: ``watch``: the attempt under way was relaunched before that rollback (a stop a
        #: dead sentinel left, taken up after the wrapper gave up waiting): it resumed from
        #: what the checkpoint dir held then, not from ``resume``.
        self.relaunched_early = False

    def look(self, now: float, warned_since: tuple[int | None, float] | None = None) -> None:
        """Look at the checkpoint dir for new versions worth keeping, and for a typo in its
        name (on the clock tick). ``warned_since``: the onset (step, time) of the earliest
        open warning (``Watch.warned_since``), whose clean checkpoint the keeper keeps."""
        if self.keeper is not None:
            if warned_since is None:
                self.keeper.keep_before(None)
            else:
                step, time_ = warned_since
                self.keeper.keep_before(Onset(step=step, time=time_))
            self.keeper.poll(now)
        said = self.empty.look(now) if self.empty is not None else ""
        if said:
            log.warning("%s", said)

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.close(KEEP_FLUSH_S)

    def decide(self, incident: Incident, *, first_logged: bool = False) -> Decision:
        """``_decide``; an attempt relaunched early is so for this one failure only."""
        try:
            return self._decide(incident, first_logged=first_logged)
        finally:
            self.relaunched_early = False

    def _decide(self, incident: Incident, *, first_logged: bool = False) -> Decision:
        """Roll back and plan the restart after ``incident`` stopped the job.

        The rollback happens even when no restart follows, so that whoever resumes the
        run later (a person, an orchestrator that ignores the verdict) resumes clean.
        ``first_logged``: the attempt logged nothing before the failure's step (its very
        first values were bad: the checkpoint it resumed is).
        """
        job = self.job
        failure = (incident.rule, incident.first.step)
        self._first_logged = first_logged
        stop = ""
        if failure == self._last_failure and not self.relaunched_early:
            if failure == self._further_for or not self._resumed_the_cause(incident):
                stop = (
                    f"{incident.rule} recurred at the same step ({incident.first.step})"
                    " after a restart: not restarting again"
                )
            else:
                # The attempt failed where the run had, right from the checkpoint it resumed:
                # that checkpoint may hold the cause (NaN weights saved at step 130, the
                # first NaN loss logged at 131). Once further back, not again.
                self._further_for = failure
        elif self.count >= job.max_restarts and job.max_restarts > 0:
            stop = f"gave up after {self.count} restart(s) (max_restarts)"
        if stop or job.max_restarts == 0:
            rolled = self._rollback(incident)
            notes = [note for note in rolled.notes if "giving up" not in note]
            if rolled.give_up is not None and rolled.give_up.startswith("rollback failed"):
                notes.append(rolled.give_up)
            if not stop:
                return Decision(notes=[*notes, "not restarting (max_restarts is 0)"])
            return Decision(give_up=stop, notes=notes)
        self._last_failure = failure
        decision = self._rollback(incident)
        if decision.resume is None:
            return decision
        self.resume = decision.resume
        self.rolled_back_from = (incident.rule, incident.onset_step)
        self.rolled_back_at = time.time()
        decision.backoff_s = min(job.restart_backoff_s * 2**self.count, job.restart_backoff_max_s)
        self.count += 1
        if self.relaunches:
            decision.notes.append(
                f"restarting ({self.count} of {job.max_restarts}) in {decision.backoff_s:g} s"
            )
        else:
            decision.notes.append(
                f"rolled back for the next attempt ({self.count} of {job.max_restarts}):"
                " whoever started the job restarts it"
            )
        return decision

    def write_verdict(
        self, code: int, incident: Incident, attempt: int, resume_from: str | None = None
    ) -> bool:
        """The final verdict record (and ``verdict_file``); False, logged, when it failed."""
        if self.state_dir is None:
            return True
        journal = self.journal
        try:
            verdict.write_final(
                self.state_dir,
                code,
                None,
                incident.rule,
                incident.first.step,
                resume_from,
                attempt,
                time.time(),
                verdict_file=self.verdict_file,
                stop=None if journal is None else journal.closing(self.to_state()),
            )
        except OSError as error:
            log.error("could not write the verdict (%d): %s", code, error)
            return False
        return True

    def to_state(self) -> dict[str, str]:
        """The budget and memory that outlive sentinel itself (``sentinel watch``)."""
        return {
            "restarts.count": str(self.count),
            "restarts.last_failure": json.dumps(self._last_failure),
            "restarts.resume": json.dumps([self.resume.checkpoint, self.resume.step]),
            "restarts.rolled_back_from": json.dumps(self.rolled_back_from),
            "restarts.rolled_back_at": json.dumps(self.rolled_back_at),
        }

    def from_state(self, values: Mapping[str, str | None]) -> None:
        """Take back what ``to_state`` saved; a missing or unreadable value is left as is."""
        with contextlib.suppress(TypeError, ValueError):
            self.count = int(values.get("restarts.count") or 0)
            failure = json_value(values.get("restarts.last_failure") or "null")
            if failure is not None:
                self._last_failure = (str(failure[0]), failure[1])
            checkpoint, step = json_value(values.get("restarts.resume") or '["", null]')
            self.resume = Resume(str(checkpoint), step)
            rolled = json_value(values.get("restarts.rolled_back_from") or "null")
            if rolled is not None:
                self.rolled_back_from = (str(rolled[0]), rolled[1])
            rolled_at = json_value(values.get("restarts.rolled_back_at") or "null")
            if rolled_at is not None:
                self.rolled_back_at = float(rolled_at)

    def attempt_began(self, started_at: float, *, found_anew: bool) -> None:
        """An attempt began at ``started_at``. ``found_anew``: ``watch`` found it, and had
        not watched it before; if it began before the latest rollback was decided, by more
        than the clock's ticks, it was relaunched early and resumed from what the checkpoint
        dir held then (``relaunched_early``)."""
        at = self.rolled_back_at
        self.relaunched_early = (
            found_anew and self.count > 0 and at is not None and started_at < at - EARLY_MARGIN_S
        )

    def resumed(self, attempt: int) -> Resumed | None:
        """What ``attempt`` resumed from after a rollback, for the rules (None: it did not)."""
        if not self.count or self.rolled_back_from is None or self.relaunched_early:
            return None
        cause, onset = self.rolled_back_from
        return Resumed(attempt, self.resume.step, onset, cause)

    def argv_and_env(self, command: list[str]) -> tuple[list[str], dict[str, str]]:
        """The command and extra environment of the next attempt (the restart protocol).

        The resume command runs only with a checkpoint to fill in; a restart from
        scratch runs the original command: ``{checkpoint}`` is never filled with "".
        """
        if not self.count:
            return command, {}
        where = self.resume
        env = resume.restart_env(where.checkpoint, where.step, self.count)
        template = self.job.resume_argv
        if template is None or not where.checkpoint:
            return command, env
        step = "" if where.step is None else str(where.step)
        return resume.fill(template, {"checkpoint": where.checkpoint, "step": step}), env

    def _rollback(self, incident: Incident) -> Decision:
        """Quarantine what came after the onset; resume from the last clean checkpoint."""
        directory = self.checkpoints
        if directory is None:
            return self._without_checkpoint([], "no checkpoint dir is configured")
        if self.keeper is not None and not self.keeper.flush(KEEP_FLUSH_S):
            return Decision(
                give_up=f"rollback failed: still keeping a clean copy after {KEEP_FLUSH_S:g} s"
            )
        onset = Onset(step=self._onset_step(incident, notes := []), time=incident.onset_time)
        plan = plan_rollback(directory, onset)
        journal = self.journal
        planned = None if journal is None else journal.planned_resume
        if planned and (plan.restore is None or str(plan.restore.path.resolve()) != planned):
            # A plan taken up from a sentinel that died named a checkpoint: never from scratch,
            # never from another.
            found = "none" if plan.restore is None else str(plan.restore.path)
            return Decision(
                give_up=f"rollback failed, not restarting: the planned checkpoint {planned}"
                f" is no longer the last clean one (found: {found})"
            )
        label = (journal.label if journal is not None else None) or fresh_label(
            directory, f"{time.strftime('%Y%m%dT%H%M%S')}-{incident.rule}"
        )
        if journal is not None:  # durably, before the first move
            resume = None if plan.restore is None else str(plan.restore.path.resolve())
            journal.planned(label, resume, None if plan.restore is None else plan.restore.step)
        try:
            moved = apply_rollback(plan, directory, label=label)
        except OSError as error:
            return Decision(
                give_up=f"rollback failed, not restarting: cannot quarantine in {directory}:"
                f" {error.strerror or error}"
            )
        if self.keeper is not None:
            self.keeper.set_aside([c.path for c in plan.quarantine], KEEP_FLUSH_S)
        text = f"rolled back to {plan.restore.path.name}" if plan.restore else ""
        if plan.put_back is not None and plan.restore is not None:
            at = plan.restore.step
            text += f" (its clean version{f' of step {at}' if at is not None else ''}, kept by"
            text += " sentinel, put back in place)"
        if moved:
            names = ", ".join(f"{c.path.name} ({c.status})" for c in plan.quarantine)
            text += f"; quarantined {names} in {moved[0].parent}"
        if pointer_note(plan):
            text += f"; {pointer_note(plan)}"
        if text:
            notes.append(text.removeprefix("; "))
        if plan.restore is None:
            step = incident.onset_step
            before = f" before step {step}" if step is not None else ""
            where = "" if plan.quarantine else _where_they_are(directory)
            why = f"no clean checkpoint{before} in {directory}{where}"
            return self._without_checkpoint(notes, why)
        restore = Resume(str(plan.restore.path.resolve()), plan.restore.step)
        return Decision(resume=restore, notes=notes)

    def _onset_step(self, incident: Incident, notes: list[str]) -> int | None:
        """The step from which checkpoints are set aside: the incident's onset, or the step
        the attempt resumed from when it failed before it passed the onset it was rolled
        back from (the restart did not restore health: its checkpoint may hold the cause)."""
        onset = incident.onset_step
        if not self._resumed_the_cause(incident):
            return onset
        assert onset is not None and self.rolled_back_from is not None
        _, earlier = self.rolled_back_from
        resumed_at = self.resume.step
        where = (
            "where the run had failed before"
            if onset == earlier
            else f"before it passed step {earlier} where the run had failed"
        )
        text = (
            f"the attempt resumed from step {resumed_at} failed at step {onset}, {where}: the"
            f" checkpoint of step {resumed_at} may hold the cause; rolling back further"
        )
        log.warning("%s", text)
        notes.append(text)
        return resumed_at

    def _resumed_the_cause(self, incident: Incident) -> bool:
        """Whether the checkpoint the attempt resumed may hold the cause: it failed before it
        passed the onset it was rolled back from, or at that very onset with nothing logged
        before it (its first values were bad). One that logged healthy values and failed
        at the same step again failed on something of that step (its data): no further
        back."""
        onset = incident.onset_step
        if not self.count or self.rolled_back_from is None or onset is None:
            return False
        if self.relaunched_early:
            return False  # it did not resume ``resume``: what it did resume is set aside
        _, earlier = self.rolled_back_from
        resumed_at = self.resume.step
        if resumed_at is None or earlier is None or resumed_at > onset:
            return False
        return onset < earlier or (onset == earlier and self._first_logged)

    def _without_checkpoint(self, notes: list[str], why: str) -> Decision:
        """Nothing clean to resume from: start over only where the user chose to."""
        if self.job.restart_without_checkpoint == "scratch":
            notes.append(f"{why}: restarting from scratch (restart_without_checkpoint)")
            return Decision(resume=Resume(), notes=notes)
        return Decision(
            give_up=f"{why}: giving up rather than training again from step 0"
            ' ([job] restart_without_checkpoint = "give_up")',
            notes=notes,
        )


def _where_they_are(directory: Path) -> str:
    """When ``directory`` never existed or holds no checkpoint at all (none was set aside
    either): so, and where there are some (a typo in ``--checkpoints``); else nothing."""
    if not directory.exists():
        said = ": that folder never existed"
    elif not scan(directory):
        said = ": that folder holds no checkpoint at all"
    else:
        return ""
    found = elsewhere(directory)
    if found:
        said += f" (checkpoints are in {', '.join(map(str, found))}: --checkpoints names it?)"
    return said


def preflight(settings: Settings, command: list[str]) -> None:
    """Refuse, before anything starts, what would otherwise fail only after a kill.

    Raises ``ConfigError``: a resume command whose program cannot be found would be
    discovered at the first restart, after the job was stopped; a checkpoint dir
    sentinel cannot write would make the rollback fail at the same moment.
    """
    problems = []
    template = settings.job.resume_argv
    for what, argv in (("the job's command", command), ("job.resume_command", template)):
        if argv and "{" not in argv[0] and not _runnable(argv[0]):
            problems.append(f"{what}: {argv[0]} is not an executable on PATH")
    if settings.http is not None:
        try:
            parse_http_address(settings.http)
        except ValueError as error:
            problems.append(f"http: {error}")
    directory = settings.checkpoints
    if directory is not None and directory.exists() and not settings.dry_run:
        if not directory.is_dir():
            problems.append(f"checkpoints: {directory} is not a directory")
        elif not os.access(directory, os.W_OK | os.X_OK):
            problems.append(
                f"checkpoints: {directory} is not writable, so a rollback could not set"
                " checkpoints aside"
            )
    problem = _state_dir_problem(settings.state_dir)
    if problem:
        problems.append(f"state_dir: {settings.state_dir} {problem}")
    verdict_file = settings.verdict_file
    if verdict_file is not None and verdict_file.is_dir():
        # Found at the end, when the verdict was to be written: lost, the job long run.
        problems.append(f"verdict_file: {verdict_file} is a directory, not a file to write")
    if problems:
        raise ConfigError(problems)


def _state_dir_problem(state_dir: Path) -> str:
    """Why sentinel could not keep its state in ``state_dir`` ("" when it can)."""
    if state_dir.exists() and not state_dir.is_dir():
        return "is not a directory"
    existing = state_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "cannot be created" if existing != state_dir else "is not writable"
        return f"{what} (sentinel keeps its journal, outbox and verdict there)"
    return ""


def _runnable(program: str) -> bool:
    if os.sep in program:
        return os.path.isfile(program) and os.access(program, os.X_OK)
    return shutil.which(program) is not None
