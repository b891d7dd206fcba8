"""``JobMachine``: the job's life as one machine, moved only along ``LEGAL``, entered where an
unfinished stop plan says.

Real parts wherever they are cheap: the watch and its incidents, the state store, the
verdict and the stop plan in a real state dir, the restart budget and a real rollback of a
real checkpoint dir, real processes stopped by real signals. Only the holder is scripted
(which job each attempt finds), so that no test launches a training job.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from sentinel.config import JobConfig, Settings
from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Severity
from sentinel.notify.notices import NoticeKind
from sentinel.notify.notifier import Notifier
from sentinel.notify.outbox import Outbox
from sentinel.notify.settings import NotifyConfig
from sentinel.process.identity import ProcessIdentity
from sentinel.process.relayed import JobRecord
from sentinel.process.system import SystemSources
from sentinel.service.health import Service
from sentinel.service.watch import Watch
from sentinel.store import stop_intent, verdict
from sentinel.store.state import StateStore
from sentinel.store.stop_intent import MAX_TRIES, StopIntent
from sentinel.supervisor.aftermath import Aftermath
from sentinel.supervisor.attempts import JobAttempts
from sentinel.supervisor.events import Event, StopDone
from sentinel.supervisor.holders import Child
from sentinel.supervisor.job_state import JobState
from sentinel.supervisor.job_status import JobStatus
from sentinel.supervisor.machine import (
    FINAL,
    LEGAL,
    IllegalTransition,
    JobMachine,
    Phase,
    entry,
)
from sentinel.supervisor.restarts import Restarts
from sentinel.supervisor.shedding import Shedder
from sentinel.supervisor.stop_journal import StopJournal
from sentinel.supervisor.stops import JobStops

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "checkpoints" / "deepspeed"
DEADLINE_S = 20.0


@dataclass
class Job:
    """One attempt's job, as a holder hands it over (the ``Handle`` protocol)."""

    identity: ProcessIdentity | None
    started_at: float = field(default_factory=time.time)
    relay_failed: bool = False

    @property
    def pid(self) -> int:
        return 0 if self.identity is None else self.identity.pid

    def wait(self, timeout_s: float) -> bool:
        return True


class Holder:
    """A holder whose attempts are scripted: each ``begin`` takes the next job listed
    (None: the job is not there), or raises the ``OSError`` listed."""

    def __init__(
        self, *found: Job | OSError | None, relaunches: bool = True, follows: bool = True
    ) -> None:
        self.found = list(found)
        self.relaunches = relaunches
        #: False: a bare pid's target (``watch --pid``).
        self.follows_restarts = follows
        self.mode = "run" if relaunches else "watch"
        self.forgot = False

    def begin(self, attempt: int, restarts: Restarts, put: object) -> Job | None:
        found = self.found.pop(0) if self.found else None
        if isinstance(found, OSError):
            raise found
        return found

    def members(self) -> list[ProcessIdentity]:
        return []

    def last_attempt(self) -> int | None:
        return None

    def exit_status_of(self, attempt: int) -> int | None:
        return None

    def forget_orphan(self) -> None:
        self.forgot = True

    def found_started_at(self) -> float | None:
        return None

    def adopts(self, job: ProcessIdentity) -> bool:
        """As ``Child``: the next ``begin`` holds ``job`` only where it is the job listed."""
        first = self.found[0] if self.found else None
        return isinstance(first, Job) and first.identity == job

    def describe(self) -> str:
        return "the test job"


@dataclass
class Parts:
    machine: JobMachine
    watch: Watch
    service: Service
    events: list[Event]
    readies: list[str]


@pytest.fixture
def made() -> Iterator[list[Parts]]:
    parts: list[Parts] = []
    yield parts
    for part in parts:
        part.watch.notifier.stop(drain_s=0.5)
        part.watch.close()


def build(
    made: list[Parts],
    tmp_path: Path,
    holder: Holder,
    *,
    checkpoints: Path | None = None,
    notify: tuple[str, ...] = (),
    **job: object,
) -> Parts:
    """The machine and its parts as ``Supervisor.run`` wires them (``notify``: target URLs)."""
    settings = Settings(
        state_dir=tmp_path / "state",
        checkpoints=checkpoints,
        job=JobConfig(**job),
        notify=NotifyConfig(urls=list(notify)),
    )
    store = StateStore(settings.state_dir)
    notifier = Notifier(Outbox(store), tries=1, retry_initial_s=0.05, retry_max_s=0.2)
    watch = Watch(settings, store=store, notifier=notifier, job_name="test")
    service = Service(settings, job_name="test", mode=holder.mode)
    readies: list[str] = []
    service.ready = lambda: readies.append("ready")  # type: ignore[method-assign]
    journal = StopJournal(settings.state_dir)
    restarts = Restarts(
        settings.job, checkpoints, settings.keep, relaunches=holder.relaunches,
        state_dir=settings.state_dir, journal=journal,
    )  # fmt: skip
    events: list[Event] = []
    attempts = JobAttempts(
        settings, holder, restarts, watch=watch,
        status=JobStatus(service, watch, store, Shedder(through_pty=False)),
        system=SystemSources(settings.gpu, settings.process, lambda *_: None),
        service=service, store=store, put=events.append,
    )  # fmt: skip
    stops = JobStops(holder, watch=watch, service=service, put=events.append)
    after = Aftermath(
        restarts, None, watch=watch, service=service, relaunches=holder.relaunches, store=store
    )
    machine = JobMachine(
        settings, holder, attempts=attempts, stops=stops, after=after, restarts=restarts,
        journal=journal, watch=watch, service=service,
    )  # fmt: skip
    parts = Parts(machine, watch, service, events, readies)
    made.append(parts)
    return parts


def nan_at(step: int) -> Alert:
    return Alert(
        rule="nan_inf",
        severity=Severity.CRITICAL,
        message="loss is nan",
        time=time.time(),
        source="stdout",
        step=step,
    )


def incident_at(step: int) -> Incident:
    alert = nan_at(step)
    return Incident(
        id="i-1", rule="nan_inf", severity=Severity.CRITICAL, opened_at=alert.time,
        onset_step=step, onset_time=alert.time, alerts=[alert],
    )  # fmt: skip


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real process to be the job, in a session of its own (its group is signalled)."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    yield process
    if process.poll() is None:
        process.kill()
    process.wait()


def the_job(process: subprocess.Popen[bytes]) -> Job:
    identity = ProcessIdentity.of(process.pid)
    assert identity is not None
    return Job(identity)


def wait_for_stop(parts: Parts) -> StopDone:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        done = [event for event in parts.events if isinstance(event, StopDone)]
        if done:
            return done[0]
        assert time.monotonic() < deadline, f"the stop did not end within {DEADLINE_S} s"
        time.sleep(0.02)


def checkpoint_dir(tmp_path: Path, *steps: int) -> Path:
    """A DeepSpeed-style checkpoint dir: ``global_stepN`` folders, ``latest`` at the last."""
    ck = tmp_path / "ck"
    ck.mkdir()
    for step in steps:
        shutil.copytree(FIXTURE / "global_step40", ck / f"global_step{step}")
    (ck / "latest").write_text(f"global_step{steps[-1]}")
    return ck


# -- the table ----------------------------------------------------------------------------


def test_every_phase_has_its_moves_and_the_end_has_none() -> None:
    assert set(LEGAL) == set(Phase)
    for phase in FINAL:
        assert LEGAL[phase] == frozenset()
    for phase in set(Phase) - FINAL - {Phase.NEW, Phase.SETTLING}:
        assert {Phase.EXITED, Phase.DETACHED} <= LEGAL[phase], f"{phase}: a shutdown ends it"
    assert Phase.NEW not in set().union(*LEGAL.values()), "nothing goes back to the start"
    # What follows a stop passes through SETTLING, whatever it is.
    assert {phase for phase, moves in LEGAL.items() if Phase.BACKOFF in moves} == {
        Phase.NEW,
        Phase.SETTLING,
    }
    assert LEGAL[Phase.STOPPING] - {Phase.EXITED, Phase.DETACHED} == {Phase.SETTLING}


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        pytest.param([], Phase.RUNNING, id="new-to-running"),
        pytest.param([Phase.STARTING], Phase.BACKOFF, id="starting-to-backoff"),
        pytest.param([Phase.STARTING, Phase.RUNNING], Phase.STARTING, id="running-to-starting"),
        pytest.param([Phase.STARTING, Phase.FATAL], Phase.STARTING, id="fatal-is-final"),
        pytest.param([Phase.STARTING, Phase.STOPPING], Phase.BACKOFF, id="stop-not-settled"),
        pytest.param([Phase.SETTLING], Phase.STOPPING, id="settling-to-stopping"),
    ],
)
def test_a_move_the_table_does_not_list_is_refused(
    made: list[Parts], tmp_path: Path, path: list[Phase], refused: Phase
) -> None:
    machine = build(made, tmp_path, Holder()).machine
    for phase in path:
        machine._enter(phase)
    with pytest.raises(IllegalTransition, match=f"from {path[-1] if path else 'new'} to"):
        machine._enter(refused)
    assert machine.phase is (path[-1] if path else Phase.NEW)


# -- a fresh start ------------------------------------------------------------------------


def test_a_fresh_start_is_ready_then_starting_then_running_after_min_uptime(
    made: list[Parts], tmp_path: Path
) -> None:
    parts = build(made, tmp_path, Holder(Job(None, started_at=100.0)), min_uptime_s=5.0)
    machine = parts.machine
    machine.begin(None)
    assert parts.readies == ["ready"]
    assert (machine.phase, machine.state, machine.attempts.attempt) == (
        Phase.STARTING,
        JobState.STARTING,
        1,
    )
    machine.tick(104.0)
    assert machine.phase is Phase.STARTING
    machine.tick(105.0)
    assert (machine.phase, machine.state) == (Phase.RUNNING, JobState.RUNNING)


def test_a_job_that_cannot_be_started_is_fatal_127(made: list[Parts], tmp_path: Path) -> None:
    parts = build(made, tmp_path, Holder(OSError("no such file")))
    parts.machine.begin(None)
    assert (parts.machine.phase, parts.machine.finished, parts.machine.exit_code) == (
        Phase.FATAL,
        True,
        127,
    )


def test_watch_waits_for_the_job_then_finds_it_and_detaches_on_sigterm(
    made: list[Parts], tmp_path: Path
) -> None:
    parts = build(made, tmp_path, Holder(None, None, Job(None), relaunches=False))
    machine = parts.machine
    machine.begin(None)
    assert machine.phase is Phase.WAITING
    machine.look_for_job()
    assert machine.phase is Phase.WAITING
    machine.look_for_job()
    assert machine.phase is Phase.STARTING
    machine.shutdown(signal.SIGTERM)
    assert (machine.phase, machine.state, machine.exit_code) == (
        Phase.DETACHED,
        JobState.STARTING,  # the job runs on as it was
        0,
    )
    machine.look_for_job()
    machine.restart_due()
    assert machine.phase is Phase.DETACHED, "nothing moves a machine that has ended"


def test_watch_of_a_bare_pid_ends_with_its_job_and_never_waits_for_one_it_never_found(
    made: list[Parts], tmp_path: Path
) -> None:
    """A bare pid cannot come back: its end is the watch's (0), and one not there at the
    first look never will be (1)."""
    parts = build(made, tmp_path, Holder(Job(None), relaunches=False, follows=False))
    machine = parts.machine
    machine.begin(None)
    assert machine.phase is Phase.STARTING
    machine.job_exited(1, 0)
    assert (machine.phase, machine.exit_code, machine.finished) == (Phase.EXITED, 0, True)
    never = build(made, tmp_path / "never", Holder(None, relaunches=False, follows=False))
    never.machine.begin(None)
    assert (never.machine.phase, never.machine.exit_code) == (Phase.FATAL, 1)


# -- a stop -------------------------------------------------------------------------------


def test_a_critical_stops_the_job_writing_the_plan_first_then_settles_and_backs_off(
    made: list[Parts], tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    parts = build(
        made, tmp_path, Holder(the_job(sleeper), Job(None)), grace_period_s=5.0,
        restart_without_checkpoint="scratch", restart_backoff_s=7.0,
    )  # fmt: skip
    machine = parts.machine
    machine.begin(None)
    machine.alerts([nan_at(30)])
    assert (machine.phase, machine.state) == (Phase.STOPPING, JobState.STOPPING)
    record = verdict.read(tmp_path / "state")
    assert record is not None and record.state == verdict.DECIDING
    assert record.stop is not None and record.stop["phase"] == stop_intent.STOPPING
    assert record.stop["job"][0] == sleeper.pid
    machine.alerts([nan_at(31)])
    assert machine.phase is Phase.STOPPING, "one stop at a time"

    done = wait_for_stop(parts)
    assert done.result.signalled
    assert sleeper.wait(DEADLINE_S) == -15
    machine.job_exited(1, -15)
    assert (machine.phase, machine.state) == (Phase.BACKOFF, JobState.BACKOFF)
    assert machine.restart_at is not None
    assert 6.0 < machine.restart_at - time.monotonic() <= 7.0
    final = verdict.read(tmp_path / "state")
    assert final is not None and final.code == verdict.EXIT_ROLLED_BACK
    assert final.stop is not None and final.stop["phase"] == stop_intent.RESTARTING

    machine.restart_due()
    assert (machine.phase, machine.attempts.attempt, machine.restarts.count) == (
        Phase.STARTING,
        2,
        1,
    )


def test_a_dry_run_stops_nothing_and_writes_no_plan(made: list[Parts], tmp_path: Path) -> None:
    parts = build(made, tmp_path, Holder(Job(None)))
    machine = parts.machine
    machine.settings = machine.settings.model_copy(update={"dry_run": True})
    machine.begin(None)
    machine.alerts([nan_at(30)])
    assert (machine.phase, machine.stop) == (Phase.STARTING, None)
    assert verdict.read(tmp_path / "state") is None
    [incident] = parts.watch.incidents()
    assert any(text.startswith("dry run: would send SIGTERM") for _, text in incident.actions)


def test_a_stop_that_gives_up_escalates_and_exits_90(
    made: list[Parts], tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    parts = build(made, tmp_path, Holder(the_job(sleeper)), grace_period_s=5.0)
    machine = parts.machine
    machine.begin(None)
    machine.alerts([nan_at(30)])
    wait_for_stop(parts)
    sleeper.wait(DEADLINE_S)
    machine.job_exited(1, -15)
    assert (machine.phase, machine.finished, machine.exit_code) == (Phase.FATAL, True, 90)
    final = verdict.read(tmp_path / "state")
    assert final is not None and final.code == verdict.EXIT_GIVE_UP
    [incident] = parts.watch.incidents()
    assert any("no checkpoint dir is configured" in text for _, text in incident.actions)


def test_a_second_sigterm_kills_the_job_and_ends_143(
    made: list[Parts], tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    parts = build(made, tmp_path, Holder(the_job(sleeper)), grace_period_s=30.0)
    machine = parts.machine
    machine.begin(None)
    machine.shutdown(signal.SIGTERM)
    assert machine.phase is Phase.STOPPING
    machine.shutdown(signal.SIGTERM)
    assert (machine.phase, machine.exit_code) == (Phase.EXITED, 143)
    assert sleeper.wait(DEADLINE_S) in (-15, -9)


# -- taking up a plan a dead sentinel left --------------------------------------------------


def left_plan(
    tmp_path: Path,
    *,
    job: tuple[int, float] | None = None,
    restart: bool = True,
    tries: int = 0,
    signalled_s_ago: float = 1.0,
) -> StopIntent:
    """The "stopping" record a sentinel wrote before its signal and died with."""
    intent = StopIntent.begin(
        incident_at(30), restart=restart, attempt=1, job=job, signal="SIGTERM", grace_s=5.0,
        restarts={},
    )  # fmt: skip
    intent = replace(intent, signalled_at=time.time() - signalled_s_ago, tries=tries)
    (tmp_path / "state").mkdir(parents=True, exist_ok=True)
    stop_intent.write(tmp_path / "state", intent)
    return intent


def test_a_plan_left_unfinished_is_entered_where_it_says(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    job = the_job(sleeper).identity
    assert job is not None
    running = left_plan(tmp_path, job=(job.pid, job.create_time))
    assert entry(running) is Phase.STOPPING
    gone = replace(running, job=(job.pid, job.create_time - 10.0))  # the pid, reused
    assert entry(gone) is Phase.SETTLING
    assert entry(replace(running, job=None)) is Phase.SETTLING
    planned = running.planned("label", "/ck/global_step25", 25)
    assert entry(planned) is Phase.STOPPING, "planned, but its job still runs: stop it first"
    assert entry(replace(planned, job=None)) is Phase.SETTLING
    assert entry(replace(planned, phase=stop_intent.RESTARTING)) is Phase.BACKOFF
    assert entry(replace(running, tries=MAX_TRIES)) is Phase.SETTLING, "to give up"


def test_taking_up_a_stop_whose_job_still_runs_enters_stopping_with_the_rest_of_the_grace(
    made: list[Parts], tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    job = the_job(sleeper)
    assert job.identity is not None
    # Its SIGTERM went out 4.5 s of a 5 s grace ago (and was lost: it sleeps on).
    intent = left_plan(
        tmp_path, job=(job.identity.pid, job.identity.create_time), signalled_s_ago=4.5
    )
    parts = build(made, tmp_path, Holder(job), restart_without_checkpoint="scratch")
    machine = parts.machine
    machine.begin(intent)
    assert (machine.phase, machine.state) == (Phase.STOPPING, JobState.STOPPING)
    assert parts.readies == [], "not ready while the stop it took up is under way"
    record = verdict.read(tmp_path / "state")
    assert record is not None and record.stop is not None and record.stop["tries"] == 1

    done = wait_for_stop(parts)
    assert done.result.killed, "what still runs after the rest of the grace is killed"
    assert sleeper.wait(DEADLINE_S) == -9, "no second SIGTERM: the dead sentinel sent it"
    # Said as such, not "SIGTERM sent to pid none".
    assert done.result.detail.startswith("SIGTERM sent before (the stop taken up); "), done
    machine.job_exited(1, -9)
    assert machine.phase is Phase.BACKOFF
    assert parts.readies == ["ready"]


def test_taking_up_a_stop_whose_job_runs_unrecorded_stops_it_and_starts_no_copy_beside_it(
    made: list[Parts], tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    """``run`` with no record to adopt the stopped job by would start the command again
    beside it: instead the job is stopped by its identity, and only the restart starts."""
    stopped = the_job(sleeper).identity
    assert stopped is not None
    intent = left_plan(tmp_path, job=(stopped.pid, stopped.create_time), signalled_s_ago=4.7)
    fresh = Job(ProcessIdentity(os.getpid(), stopped.create_time - 100.0))  # what begin gives
    holder = Holder(fresh)
    parts = build(made, tmp_path, holder, restart_without_checkpoint="scratch")
    machine = parts.machine
    machine.begin(intent)
    assert sleeper.wait(DEADLINE_S) == -signal.SIGKILL, "the rest of its grace, then SIGKILL"
    assert holder.found == [fresh], "nothing started beside the stopped job"
    assert machine.phase is Phase.BACKOFF and parts.readies == ["ready"]
    machine.restart_due()
    assert holder.found == [] and machine.phase is Phase.STARTING, "the restart, after"


def test_taking_up_a_stop_whose_job_is_gone_settles_the_plan_and_resumes_from_its_checkpoint(
    made: list[Parts], tmp_path: Path
) -> None:
    ck = checkpoint_dir(tmp_path, 20, 25, 30, 35)
    planned = str((ck / "global_step25").resolve())
    intent = left_plan(tmp_path).planned("20260101T000000-nan_inf", planned, 25)
    stop_intent.write(tmp_path / "state", intent)
    parts = build(made, tmp_path, Holder(), checkpoints=ck)
    machine = parts.machine
    machine.begin(intent)
    assert (machine.phase, machine.state) == (Phase.BACKOFF, JobState.BACKOFF)
    assert parts.readies == ["ready"]
    assert machine.restarts.resume.checkpoint == planned
    assert (ck / "latest").read_text().strip() == "global_step25"
    moved = sorted(p.name for p in (ck / "quarantine" / "20260101T000000-nan_inf").iterdir())
    assert moved == [".sentinel-manifest.json", "global_step30", "global_step35"]
    final = verdict.read(tmp_path / "state")
    assert final is not None and final.code == verdict.EXIT_ROLLED_BACK
    assert final.resume_from == planned


def test_taking_up_a_plan_with_only_the_restart_left_enters_backoff_due_at_once(
    made: list[Parts], tmp_path: Path
) -> None:
    intent = left_plan(tmp_path)
    closing = StopJournal(tmp_path / "state")
    closing.intent = intent
    restarting = StopIntent.from_json(closing.closing({"restarts.count": "1"}))
    assert restarting is not None
    parts = build(made, tmp_path, Holder())
    machine = parts.machine
    machine.begin(restarting)
    assert machine.phase is Phase.BACKOFF
    assert machine.restart_at is not None and machine.restart_at <= time.monotonic()
    assert (machine.attempts.attempt, machine.restarts.count) == (1, 1)
    assert machine.holder.forgot  # type: ignore[attr-defined]
    assert parts.readies == ["ready"]


def test_taking_up_a_stop_no_restart_follows_ends_fatal_with_the_plan_ended(
    made: list[Parts], tmp_path: Path
) -> None:
    parts = build(made, tmp_path, Holder())
    parts.machine.begin(left_plan(tmp_path, restart=False))
    assert (parts.machine.phase, parts.machine.exit_code) == (Phase.FATAL, 143)
    record = verdict.read(tmp_path / "state")
    assert record is not None and record.stop is None, "no stop left for a next sentinel"


def test_what_a_taken_up_stop_did_is_told_to_every_target_told_of_it_or_not(
    made: list[Parts], tmp_path: Path
) -> None:
    """A sentinel queues an incident's notices after the stop's signal (which cannot wait
    for them) and may die in between: the one that takes the stop up tells every target
    what was done, though no target is known to have been told of the incident."""
    hook = "json://127.0.0.1:1/hook"
    parts = build(made, tmp_path, Holder(), notify=(hook,))
    parts.machine.begin(left_plan(tmp_path, restart=False))
    assert parts.machine.phase is Phase.FATAL
    notices = [n for m in parts.watch.notifier.outbox.messages(hook) for n in m.envelope.notices]
    assert [(n.kind, n.incident_id) for n in notices] == [(NoticeKind.ACTIONS, "i-1")]


def test_taking_up_a_plan_three_sentinels_could_not_finish_gives_up_with_90(
    made: list[Parts], tmp_path: Path
) -> None:
    parts = build(made, tmp_path, Holder())
    parts.machine.begin(left_plan(tmp_path, tries=MAX_TRIES))
    assert (parts.machine.phase, parts.machine.exit_code) == (Phase.FATAL, 90)
    assert parts.readies == ["ready"]
    final = json.loads((tmp_path / "state" / "verdict.json").read_text())
    assert final["code"] == verdict.EXIT_GIVE_UP


def test_run_adopts_only_the_job_it_has_a_record_of(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    job = the_job(sleeper).identity
    assert job is not None
    settings = Settings(state_dir=tmp_path / "state")
    child = Child(["job"], settings, stdout=io.BytesIO(), stderr=io.BytesIO())
    assert not child.adopts(job), "no record: begin would start the command"
    (tmp_path / "state" / "job").mkdir(parents=True)
    JobRecord(1, tmp_path, job, job, ["job"], time.time()).save(settings.state_dir)
    assert child.adopts(job)
    assert not child.adopts(ProcessIdentity(job.pid, job.create_time - 100.0)), "pid reused"


def test_an_attempt_relaunched_before_the_rollback_is_rolled_back_again_not_given_up(
    tmp_path: Path,
) -> None:
    """A dead sentinel's stop, taken up after the wrapper gave up waiting and relaunched the
    job: that attempt resumed from what the dir held then (the poisoned save), so its NaN
    at the same step is no recurrence. It was taken for one, and the rollback went further
    back than the clean save, setting it aside (an out-of-sample run). It rolls back to the
    clean one again; an attempt that did resume it and failed there again still gives up."""
    ck = checkpoint_dir(tmp_path, 20, 40)
    restarts = Restarts(JobConfig(), ck, relaunches=False)
    first = restarts.decide(incident_at(30))
    assert first.resume is not None and first.resume.checkpoint.endswith("global_step20")
    rolled_at = restarts.rolled_back_at
    assert rolled_at is not None
    restarts.attempt_began(rolled_at - 0.01, found_anew=True)
    assert not restarts.relaunched_early, "the clock's tick is no lead"
    restarts.attempt_began(rolled_at - 30.0, found_anew=False)
    assert not restarts.relaunched_early, "run launched it: it resumed what the rollback chose"
    restarts.attempt_began(rolled_at - 30.0, found_anew=True)
    assert restarts.relaunched_early
    assert restarts.resumed(2) is None, "the rules are not told of a resume that did not happen"
    again = restarts.decide(incident_at(30))
    assert again.give_up is None and again.resume is not None, again
    assert again.resume.checkpoint.endswith("global_step20")
    last = restarts.decide(incident_at(30))
    assert last.give_up is not None and "recurred at the same step (30)" in last.give_up
